"""A reader that goes away (``ranksight diagnose RUN --json | head -1``) ends the command quietly."""

from __future__ import annotations

import subprocess
import sys

import ranksight


def test_a_closed_pipe_ends_the_command_without_a_traceback(tmp_path):
    mon = ranksight.init(run_dir=str(tmp_path), job="t", run_id="pipe", flush_interval_s=0.1)
    for _ in mon.loader(range(30)):
        with mon.step():
            pass
    mon.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ranksight", "diagnose", str(tmp_path / "pipe"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    proc.stdout.close()  # the reader is gone before the report is written (`| head -c 0`, a closed pager)
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code in (0, 141)
