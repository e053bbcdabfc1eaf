"""Serving the dashboard from scripts: `ranksight demo` and `ranksight dashboard` without a terminal.

Each test runs the real CLI in a subprocess with no TTY (as CI, a script or an agent would), reads the
URL it prints, fetches the page over HTTP on 127.0.0.1, then stops it with a signal (or lets
``--serve-for`` run out) and checks that the port is free again and no process it started survives.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.test_dashboard import write_run

pytestmark = pytest.mark.slow

RANKSIGHT = [sys.executable, "-m", "ranksight"]
URL = re.compile(r"(http://127\.0\.0\.1:(\d+)/\S*)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Served:
    """A CLI process whose stdout is collected on a thread, so a test can wait for a line without blocking."""

    def __init__(self, args: list[str], cwd: str) -> None:
        self.proc = subprocess.Popen(
            RANKSIGHT + args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,  # no terminal: what CI and scripts give
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for_url(self, timeout_s: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                m = URL.search(line)
                if m and "dashboard" in line:
                    return m.group(1), int(m.group(2))
            assert self.proc.poll() is None, self.transcript()
            time.sleep(0.2)
        raise AssertionError(f"no dashboard URL within {timeout_s} s:\n{self.transcript()}")

    def finish(self, timeout_s: float = 60) -> int:
        code = self.proc.wait(timeout=timeout_s)
        for t in self._threads:
            t.join(10)
        return code

    def transcript(self) -> str:
        return "\n".join(self.lines[-40:]) + "\n--- stderr ---\n" + "\n".join(self.err[-40:])


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from /proc (children of children too)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}/task") else []:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = {int(k) for k in f.read().split()}
            except OSError:
                continue
            todo.extend(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _wait_gone(pids: set[int], port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (any(_alive(p) for p in pids) or not _port_free(port)):
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "a process the command started outlived it"
    assert _port_free(port), f"port {port} still answers after the command stopped"


def _fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode(errors="replace")


def test_demo_without_a_terminal_serves_the_dashboard_until_sigterm(tmp_path):
    """The README's set-up command, run from a script: it ends with the URL, serves it, and SIGTERM stops it all."""
    port = _free_port()
    served = _Served(
        ["demo", "--steps", "12", "--run-dir", "runs", "--port", str(port), "--serve-for", "600"], str(tmp_path)
    )
    try:
        url, got_port = served.wait_for_url(300)
        assert got_port == port and "?run=demo-none-" in url
        status, html = _fetch(url)
        assert status == 200 and "<title>" in html.lower()
        assert _fetch(f"http://127.0.0.1:{port}/_stcore/health") == (200, "ok")
        children = _descendants(served.proc.pid)
        assert children, "the dashboard server runs as a child process"
        served.proc.send_signal(signal.SIGTERM)
        assert served.finish() == 0, served.transcript()
        _wait_gone(children, port)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
    out = "\n".join(served.lines)
    # The URL is the last thing printed; the server's own log lines went to a file, not here.
    assert URL.search([line for line in served.lines if line.strip()][-1]), out
    assert "Uvicorn" not in out and "You can now view" not in out and "Streamlit" not in out, out
    assert "dashboard: not started" not in out
    run_dir = os.path.join(tmp_path, "runs", url.split("?run=")[1])
    assert os.path.isfile(os.path.join(run_dir, "dashboard.log"))
    # Counts agree with the header: 12 steps asked, 5 of them warm-up.
    assert "ranksight demo: 2 ranks, 12 steps" in out and "(7 steps after 5 warm-up)" in out
    assert "GPU items hidden: CPU job" in out  # the checklist keeps only rows that can apply


def test_dashboard_stops_its_server_on_sighup(tmp_path):
    runs = tmp_path / "runs"
    write_run(str(runs / "r1"), 2, 10)
    port = _free_port()
    served = _Served(["dashboard", "runs", "--port", str(port)], str(tmp_path))
    try:
        url, _ = served.wait_for_url(120)
        assert _fetch(url)[0] == 200
        children = _descendants(served.proc.pid)
        assert children
        served.proc.send_signal(signal.SIGHUP)  # the terminal closed
        assert served.finish() == 0, served.transcript()
        _wait_gone(children, port)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
    assert "ranksight: opening the latest run under runs: r1" in served.err
    assert not [line for line in served.lines if "Uvicorn" in line or "Streamlit" in line]


def test_serve_for_ends_the_dashboard_by_itself(tmp_path):
    run = write_run(str(tmp_path / "runs" / "r1"), 1, 6)
    port = _free_port()
    served = _Served(["dashboard", run, "--port", str(port), "--serve-for", "3"], str(tmp_path))
    try:
        served.wait_for_url(120)
        children = _descendants(served.proc.pid)
        assert served.finish(timeout_s=120) == 0, served.transcript()
        _wait_gone(children, port)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
    assert any("stops in" in line or "Ctrl-C" in line for line in served.lines)


def test_a_killed_cli_takes_its_server_down(tmp_path):
    """Even SIGKILL, which ranksight cannot catch: the server asked Linux to end it with its parent."""
    run = write_run(str(tmp_path / "runs" / "r1"), 1, 6)
    port = _free_port()
    served = _Served(["dashboard", run, "--port", str(port)], str(tmp_path))
    try:
        served.wait_for_url(120)
        children = _descendants(served.proc.pid)
        served.proc.kill()
        served.finish()
        _wait_gone(children, port)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()


def test_a_server_that_fails_names_its_log(tmp_path):
    """A server that exits at start (here a half-set TLS option in the user's .streamlit/config.toml) is one
    line on stderr that names the log holding Streamlit's own message; nothing of Streamlit's on stdout."""
    run = write_run(str(tmp_path / "runs" / "r1"), 1, 6)
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "config.toml").write_text('[server]\nsslCertFile = "/nonexistent/cert.pem"\n')
    out = subprocess.run(
        RANKSIGHT + ["dashboard", run, "--port", str(_free_port())],
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "its log: " in out.stderr, out.stderr
    log = out.stderr.strip().split("its log: ")[1]
    assert log == os.path.join(run, "dashboard.log")
    with open(log) as f:
        assert "sslKeyFile" in f.read()
    assert out.stdout == ""


def test_demo_on_a_taken_port_says_so_in_one_line_and_keeps_its_run(tmp_path):
    """The demo on a taken port behaves as ``ranksight dashboard`` does: one line naming the port, exit 2,
    never a silent other port; the job's run and its printed diagnosis stay."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = ["--port", str(port), "--serve-for", "5"]
        demo = subprocess.run(
            RANKSIGHT + ["demo", "--steps", "8", "--run-dir", "runs", "--run-id", "taken", *args],
            cwd=str(tmp_path),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        dash = subprocess.run(
            RANKSIGHT + ["dashboard", "runs/taken", *args],
            cwd=str(tmp_path),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert demo.returncode == 2 and dash.returncode == 2, (demo.stderr, dash.stderr)
    lines = demo.stderr.strip().splitlines()
    said = f"cannot serve on 127.0.0.1:{port}"
    assert len(lines) == 1 and said in lines[0] and "the run is kept: ranksight dashboard runs/taken" in lines[0]
    assert said in dash.stderr
    assert "Verdict:" in demo.stdout and not URL.search(demo.stdout), demo.stdout
    assert os.listdir(tmp_path / "runs" / "taken" / "steps")
