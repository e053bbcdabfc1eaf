"""``ranksight summary [RUN]``: the per-rank step-time breakdown of a run (live or finished)."""

from __future__ import annotations

from ranksight.collectors import PHASES, open_run
from ranksight.format.warmup import WARMUP_STEPS, is_short

from ._format import ms, pct, table

_LABELS = {
    "data_wait_s": "data",
    "h2d_s": "h2d",
    "compute_s": "compute",
    "comm_exposed_s": "comm",
    "optimizer_s": "optim",
    "other_s": "other",
}
ALLREDUCE_NOTE = (
    "allreduce Σ %: DDP's all-reduce time summed over its gradient buckets, over step time. Buckets run\n"
    "beside backward and beside each other, so it can pass 100 %; the wait the step paid for is comm %."
)


def add_parser(sub):
    p = sub.add_parser(
        "summary",
        help="print the per-rank step-time breakdown of a run",
        description="Print the per-rank step-time breakdown of a run (a run folder, a run id, or the latest run "
        "of a folder of runs).",
    )
    p.add_argument(
        "run_dir",
        nargs="?",
        default=None,
        help="a run folder, a run id, or a folder of runs (its latest run; default ranksight-runs)",
    )
    p.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help=f"leading steps per rank to leave out (default {WARMUP_STEPS})"
    )
    return p


def steps_kept_title(kept: dict[int, int], recorded: dict[int, int], warmup: int) -> str:
    """'55 steps after 5 warm-up', so the count agrees with the steps the job ran (per rank when they differ)."""
    if not kept:
        return "no steps"
    if len(set(kept.values())) == 1 and len({recorded.get(r, 0) for r in kept}) == 1:
        n, total = next(iter(kept.values())), recorded.get(next(iter(kept)), 0)
        if n == total:
            return (
                f"all {n} steps (too few to leave out {warmup} warm-up)"
                if warmup and is_short(n, warmup)
                else f"{n} steps"
            )
        return f"{n} steps after {total - n} warm-up"
    return f"steps after up to {warmup} warm-up per rank"


def render_breakdown(run_path: str, warmup: int = WARMUP_STEPS) -> str:
    """The breakdown table of a run as text: a title with the step counts, the table, and where the all-reduces
    were timed their column and its note."""
    run = open_run(run_path, follow_spool=False)  # one reading: a concurrent prune cannot fail it
    rows = run.breakdown(warmup_steps=warmup)
    metas = {m.rank: m for m in run.ranks}
    if not rows:
        return f"{run_path}: no steps recorded yet"
    recorded = run.steps_recorded()
    kept = {r["rank"]: r["steps"] for r in rows}
    counts = steps_kept_title(kept, recorded, warmup)
    title = f"Step-time breakdown per rank ({counts}):"
    per_rank = counts.startswith("steps after")  # ranks differ: each row says how many of its steps it kept
    # The all-reduce column only where some rank timed its buckets (the per-bucket hook on gloo): without it a
    # column of "–" and its note would say nothing.
    timed = any(r["allreduce_share"] is not None for r in rows)
    headers = ["rank", "status", "steps", "step ms (median)"] + [f"{_LABELS[p]} %" for p in PHASES]
    body = []
    for r in rows:
        meta = metas.get(r["rank"])
        body.append(
            [str(r["rank"]), meta.status if meta else "?"]
            + [_steps_cell(r["steps"], recorded.get(r["rank"], 0), per_rank), ms(r["step_median_s"])]
            + [pct(r[f"{p[:-2]}_share"]) for p in PHASES]
            + ([pct(r["allreduce_share"])] if timed else [])
        )
    if not timed:
        return "\n".join([title, table(headers, body)])
    return "\n".join([title, table([*headers, "allreduce Σ %"], body), ALLREDUCE_NOTE])


def _steps_cell(kept: int, recorded: int, per_rank: bool) -> str:
    return f"{kept} of {recorded}" if per_rank and kept < recorded else str(kept)


def run(args) -> int:
    if args.warmup < 0:
        from ._errors import UserError

        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    print(render_breakdown(args.run_dir, args.warmup))  # ranksight.cli resolved it (commands._paths)
    return 0
