"""``ranksight dashboard [RUN_DIR_OR_ROOT]``: serve the Streamlit dashboard (loopback by default)."""

from __future__ import annotations

import os
import subprocess
import sys

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "dashboard",
        help="open the live dashboard on a run or a folder of runs",
        description="Serve the ranksight dashboard (Streamlit) on a run folder or a folder of runs.",
    )
    p.add_argument(
        "path", nargs="?", default="ranksight-runs", help="a run, or a folder of runs (default ranksight-runs)"
    )
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--prometheus", default="", metavar="URL", help="also read a Prometheus server (multi-node jobs)")
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between live refreshes (default 2)")
    return p


def start(
    path: str,
    port: int = 8501,
    host: str = "127.0.0.1",
    prometheus: str = "",
    refresh_s: float = 2.0,
    quiet: bool = False,
) -> subprocess.Popen:
    """Start the dashboard server in the background and return its process."""
    from ranksight.dashboard import serve_command, serve_env

    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise UserError(
            "the dashboard needs streamlit: pip install ranksight (or pip install streamlit altair)"
        ) from None
    if not 1 <= port <= 65535:
        raise UserError(f"--port must be in 1..65535, got {port}")
    _check_port(host, port)
    out = subprocess.DEVNULL if quiet else None  # Streamlit's banner; its errors still reach stderr
    return subprocess.Popen(serve_command(port, host), env=serve_env(path, prometheus, refresh_s), stdout=out)


def _check_port(host: str, port: int) -> None:
    """Fail with one line (not Streamlit's traceback) when the port is taken."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc} (pick another --port)") from None


def wait_ready(proc: subprocess.Popen, host: str, port: int, timeout_s: float = 60.0) -> None:
    """Block until the server answers its health check, so the printed URL works when it is printed."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url(host, port)}_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise UserError(f"the dashboard server exited (code {proc.returncode}); see the messages above")
        if time.monotonic() > deadline:
            raise UserError(f"the dashboard did not answer on {url(host, port)} within {timeout_s:.0f} s")
        time.sleep(0.25)


def url(host: str, port: int) -> str:
    """The address to open in a browser."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"


def serve_until_interrupted(run_path: str) -> int:
    """After ``ranksight demo``: serve the dashboard on the run (port 8501 or a free one) until Ctrl-C.

    Only from a terminal: a script or CI job that runs the demo must not be left waiting on a server.
    """
    import socket

    if not sys.stdin.isatty():
        print("dashboard: not started (not a terminal); serve it with: ranksight dashboard " + run_path)
        return 0
    port = 8501
    try:
        _check_port("127.0.0.1", port)
    except UserError:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    banner = (
        f"\ndashboard: {url('127.0.0.1', port)}?run={os.path.basename(os.path.normpath(run_path))}   (Ctrl-C stops it)"
    )
    return serve(run_path, banner, port)


def serve(
    path: str, banner: str, port: int = 8501, host: str = "127.0.0.1", prometheus: str = "", refresh_s: float = 2.0
) -> int:
    """Start the server, print ``banner`` once it answers, and serve until it exits or Ctrl-C (then 0)."""
    proc = start(path, port, host, prometheus, refresh_s, quiet=True)
    try:
        wait_ready(proc, host, port)
    except UserError:
        proc.terminate()
        raise
    print(banner, flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
        return 0


def run(args) -> int:
    if os.path.exists(args.path) and not os.path.isdir(args.path):
        raise UserError(f"{args.path}: not a directory")
    if not os.path.isdir(args.path):
        print(f"{args.path} does not exist yet: the dashboard will show runs once a job writes there", file=sys.stderr)
    banner = f"ranksight dashboard: {url(args.host, args.port)}  (reading {os.path.abspath(args.path)}; Ctrl-C stops)"
    return serve(args.path, banner, args.port, args.host, args.prometheus, args.refresh)
