"""``ranksight digest RUN``: a spool an older agent published -- digests of another definition, or none -- gets
this version's digests, and is then read as a spool this version published is
(``ranksight.collectors._spool_digests``)."""

from __future__ import annotations

import os
import subprocess
import sys

from ranksight.collectors import open_run
from ranksight.format.digest import DIGEST_DIR, digest_keys
from ranksight.rules import diagnose

from .test_digests import _published_run, _step_files


def _digest(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight.cli", "digest", *args], capture_output=True, text=True)


def _current(run: str) -> str:
    steps = os.path.join(run, "steps")
    (key,) = digest_keys(steps)
    return os.path.join(steps, DIGEST_DIR, key)


def _from_rows(run: str) -> dict:
    """The verdict of a reader with every digest set aside (the rows read)."""
    digests = os.path.join(run, "steps", DIGEST_DIR)
    os.rename(digests, digests + "-aside")
    try:
        return diagnose(run)
    finally:
        os.rename(digests + "-aside", digests)


def _read_from(run: str) -> tuple[str, ...]:
    with open_run(run, follow_spool=False) as reading:
        return reading.summary().read_from


def test_a_spool_of_another_digest_definition_gets_this_versions_digests_and_reads_as_one(tmp_path):
    run = _published_run(tmp_path, publishes=4)
    current = _current(run)
    older = os.path.join(os.path.dirname(current), "c2-an-older-definition")
    os.rename(current, older)  # as an older agent's digests: a key this version never reads
    kept = {n: open(os.path.join(older, n), "rb").read() for n in os.listdir(older)}
    rows = _from_rows(run)
    assert _read_from(run) == ("rows",)
    done = _digest([run])
    assert done.returncode == 0, done.stderr
    assert "wrote 4 digests, 0 step files had one" in done.stdout
    assert sorted(os.listdir(current)) == _step_files(run)
    assert {n: open(os.path.join(older, n), "rb").read() for n in os.listdir(older)} == kept  # left as it was
    assert _read_from(run) == ("digests",)
    verdict = diagnose(run)
    assert [(f["rule"], f["ranks"]) for f in verdict["findings"]] == [(f["rule"], f["ranks"]) for f in rows["findings"]]
    again = _digest([run])
    assert "wrote 0 digests, 4 step files had one" in again.stdout


def test_a_damaged_digest_is_made_again_and_a_step_file_that_does_not_read_is_left_out(tmp_path):
    run = _published_run(tmp_path, publishes=3)
    current = _current(run)
    names = _step_files(run)
    with open(os.path.join(current, names[0]), "wb") as f:
        f.write(b"RSDIGEST\xff\xff")  # cut short in its header
    with open(os.path.join(run, "steps", "nodeZ_m0-broken.parquet"), "wb") as f:
        f.write(b"not parquet at all")
    before = _from_rows(run)
    done = _digest([run])
    assert done.returncode == 0, done.stderr
    assert "wrote 1 digests, 2 step files had one" in done.stdout
    assert "left out (does not read):" in done.stdout and "nodeZ_m0-broken.parquet" in done.stdout
    assert _read_from(run) == ("digests",)
    assert diagnose(run)["findings"] == before["findings"]


def test_a_path_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    done = _digest([str(tmp_path / "nowhere")])
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nowhere" in done.stderr
