"""Per-rank features of a run: the numbers the diagnosis rules read.

One dict per rank, name -> number (or None when the run cannot say: a GPU signal on a CPU job, a DDP
figure not sampled yet). Absent is never turned into zero, so a rule that needs a GPU signal stays
silent on a CPU job. Figures that compare ranks (straggler score, memory spread) are computed here,
once, and copied into every rank's dict, so the rules stay per-rank and pure.

Warm-up steps (compilation, allocator growth, DDP bucket rebuild) are left out of every step figure.
"""

from __future__ import annotations

import statistics

from ranksight.schema import SAMPLE_NAMES

from ._queries import PHASES, step_breakdown
from ._spool_reader import open_run, read_rank_meta

#: Every feature a rule may name, with its meaning. Rule files are checked against this list.
FEATURES: dict[str, str] = {
    "rank": "Global rank.",
    "world_size": "Number of ranks in the job.",
    "ranks_reporting": "Ranks with at least one step recorded.",
    "steps": "Steps recorded on this rank after warm-up.",
    "step_median_s": "Median step period: wall time, or the GPU's step time where that is longer.",
    "step_mean_s": "Mean step period (as step_median_s).",
    "compute_median_s": "Median forward+backward time (GPU time when every rank has it, else host time).",
    "data_wait_share": "Share of the step period the data loader cost: host wait for a batch, on a GPU rank only "
    "the part during which the GPU stream sat idle (gpu_gap_s).",
    "data_wait_host_share": "Share of the step period the host waited for the data loader, hidden or not.",
    "h2d_share": "Share of step time in host-to-device copies (GPU only).",
    "compute_share": "Share of step time in forward+backward.",
    "comm_exposed_share": "Share of step time waiting for all-reduce after backward ended.",
    "optimizer_share": "Share of step time in optimizer.step().",
    "other_share": "Share of step time outside the named phases.",
    "allreduce_share": "Sum of per-bucket all-reduce time over step time (overlapped or not); host-measured, so "
    "absent under NCCL, whose futures complete when the collective is enqueued.",
    "comm_to_compute": "Exposed comm time over compute time.",
    "comm_overlap": "1 - exposed comm / all-reduce time: how much all-reduce hid behind backward.",
    "comm_floor_share": "Exposed comm share of the rank that waits least (copied to every rank): the slowest rank "
    "waits for no peer, so this is what all-reduce itself costs.",
    "comm_floor_to_compute": "Exposed comm over compute on that same rank (copied to every rank).",
    "buckets_per_step": "Median gradient buckets all-reduced per step.",
    "grad_bytes_per_step": "Median gradient bytes all-reduced per step.",
    "allreduce_bytes_per_s": "Gradient bytes over all-reduce time: effective all-reduce bandwidth.",
    "straggler_score": "Fastest rank's median compute over this rank's (1 = fastest; wall time hides it).",
    "compute_vs_median": "This rank's median compute over the median across ranks.",
    "slowest_rank": "Rank with the largest median compute (copied to every rank).",
    "slowest_step_share": "Share of steps (seen on every rank) in which this rank had the longest compute.",
    "graph_breaks": "Graph breaks reported by torch.compile on this rank.",
    "recompiles": "Recompilations on this rank.",
    "recompiles_after_warmup": "Recompilations noticed after the warm-up steps.",
    "compiled": "1 when the model runs under torch.compile (compile records or an OptimizedModule), else 0.",
    "ddp": "1 when the model is DDP-wrapped, else 0.",
    "find_unused_parameters": "DDP's find_unused_parameters (1/0); absent without DDP.",
    "ddp_backend_gloo": "1 when DDP all-reduces through gloo, 0 for another backend; absent without DDP.",
    "unused_parameter_size": "Bytes of parameters DDP found unused in its latest sampled iteration.",
    "ddp_stats_iteration": "Iteration of DDP's latest runtime logging sample (0: none yet).",
    "bucket_cap_bytes": "DDP bucket_cap_mb in bytes.",
    "parameter_bytes": "Bytes of model parameters.",
    "model_on_gpu": "1 when the model's parameters are on a GPU, else 0.",
    "gpu_busy_ratio": "Share of time a kernel ran: the sampled window's kernel_busy_ratio when a window exists "
    "(exact, over traced steps), else NVML's gpu_utilization_ratio (1 s averages, so coarse in short runs).",
    "device_memory_bytes": "Total memory of the rank's GPU.",
    "model_state_bytes": "Weights + gradients + optimizer state (parameter_bytes x (2 + the optimizer's states per "
    "parameter: Adam 2, SGD with momentum 1)); absent for an optimizer ranksight does not know.",
    "model_state_share": "model_state_bytes over device_memory_bytes: what a replicated (unsharded) model takes of "
    "each GPU before any activation.",
    "records_dropped_total": "Records the agent dropped (its buffer was full).",
    "agent_errors_total": "Errors inside the agent (it turned the failing part off).",
    "memory_reserved_excess": "This rank's reserved GPU memory over the median across ranks, minus 1.",
    "memory_reserved_spread": "(max - min) / max of reserved GPU memory across ranks.",
    **{name: f"Sample: {doc}" for name, doc in SAMPLE_NAMES.items()},
}

