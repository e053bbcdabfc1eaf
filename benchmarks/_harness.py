"""What every benchmark repeats, in one place: arms taking turns in rounds with the machine's load at each
(``in_rounds``), a fresh process timed with its user and system CPU (``fresh_process``), the options every
benchmark takes (``cli``), NVLink multicast off for the GPU benchmarks (``device_env``), and a results file
whose header says where, from which commit and with which command its figures were measured
(``write_results``).

Why: on a shared machine a figure means something only beside the load it was measured under and the code
it measured; one implementation keeps every results file comparable with every other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rotated(arms: list, r: int) -> list:
    """Round ``r``'s order: the arms rotated by r (over len(arms) rounds each arm runs once in every
    position), so that drift in the machine falls on every arm alike."""
    k = r % len(arms)
    return list(arms[k:]) + list(arms[:k])


def in_rounds(arms, rounds: int, measure, show=None) -> dict[str, list[dict]]:
    """Every arm once a round, in ``rotated`` order, for ``rounds`` rounds: ``measure(arm, r)``'s figures (a
    dict) by arm, each with its round and the machine's load at the round's start (``machine_load``) added;
    ``show(arm, figures)``, where given, is the line printed after each."""
    out: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(rounds):
        load = machine_load()
        for arm in rotated(list(arms), r):
            out[arm].append({**measure(arm, r), "round": r, "load": load})
            if show is not None:
                print(f"round {r} {arm}: {show(arm, out[arm][-1])}", flush=True)
    return out


def timed(fn, repeats: int = 3, each: list | None = None) -> tuple[float, object]:
    """(median seconds of ``repeats`` calls of ``fn()``, the last call's result); each call's seconds are
    appended to ``each`` where given."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    if each is not None:
        each.extend(times)
    return statistics.median(times), out


def spread(xs: list[float]) -> dict:
    """Median, min and max (and the quartiles from 4 values on) of a list; {} when empty."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {}
    out = {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        out["p25"], out["p75"] = q[0], q[2]
    return out


def free_port() -> int:
    """A free TCP port on the loopback interface (for a process group or a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off in NCCL, PyTorch and NVSHMEM: on a GPU host shared with others, a program that uses it
can take the host's GPUs out of service."""


def device_env() -> None:
    """Set ``DEVICE_ENV`` in this process's environment (where not set), before NCCL starts: the processes
    it starts inherit it."""
    for name, value in DEVICE_ENV.items():
        os.environ.setdefault(name, value)


def cpu_pressure() -> dict | None:
    """The kernel's CPU pressure (``/proc/pressure/cpu``: the share of time some task waited for a core),
    or None where the kernel does not report it."""
    try:
        with open("/proc/pressure/cpu") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    out = {}
    for line in filter(None, lines):
        kind, *fields = line.split()
        out[kind] = {k: float(v) for k, v in (f.split("=") for f in fields)}
    return out


def machine_load() -> dict:
    """The load average and CPU pressure now: what a round's figures were measured under."""
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": os.getloadavg(),
            "cpu_pressure": cpu_pressure()}  # fmt: skip


def fresh_process(code: str, *args: str, env: dict | None = None) -> dict:
    """Run ``python -c code args`` in a fresh process; its last stdout line (JSON) with the process's own
    wall, user and system seconds added under ``process`` (system time: the kernel's page faults, which
    a first call pays and a later one does not)."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True, env=env
    )
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["process"] = {"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
                          "system_s": after.ru_stime - before.ru_stime}  # fmt: skip
    return figures


def cli(doc: str, rounds: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's options: the first line of its docstring as the description, ``--json OUT`` (the results
    file, written with ``write_results``) and, where it runs arms in rounds, ``--rounds N`` (default ``rounds``)."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--json", help="write the figures here, under the common header")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="rounds: every arm once in each, rotated")
    return parser


def commit() -> str | None:
    """The checkout's HEAD commit, with ``-dirty`` where tracked files differ from it; outside a git checkout
    (a ``git archive`` copy on another machine) ``RANKSIGHT_COMMIT`` where the copy's maker set it, else None.
    Why the suffix: a device machine's copy of the working tree can carry a ``.git`` older than its files, and
    a results file must not name a commit it was not measured on."""
    given = os.environ.get("RANKSIGHT_COMMIT") or None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, timeout=10)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, cwd=REPO, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return given
    sha = head.stdout.strip() if head.returncode == 0 else ""
    return (sha + "-dirty" if changed.stdout.strip() else sha) if sha else given


def machine() -> dict:
    """Hostname, cores, Python and (where importable) torch: what a figure from another machine differs in."""
    out = {"hostname": platform.node(), "nproc": os.cpu_count(), "python": platform.python_version(),
           "platform": platform.platform()}  # fmt: skip
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        pass
    return out


def header(arms: list | None = None, rounds: int | None = None) -> dict:
    """The common header of a results file: command line, commit, machine, arms and rounds."""
    return {"command": [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]], "commit": commit(),
            "machine": machine(), "arms": arms, "rounds": rounds}  # fmt: skip


def write_results(path: str, figures: dict, arms: list | None = None, rounds: int | None = None) -> None:
    """Write ``figures`` to ``path`` as JSON, the common ``header`` first (its keys beside the figures'
    own, which stay where readers of the file look for them); its folder is made where missing."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"header": header(arms, rounds), **figures}, f, indent=1, default=_plain)


def _plain(value):
    """What JSON has no type for, as results files keep it: a set as a sorted list, anything else as text."""
    return sorted(value, key=str) if isinstance(value, (set, frozenset)) else str(value)
