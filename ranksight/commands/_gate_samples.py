"""Per-rank, per-step step time and phase seconds of one run: what the gate's bootstrap resamples.

Why a reader of its own: a run's breakdown gives one mean per rank, and a mean cannot say how sure it is.
The gate needs every kept step's period and phases (the same ``PERIOD_SQL`` and ``PHASE_SQL`` every other
reader sums, so the figures agree with ``ranksight compare``'s table), read once and held as plain arrays
that a baseline file can also carry.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ranksight.format.phases import PERIOD_SQL, PHASE_SQL, PHASES, SAMPLED_SQL

COLUMNS = ("period_s", *PHASES)
"""The per-step values a sample holds, in seconds; the phases add up to the period."""

HOST_COLUMNS = ("cpu_s", "on_gpu")
"""Per step, besides: the training thread's CPU seconds, and 1 where the period is the GPU stream's (else
the host's wall time). Kept with the run's steps (and in a baseline file) for readers of them; the gate reads
the host's stretch from the phases themselves (``_gate_stats.host_stretch``)."""

WARMUP_FRACTION = 0.1
"""The gate leaves out at least this leading share of each rank's steps, besides ``--warmup``: a short run's
warm-up (allocator growth, caches, the first collectives) can outlast the fixed few steps the table drops,
and one slow stretch at the start would read as a slowdown."""


@dataclass
class Samples:
    """One run's kept steps: ``ranks[r]`` maps ``step`` and each of ``COLUMNS`` to an array of the rank's steps
    in step order (a phase never measured on the rank, H2D on a CPU job, is all NaN)."""

    run: str
    world_size: int | None
    ranks: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def steps(self) -> int:
        """The most kept steps of any rank."""
        return max((len(r["step"]) for r in self.ranks.values()), default=0)


def _used_columns() -> dict[str, str]:
    """Every step column the period and phase SQL reads, with its type: the ones an older agent's (or an
    imported trace's) rows lack read as NULL, as the breakdown's own queries read them."""
    text = " ".join([PERIOD_SQL, SAMPLED_SQL, *PHASE_SQL.values()])
    names = set(re.findall(r"\b((?:gpu_)?[a-z0-9_]+_s|gpu_sampled)\b", text)) | {"cpu_s"}
    return {n: "BOOLEAN" if n == "gpu_sampled" else "DOUBLE" for n in sorted(names)}


def read_samples(run_path: str, warmup_steps: int) -> Samples:
    """The kept steps of every rank of a run (a run folder: agent spool, ingested store or imported traces)."""
    from ranksight.collectors import open_run

    phases = ", ".join(f"{PHASE_SQL[p]} AS {p}" for p in PHASES)
    with open_run(run_path) as run:
        present = {row[0] for row in run.execute("DESCRIBE steps").fetchall()}
        extra = "".join(f", CAST(NULL AS {t}) AS {c}" for c, t in _used_columns().items() if c not in present)
        rows = run.execute(
            f"SELECT rank, step, {PERIOD_SQL} AS period_s, {phases}, cpu_s, "
            "CASE WHEN gpu_step_s IS NULL THEN 0.0 ELSE 1.0 END AS on_gpu "
            f"FROM (SELECT *{extra} FROM steps) WHERE {SAMPLED_SQL} AND step >= ? ORDER BY rank, step",
            [warmup_steps],
        ).fetchall()
        sizes = {m.data.get("world_size") for m in run.ranks}
        name = next((m.data["run"] for m in run.ranks if m.data.get("run")), None)
    world = next(iter(sizes)) if len(sizes) == 1 else None
    out = Samples(run=name or str(run_path).rstrip("/").split("/")[-1], world_size=world)
    by_rank: dict[int, list] = {}
    for row in rows:
        by_rank.setdefault(int(row[0]), []).append(row[1:])
    for rank, kept in by_rank.items():
        arr = np.array([[np.nan if v is None else float(v) for v in r] for r in kept], dtype=float)
        names = (*COLUMNS, *HOST_COLUMNS)
        out.ranks[rank] = {"step": arr[:, 0].astype(int), **{c: arr[:, i + 1] for i, c in enumerate(names)}}
    if out.world_size is None and out.ranks:
        out.world_size = max(out.ranks) + 1
    return out


def steady(rank: dict[str, np.ndarray], warmup_steps: int) -> dict[str, np.ndarray]:
    """A rank's steps past the warm-up: step numbers below ``warmup_steps`` and below ``WARMUP_FRACTION`` of
    the rank's last step are left out. It goes by step numbers, so a baseline saved after the warm-up is cut
    at the same step as the run it came from."""
    steps = rank["step"]
    if not len(steps):
        return rank
    cut = max(warmup_steps, math.ceil(WARMUP_FRACTION * (int(steps.max()) + 1)))
    keep = steps >= cut
    return {k: v[keep] for k, v in rank.items()}


def job_series(ranks: dict[int, dict[str, np.ndarray]], which: list[int]) -> dict[str, np.ndarray]:
    """One series for the job: per step that every rank in ``which`` kept, each column's mean over them
    (the ranks step together under DDP, so a step's cost is what they spent on it together)."""
    common = None
    for r in which:
        common = set(ranks[r]["step"].tolist()) if common is None else common & set(ranks[r]["step"].tolist())
    steps = np.array(sorted(common or ()), dtype=int)
    out: dict[str, np.ndarray] = {"step": steps}
    for c in (*COLUMNS, *HOST_COLUMNS):
        if any(c not in ranks[r] for r in which):
            continue
        stacked = []
        for r in which:
            index = {s: i for i, s in enumerate(ranks[r]["step"].tolist())}
            stacked.append(ranks[r][c][[index[s] for s in steps.tolist()]])
        out[c] = np.mean(stacked, axis=0) if stacked else np.array([])
    return out