_COUNTER_SUFFIX = "_total"  # cumulative samples: the latest value, not the median


def run_features(run_path: str, warmup_steps: int = 5) -> dict[int, dict]:
    """Open a run directory and return its features per rank (see ``FEATURES``)."""
    con = open_run(run_path)
    return compute_features(con, read_rank_meta(run_path), warmup_steps)


def compute_features(con, metas: list, warmup_steps: int = 5, breakdown: list[dict] | None = None) -> dict[int, dict]:
    """Features per rank from a connection with the run's views and the ranks' metadata."""
    rows = breakdown if breakdown is not None else step_breakdown(con, warmup_steps=warmup_steps)
    meta_by_rank = {m.rank: m.data for m in metas}
    extra = _step_extras(con, warmup_steps)
    compile_counts = _compile_counts(con, warmup_steps)
    samples = _sample_values(con, warmup_steps)
    ranks = sorted(set(meta_by_rank) | {r["rank"] for r in rows})
    feats: dict[int, dict] = {}
    for rank in ranks:
        f = {name: None for name in FEATURES}
        f["rank"] = rank
        f.update(_meta_features(meta_by_rank.get(rank, {})))
        f.update(_step_features(next((r for r in rows if r["rank"] == rank), None), extra.get(rank, {})))
        f.update(_compile_features(compile_counts.get(rank, {}), f))
        f.update({name: samples.get((rank, name)) for name in SAMPLE_NAMES})
        busy = f["kernel_busy_ratio"]
        f["gpu_busy_ratio"] = busy if busy is not None else f["gpu_utilization_ratio"]
        if f.pop("_backend", None) == "nccl":
            # NCCL completes its futures when the collective is enqueued: host all-reduce times say nothing
            # (exposed comm comes from the GPU's clock instead, see PHASE_SQL).
            f["allreduce_share"] = f["comm_overlap"] = f["allreduce_bytes_per_s"] = None
        feats[rank] = f
    _cross_rank(con, warmup_steps, feats, extra)
    return feats


def _step_extras(con, warmup_steps: int) -> dict[int, dict]:
    sql = """
        WITH counted AS (SELECT *, count(*) OVER (PARTITION BY rank) AS n FROM steps),
             kept AS (SELECT * FROM counted WHERE step >= ? OR n <= ?)
        SELECT rank, median(buckets) AS buckets_per_step, median(bucket_bytes) AS grad_bytes_per_step,
               sum(comm_exposed_s) AS exposed_sum, sum(allreduce_s) AS allreduce_sum,
               sum(bucket_bytes) FILTER (WHERE allreduce_s > 0) AS bytes_sum,
               median(gpu_compute_s) AS gpu_compute_median_s, count(gpu_compute_s) AS gpu_rows,
               max(world_size) AS world_size
        FROM kept GROUP BY rank
    """
    cur = con.execute(sql, [warmup_steps, warmup_steps])
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}


