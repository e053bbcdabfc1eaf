"""``ranksight ingest RUN_DIR [--prune] [--every S]``: compact a run's spool into ``RUN_DIR/store.duckdb``.

Safe on a live or crashed run and beside readers: the store is rebuilt in a temporary file and
renamed into place, and segments that arrive later are read from the spool until the next ingest.
``--prune`` then deletes the spool segments the store holds, so a long run's disk does not double.
``--every S`` repeats that while the run may still write, then once more after it ended: a big job's
spool then stays a few intervals of files, however long it runs (readers pay per file).
"""

from __future__ import annotations

import time

from ranksight.collectors import PRUNE_AFTER_S, RunDirError, ingest, prune, rank_is_live, read_rank_meta

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "ingest",
        help="compact a run's spool segments into a DuckDB store",
        description="Compact a run's Parquet spool into RUN_DIR/store.duckdb (incremental; safe while it runs).",
    )
    p.add_argument("run_dir", help="a run folder (one sub-folder of the run root, see `ranksight runs`)")
    p.add_argument(
        "--prune",
        action="store_true",
        help="then delete the spool segments the store holds (only what it lists; the store keeps every row)",
    )
    p.add_argument(
        "--nodes",
        action="store_true",
        help="also absorb the per-node stores copied into RUN_DIR/nodes/ (then set aside in nodes/.absorbed/)",
    )
    p.add_argument(
        "--prune-after",
        type=float,
        default=PRUNE_AFTER_S,
        metavar="S",
        help="delete a segment only S seconds after it was ingested, so queries reading it can finish "
        f"(default {PRUNE_AFTER_S:g})",
    )
    p.add_argument(
        "--every",
        type=float,
        default=None,
        metavar="S",
        help="repeat every S seconds while any rank may still write, then once more after the run ended and "
        "exit (a long job's spool stays small with --prune)",
    )
    return p


def run(args) -> int:
    if args.prune and args.prune_after < 0:
        raise UserError(f"--prune-after must be >= 0, got {args.prune_after:g}")
    if args.every is not None and not args.every > 0:
        raise UserError(f"--every must be > 0 seconds, got {args.every:g}")
    if args.every is None:
        _once(args)
        return 0
    first = True
    while True:
        ended = _run_ended(args.run_dir)  # looked at before the pass: the last pass sees the last segments
        try:
            _once(args)
        except RunDirError as exc:
            if first:
                raise
            print(f"this pass skipped: {exc}", flush=True)  # e.g. another ingest holds the lock
        first = False
        if ended:
            return 0
        time.sleep(args.every)


def _run_ended(run_dir: str) -> bool:
    """Whether the run's ranks all stopped writing (the collectors' one liveness rule); a run with no rank
    file yet has not started."""
    metas = read_rank_meta(run_dir)
    return bool(metas) and not any(rank_is_live(m) for m in metas)


def _once(args) -> None:
    result = ingest(args.run_dir, absorb_node_stores=args.nodes)
    kinds = ", ".join(f"{k} {n}" for k, n in result.rows_by_kind.items()) or "nothing new"
    rate = result.rows / result.seconds if result.seconds > 0 else 0.0
    print(
        f"{result.store_path}: +{result.segments} segments, +{result.rows} rows ({kinds}) "
        f"in {result.seconds:.2f} s ({rate:,.0f} rows/s)",
        flush=True,
    )
    if args.prune:
        pruned = prune(args.run_dir, args.prune_after)
        later = ""
        if pruned.kept_recent:
            later = f"; {pruned.kept_recent} ingested less than {args.prune_after:g} s ago kept"
        print(f"pruned {pruned.files} spool segments ({pruned.bytes / 1e6:,.1f} MB){later}", flush=True)
