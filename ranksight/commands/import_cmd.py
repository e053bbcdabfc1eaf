"""``ranksight import TRACES... [--run-dir DIR]``: turn ``torch.profiler`` traces into a ranksight run.

Reads the Kineto JSON traces (plain or .gz) that ``tensorboard_trace_handler`` or
``export_chrome_trace`` write, one or more per rank, and writes the same step, bucket, collective and
sample records the agent would have, so ``diagnose``, ``summary``, ``compare`` and the dashboard read
them unchanged. What a trace cannot tell is one warning line each; the rest is kept.
"""

from __future__ import annotations

import os
import sys
import time

from ranksight.collectors import RunDirError
from ranksight.importer import import_traces

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "import",
        help="turn torch.profiler (Kineto) traces into a run that diagnose, summary and the dashboard read",
        description="Import torch.profiler traces (one or more per rank, .json or .json.gz) as a ranksight run.",
    )
    p.add_argument(
        "traces", nargs="+", help="trace files, or folders holding them (e.g. a tensorboard_trace_handler folder)"
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get("RANKSIGHT_RUN_DIR", "ranksight-runs"),
        help="folder of runs to create the run in (default $RANKSIGHT_RUN_DIR or ./ranksight-runs)",
    )
    p.add_argument("--run-id", default=None, help="the new run's id (default <job>-<trace time>-<random>)")
    p.add_argument("--job", default="import", help="job name stamped on the records (default: import)")
    return p


class _Bar:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self) -> None:
        self._last = 0.0
        self._started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        frac = done / total if total else 1.0
        filled = int(frac * 30)
        rate = done / max(now - self._started, 1e-9) / 1e6
        sys.stderr.write(f"\rreading traces [{'#' * filled}{'.' * (30 - filled)}] {frac:4.0%} {rate:6.1f} MB/s")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * 72 + "\r")
        sys.stderr.flush()


def run(args) -> int:
    bar = _Bar() if sys.stderr.isatty() else None
    try:
        result = import_traces(args.traces, args.run_dir, run_id=args.run_id, job=args.job, progress=bar)
    except RunDirError as exc:
        raise UserError(str(exc)) from None
    finally:
        if bar is not None:
            bar.close()
    for line in result.problems:
        print(f"ranksight import: warning: {line}", file=sys.stderr)
    steps = sum(result.ranks.values())
    kind = "GPU" if result.gpu else "CPU"
    counts = sorted(set(result.ranks.values()))
    per_rank = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}" if counts else "0"
    print(
        f"imported {result.files} trace file{'s' if result.files != 1 else ''} ({result.events:,} events, {kind}): "
        f"{len(result.ranks)} of {result.world_size} ranks, {per_rank} steps per rank -> {result.run_path}"
    )
    if steps == 0:
        raise UserError("no profiled steps in the traces: nothing to diagnose (see the warnings above)")
    print(f"next: ranksight diagnose {result.run_path}")
    return 0