def _compile_counts(con, warmup_steps: int) -> dict[int, dict]:
    sql = """
        SELECT rank, kind, sum(count) AS total, coalesce(sum(count) FILTER (WHERE step >= ?), 0) AS late
        FROM compile GROUP BY rank, kind
    """
    out: dict[int, dict] = {}
    for rank, kind, total, late in con.execute(sql, [warmup_steps]).fetchall():
        out.setdefault(rank, {})[kind] = (int(total), int(late))
    return out


def _sample_values(con, warmup_steps: int) -> dict[tuple[int, str], float]:
    # After warm-up when there is anything there, else everything: a short or young run still says something.
    sql = """
        SELECT rank, name,
               coalesce(median(value) FILTER (WHERE step >= ?), median(value)) AS typical,
               arg_max(value, time_ns) AS latest
        FROM samples GROUP BY rank, name
    """
    out = {}
    for rank, name, typical, latest in con.execute(sql, [warmup_steps]).fetchall():
        out[(rank, name)] = float(latest if name.endswith(_COUNTER_SUFFIX) else typical)
    return out


def _meta_features(meta: dict) -> dict:
    f: dict = {}
    if not meta:
        return f
    f["world_size"] = meta.get("world_size")
    counters = meta.get("counters") or {}
    f["records_dropped_total"] = counters.get("records_dropped_total")
    f["agent_errors_total"] = counters.get("agent_errors_total")
    model = meta.get("model") or {}
    if model:
        f["parameter_bytes"] = model.get("parameter_bytes")
        devices = model.get("devices") or []
        f["model_on_gpu"] = int(any(str(d).startswith("cuda") for d in devices))
    f["device_memory_bytes"] = (meta.get("gpu_device") or {}).get("total_memory_bytes")
    states = (meta.get("optimizer") or {}).get("states_per_param")
    if isinstance(states, int) and isinstance(f.get("parameter_bytes"), (int, float)):
        f["model_state_bytes"] = f["parameter_bytes"] * (2 + states)
        if f["device_memory_bytes"]:
            f["model_state_share"] = f["model_state_bytes"] / f["device_memory_bytes"]
    ddp = meta.get("ddp")
    f["ddp"] = int(bool(ddp))
    if ddp:
        f["find_unused_parameters"] = int(bool(ddp.get("find_unused_parameters")))
        f["bucket_cap_bytes"] = ddp.get("bucket_cap_bytes")
        f["_backend"] = ddp.get("backend")
        f["ddp_backend_gloo"] = int(ddp.get("backend") == "gloo")
    logging_data = meta.get("ddp_logging") or {}
    iteration = logging_data.get("iteration")
    f["ddp_stats_iteration"] = iteration if isinstance(iteration, (int, float)) else None
    unused = logging_data.get("unused_parameter_size")
    # DDP only fills this once it has sampled a runtime iteration (iteration > 0).
    if isinstance(unused, (int, float)) and iteration:
        f["unused_parameter_size"] = unused
    f["_model_class"] = model.get("class")
    return f


def _step_features(row: dict | None, extra: dict) -> dict:
    if row is None:
        return {}
    f = {
        "steps": row["steps"],
        "step_median_s": row["step_median_s"],
        "step_mean_s": row["step_mean_s"],
        "compute_median_s": row["compute_median_s"],
        "allreduce_share": row["allreduce_share"],
        "data_wait_host_share": row["data_wait_host_share"],
        **{f"{p[:-2]}_share": row[f"{p[:-2]}_share"] for p in PHASES},
    }
    if f["compute_share"] and f["comm_exposed_share"] is not None:
        f["comm_to_compute"] = f["comm_exposed_share"] / f["compute_share"]
    allreduce_sum, exposed_sum = extra.get("allreduce_sum"), extra.get("exposed_sum")
    if allreduce_sum and allreduce_sum > 0:
        f["comm_overlap"] = max(0.0, 1.0 - (exposed_sum or 0.0) / allreduce_sum)
        if extra.get("bytes_sum"):
            f["allreduce_bytes_per_s"] = extra["bytes_sum"] / allreduce_sum
    f["buckets_per_step"] = extra.get("buckets_per_step")
    f["grad_bytes_per_step"] = extra.get("grad_bytes_per_step")
    if extra.get("world_size"):
        f["world_size"] = int(extra["world_size"])
    return f


