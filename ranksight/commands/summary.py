"""``ranksight summary RUN_DIR``: the per-rank step-time breakdown of a run (live or finished)."""

from __future__ import annotations

from ranksight.collectors import PHASES, open_run, read_rank_meta, step_breakdown

from ._format import ms, pct, table

_LABELS = {
    "data_wait_s": "data",
    "h2d_s": "h2d",
    "compute_s": "compute",
    "comm_exposed_s": "comm",
    "optimizer_s": "optim",
    "other_s": "other",
}


def add_parser(sub):
    p = sub.add_parser(
        "summary",
        help="print the per-rank step-time breakdown of a run",
        description="Print the per-rank step-time breakdown of a run directory.",
    )
    p.add_argument("run_dir", help="a run folder, e.g. ranksight-runs/<run-id>")
    p.add_argument("--warmup", type=int, default=5, help="leading steps per rank to leave out (default 5)")
    return p


def render_breakdown(run_path: str, warmup: int = 5) -> str:
    """Return the breakdown table of a run as text."""
    con = open_run(run_path)
    rows = step_breakdown(con, warmup_steps=warmup)
    metas = {m.rank: m for m in read_rank_meta(run_path)}
    if not rows:
        return f"{run_path}: no steps recorded yet"
    headers = ["rank", "status", "steps", "step ms (median)"] + [f"{_LABELS[p]} %" for p in PHASES] + ["allreduce %"]
    body = []
    for r in rows:
        meta = metas.get(r["rank"])
        body.append(
            [str(r["rank"]), meta.status if meta else "?", str(r["steps"]), ms(r["step_median_s"])]
            + [pct(r[f"{p[:-2]}_share"]) for p in PHASES]
            + [pct(r["allreduce_share"])]
        )
    return table(headers, body)


def run(args) -> int:
    print(render_breakdown(args.run_dir, args.warmup))
    return 0
