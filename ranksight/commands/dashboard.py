"""``ranksight dashboard [RUN | RUN_ID | FOLDER_OF_RUNS]``: serve the Streamlit dashboard (loopback by default).

The server runs as a child in its own process group, with its output in a log file: the terminal shows
only ranksight's lines, and stopping ranksight (Ctrl-C, SIGTERM, SIGHUP, ``--serve-for``) stops the
whole group, so no server is left holding the port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from ._errors import UserError
from ._paths import is_run, latest_run, resolve_root, resolve_run

LOG_NAME = "dashboard.log"
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def add_parser(sub):
    p = sub.add_parser(
        "dashboard",
        help="open the live dashboard on a run or a folder of runs",
        description="Serve the ranksight dashboard (Streamlit) on a run folder, a run id or a folder of runs.",
    )
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        help="a run, a run id under ./ranksight-runs, or a folder of runs "
        "(default: $RANKSIGHT_RUN_DIR, else ranksight-runs)",
    )
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--prometheus", default="", metavar="URL", help="also read a Prometheus server (multi-node jobs)")
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between live refreshes (default 2)")
    add_serve_for(p)
    return p


def add_serve_for(p) -> None:
    """``--serve-for SECONDS``: scripts and tests bound the server's life (the demo has it too)."""
    p.add_argument(
        "--serve-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the dashboard after this many seconds (default: serve until Ctrl-C or SIGTERM)",
    )


def start(
    path: str,
    port: int = 8501,
    host: str = "127.0.0.1",
    prometheus: str = "",
    refresh_s: float = 2.0,
    quiet: bool = False,
    log_path: str | None = None,
) -> subprocess.Popen:
    """Start the dashboard server in its own process group and return it; its output goes to ``log_path``
    (else nowhere when ``quiet``, else this terminal). Stop it with :func:`stop`."""
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
    log = open(log_path, "ab") if log_path else None  # the child keeps its own copy; ours is closed below
    if log:
        log.write(f"\n--- ranksight dashboard on {host}:{port}, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
        log.flush()
    out = log if log else (subprocess.DEVNULL if quiet else None)
    try:
        return subprocess.Popen(
            serve_command(port, host),
            env=serve_env(path, prometheus, refresh_s),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if log else None,
            start_new_session=True,  # its own group: a terminal's Ctrl-C reaches ranksight, which stops it
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    finally:
        if log:
            log.close()


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM if ranksight itself is killed (even with SIGKILL)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop the server and everything it started (its process group): SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _check_port(host: str, port: int) -> None:
    """Fail with one line (not Streamlit's traceback) when the port is taken."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc} (pick another --port)") from None


def wait_ready(proc: subprocess.Popen, host: str, port: int, timeout_s: float = 60.0, log_path: str = "") -> None:
    """Block until the server answers its health check, so the printed URL works when it is printed."""
    import urllib.request

    see = f"; its log: {log_path}" if log_path else ""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url(host, port)}_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise UserError(f"the dashboard server exited (code {proc.returncode}){see}")
        if time.monotonic() > deadline:
            raise UserError(f"the dashboard did not answer on {url(host, port)} within {timeout_s:.0f} s{see}")
        time.sleep(0.25)


def url(host: str, port: int) -> str:
    """The address to open in a browser."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"


def log_path_for(path: str) -> str:
    """Where the server's own output goes: ``dashboard.log`` in the run (or folder of runs) served, or in
    the temporary folder when that one is read-only (a mounted run root)."""
    if os.path.isdir(path) and os.access(path, os.W_OK):
        return os.path.join(path, LOG_NAME)
    return os.path.join(tempfile.gettempdir(), f"ranksight-{LOG_NAME}")


class _Stopped(Exception):
    """A stop signal arrived (SIGTERM, SIGHUP): leave the serving loop and stop the server."""


def _raise_stopped(signum, frame):
    raise _Stopped(signum)


def serve(
    path: str,
    banner: str,
    port: int = 8501,
    host: str = "127.0.0.1",
    prometheus: str = "",
    refresh_s: float = 2.0,
    serve_for_s: float | None = None,
    open_browser: bool = False,
    query: str = "",
) -> int:
    """Start the server, print ``banner`` (``{url}`` filled in) once it answers, and serve until Ctrl-C,
    SIGTERM, SIGHUP or ``serve_for_s``; then stop its process group and return 0 (the server's own exit
    code if it ends by itself)."""
    log_path = log_path_for(path)
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    proc = None
    try:
        proc = start(path, port, host, prometheus, refresh_s, log_path=log_path)
        wait_ready(proc, host, port, log_path=log_path)
        address = url(host, port) + query
        print(banner.format(url=address), flush=True)
        if open_browser:
            _open_browser(address)
        try:
            code = proc.wait(timeout=serve_for_s)
        except subprocess.TimeoutExpired:
            return 0
        if code:
            print(f"the dashboard server exited (code {code}); its log: {log_path}", file=sys.stderr)
        return code
    except (KeyboardInterrupt, _Stopped):
        return 0
    finally:
        if proc is not None:
            stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _open_browser(address: str) -> None:
    """Open a browser on a person's desktop only: a terminal, and on Linux a display to show it on."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return
    import webbrowser

    try:
        webbrowser.open(address)
    except Exception:  # a browser is a courtesy; the URL is printed either way
        pass


def serve_run(run_path: str, port: int = 8501, serve_for_s: float | None = None) -> int:
    """After ``ranksight demo``: serve the dashboard on the run and print its URL as the last line. A taken
    ``port`` is one line and exit 2, as for ``ranksight dashboard`` (never a silent other port, which a
    bookmark or a tunnel to 8501 would miss); the run stays on disk. A terminal only decides whether a
    browser opens too."""
    try:
        _check_port("127.0.0.1", port)
    except UserError as exc:
        raise UserError(f"{exc}; the run is kept: ranksight dashboard {run_path} --port {port + 1}") from None
    run_id = os.path.basename(os.path.normpath(run_path))
    stops = "Ctrl-C stops it" if serve_for_s is None else f"stops in {serve_for_s:g} s, or on Ctrl-C"
    banner = f"\ndashboard: {{url}}   ({stops})"
    return serve(
        run_path, banner, port, serve_for_s=serve_for_s, open_browser=sys.stdout.isatty(), query=f"?run={run_id}"
    )


def run(args) -> int:
    if args.serve_for is not None and args.serve_for <= 0:
        raise UserError(f"--serve-for must be > 0 seconds, got {args.serve_for:g}")
    if args.path and not os.path.exists(args.path):
        path = resolve_run(args.path)  # a bare run id under the default root, else a one-line error
    else:
        path = resolve_root(args.path)
    if not 1 <= args.port <= 65535:
        raise UserError(f"--port must be in 1..65535, got {args.port}")
    _check_port(args.host, args.port)  # before anything else is said: a taken port is the one line printed
    if not is_run(path):
        latest = latest_run(path)
        print(
            f"ranksight: opening the latest run under {path}: {latest['run']}"
            if latest
            else f"ranksight: no runs under {path} yet: the dashboard lists them as jobs write there",
            file=sys.stderr,
        )
    banner = f"ranksight dashboard: {{url}}  (reading {os.path.abspath(path)}; Ctrl-C stops)"
    return serve(path, banner, args.port, args.host, args.prometheus, args.refresh, args.serve_for)