def _compile_features(counts: dict, f: dict) -> dict:
    breaks, _ = counts.get("graph_break", (0, 0))
    recompiles, late = counts.get("recompile", (0, 0))
    compiled = bool(counts) or f.get("_model_class") == "OptimizedModule"
    return {
        "graph_breaks": breaks,
        "recompiles": recompiles,
        "recompiles_after_warmup": late,
        "compiled": int(compiled),
    }


def _slowest_step_share(con, warmup_steps: int, ranks: list[int], use_gpu: bool) -> dict[int, float]:
    """Per rank, how often it was the slowest: a real straggler is slow in nearly every step, while
    contention on a shared host moves the slowest rank around.

    Only steps with a row from every compared rank count. Rows are counted, not distinct ranks (a
    rank writes a step once; the distinct count made this query 7x slower at 1,024 ranks x 10,000
    steps: 1.56 s against 0.21 s)."""
    column = "gpu_compute_s" if use_gpu else "compute_s"
    sql = f"""
        WITH kept AS (
                SELECT rank, step, {column} AS c FROM steps
                WHERE {column} IS NOT NULL AND rank IN (SELECT unnest(?::INTEGER[]))
                  AND (step >= ? OR (SELECT max(step) FROM steps) < ?)),
             per_step AS (SELECT step, max(c) AS top FROM kept GROUP BY step HAVING count(*) = ?)
        SELECT k.rank, avg(CASE WHEN k.c = p.top THEN 1.0 ELSE 0.0 END)
        FROM kept k JOIN per_step p USING (step) GROUP BY k.rank
    """
    rows = con.execute(sql, [ranks, warmup_steps, warmup_steps, len(ranks)]).fetchall()
    return {rank: share for rank, share in rows}


def _cross_rank(con, warmup_steps: int, feats: dict[int, dict], extra: dict[int, dict]) -> None:
    """Figures that compare ranks: straggler score from compute time, memory spread."""
    for f in feats.values():
        f.pop("_model_class", None)
    reporting = [r for r, f in feats.items() if f["steps"]]
    for f in feats.values():
        f["ranks_reporting"] = len(reporting)
    # GPU compute when every reporting rank has it (host time includes launch queueing), else host compute.
    use_gpu = reporting and all(extra.get(r, {}).get("gpu_compute_median_s") for r in reporting)
    compute = {}
    for r in reporting:
        value = extra[r]["gpu_compute_median_s"] if use_gpu else feats[r]["compute_median_s"]
        if value and value > 0:
            compute[r] = value
    if use_gpu:
        for r, value in compute.items():
            feats[r]["compute_median_s"] = value
    if len(compute) >= 2:
        for r, share in _slowest_step_share(con, warmup_steps, sorted(compute), use_gpu).items():
            feats[r]["slowest_step_share"] = share
        fastest, median = min(compute.values()), statistics.median(compute.values())
        slowest = max(compute, key=compute.get)
        for r, value in compute.items():
            feats[r]["straggler_score"] = fastest / value
            feats[r]["compute_vs_median"] = value / median
        for f in feats.values():
            f["slowest_rank"] = slowest
    # Exposed comm on a fast rank is mostly waiting for slower peers; the rank that waits least shows the
    # all-reduce's own cost, which is what "sync-bound" means.
    exposed = {r: feats[r]["comm_exposed_share"] for r in reporting if feats[r]["comm_exposed_share"] is not None}
    if exposed:
        floor_rank = min(exposed, key=exposed.get)
        for f in feats.values():
            f["comm_floor_share"] = exposed[floor_rank]
            f["comm_floor_to_compute"] = feats[floor_rank]["comm_to_compute"]
    reserved = {r: f["memory_reserved_bytes"] for r, f in feats.items() if f.get("memory_reserved_bytes")}
    if len(reserved) >= 2:
        median, high = statistics.median(reserved.values()), max(reserved.values())
        spread = (high - min(reserved.values())) / high
        for r, f in feats.items():
            f["memory_reserved_spread"] = spread
            if r in reserved:
                f["memory_reserved_excess"] = reserved[r] / median - 1.0
