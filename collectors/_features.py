"""Per-rank features of a run: the numbers the diagnosis rules read, and the context their fixes are fitted to.

One dict per rank, name -> number (or None when the run cannot say: a GPU signal on a CPU job, a DDP
figure not sampled yet). Absent is never turned into zero, so a rule that needs a GPU signal stays
silent on a CPU job. Figures that compare ranks (who waits for whom at collectives, memory spread)
are computed here, once, and copied into every rank's dict, so the rules stay per-rank and pure.
Strings (the framework, the transport) are not numbers: they go to a separate context dict per rank
(``CONTEXT``), which only fix templates read.

Warm-up steps (compilation, allocator growth, DDP bucket rebuild) are left out of every step figure.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections import Counter
from collections.abc import Iterator, Mapping

from ranksight.format.schema import SAMPLE_NAMES

from ._fsdp_features import FSDP_CONTEXT, FSDP_CONTEXT_DEFAULTS, FSDP_FEATURES, fsdp_context, fsdp_features
from ._queries import (
    BREAKDOWN_COLUMNS,
    GPU_UTILIZATION_SAMPLE,
    collective_ops,
    rank_step_stats,
    recompile_excess,
    slowest_shares,
    steps_source,
    wait_asymmetry,
)
from ._tables import query

#: Every feature a rule may name, with its meaning. Rule files are checked against this list.
FEATURES: dict[str, str] = {
    "rank": "Global rank.",
    "world_size": "Number of ranks in the job.",
    "ranks_reporting": "Ranks with at least one step recorded.",
    "nodes": "Nodes the reporting ranks run on.",
    "steps": "Steps recorded on this rank after warm-up.",
    "step_median_s": "Median step period: wall time, or the GPU's step time where that is longer.",
    "step_mean_s": "Mean step period (as step_median_s).",
    "run_time_s": "Sum of the step periods after warm-up.",
    "compute_median_s": "Median forward+backward time (GPU time when every rank has it, else host time).",
    "data_wait_share": "Share of the step period the data loader cost: host wait for a batch, on a GPU rank only "
    "the part during which the GPU stream sat idle (gpu_gap_s before the step, gpu_data_idle_s inside it). Absent when "
    "the rank never measured it.",
    "data_wait_share_noise": "Uncertainty of the data wait share: the standard error of its per-step mean.",
    "data_wait_host_share": "Share of the step period the host waited for the data loader, hidden or not.",
    "data_measured": "1 when this rank measured its data wait (wrapped loader or mon.data() marks), else 0.",
    "ranks_data_measured": "Ranks that measured their data wait (copied to every rank).",
    "h2d_share": "Share of step time in host-to-device copies (GPU only).",
    "h2d_gap_share": "Host-to-device copies the sampled window saw beyond the step's own copy span: h2d_copy_ratio "
    "less h2d_share, at least 0 (GPU only). Copies issued before mon.step() (the DDP tutorial's source.to(device) "
    "after the loader) run in the gap before the step, which the data wait is judged against: this much of that "
    "gap was the GPU copying, not idle.",
    "compute_share": "Share of step time in forward+backward.",
    "comm_exposed_share": "Share of step time waiting at collectives: DDP's exposed gradient all-reduce plus "
    "blocking collectives (comm_blocked_s).",
    "grad_comm_share": "Share of step time waiting for DDP's gradient all-reduce after backward ended.",
    "comm_blocked_share": "Share of step time blocked in collectives outside DDP's buckets (metric all-reduce, "
    "barriers, object collectives, FSDP2 waits); absent when the agent did not time them.",
    "optimizer_share": "Share of step time in optimizer.step().",
    "other_share": "Share of step time outside the named phases.",
    "allreduce_share": "Sum of per-bucket all-reduce time over step time (overlapped or not); host-measured, so "
    "absent under NCCL, whose futures complete when the collective is enqueued.",
    "comm_to_compute": "Exposed gradient comm time over compute time.",
    "comm_overlap": "1 - exposed comm / all-reduce time: how much all-reduce hid behind backward.",
    "comm_floor_share": "Gradient all-reduce cost itself: per step, the exposed all-reduce of the rank that waited "
    "least (the others also waited for it), summed over steps seen on every rank, over their periods (copied "
    "to every rank).",
    "comm_floor_share_noise": "Uncertainty of comm_floor_share: the standard error of its per-step mean.",
    "comm_floor_to_compute": "comm_floor_share over the median rank's compute share.",
    "comm_floor_s": "Mean per-step exposed gradient all-reduce of the rank that waited least, seconds.",
    "comm_blocked_floor_share": "Blocking collectives' own cost: per step, the least total wait at collectives "
    "across ranks less the least exposed gradient all-reduce (the blocked time every rank paid, including the "
    "jitter extra sync points make each rank pay in turn), over the period (copied to every rank); absent when "
    "not timed.",
    "comm_blocked_floor_share_noise": "Uncertainty of comm_blocked_floor_share from its per-step spread.",
    "collectives_per_step": "Median blocking collectives per step (outside DDP's buckets).",
    "collective_bytes_per_step": "Median bytes of those collectives per step.",
    "least_wait_step_share": "Share of steps (seen on every rank) in which this rank waited least at collectives: "
    "the rank the others wait for.",
    "straggler_cost_share": "What waiting for this rank costs: over the steps where it waited least, how much "
    "longer the next-least-waiting rank waited, over the period sum (what fixing it would give back).",
    "straggler_cost_share_noise": "Uncertainty of straggler_cost_share from its per-step spread.",
    "straggler_work_explained": "Over the steps where this rank arrived last: its training thread's extra CPU "
    "time over the other ranks' mean (steps.cpu_s), over what the others waited for it. Near 1 when it had more "
    "work to do; near 0 when a busy host kept it waiting for a core. CPU ranks only (a GPU rank's thread spins "
    "while it waits for the device).",
    "least_wait_top_share": "The largest least_wait_step_share of any rank (copied to every rank): near 1 when one "
    "rank arrives last at nearly every collective, low when the late rank changes from step to step.",
    "imbalance_cost_share": "Per step, how much longer the second-least-waiting rank waited than the least, "
    "whoever that was, over the period sum (copied to every rank): the cost of uneven ranks.",
    "buckets_per_step": "Median gradient buckets all-reduced per step.",
    "grad_bytes_per_step": "Median gradient bytes all-reduced per step.",
    "allreduce_bytes_per_s": "Gradient bytes over all-reduce time: effective all-reduce bandwidth (host clock).",
    "transport_bytes_per_s": "Bandwidth the transport should give an all-reduce (assumed per transport, see "
    "docs/diagnosis.md): gloo on one node 1 GB/s, NVLink 300 GB/s, PCIe 20 GB/s, InfiniBand 20 GB/s.",
    "transport_latency_s": "Latency the transport should give one small all-reduce (assumed, as above).",
    "allreduce_wire_s": "Time the gradient bytes need at the transport's bandwidth: 2(N-1)/N x bytes / bandwidth.",
    "allreduce_latency_s": "Time the all-reduces of a step need at the transport's latency: buckets x latency.",
    "allreduce_achieved_bytes_per_s": "Bytes on the wire per second of all-reduce actually measured (per-bucket "
    "all-reduce time on the host, else the rank's exposed all-reduce).",
    "allreduce_efficiency": "allreduce_achieved_bytes_per_s over transport_bytes_per_s.",
    "straggler_score": "Fastest rank's median compute over this rank's (1 = fastest; wall time hides it).",
    "compute_vs_median": "This rank's median compute over the median across ranks.",
    "slowest_rank": "Rank with the largest median compute (copied to every rank).",
    "slowest_step_share": "Share of steps (seen on every rank) in which this rank had the longest compute.",
    "graph_breaks": "Graph breaks reported by torch.compile on this rank.",
    "recompiles": "Recompilations on this rank.",
    "recompiles_after_warmup": "Recompilations noticed after the warm-up steps.",
    "recompile_excess_share": "Time the steps around each recompile took beyond the median step, over the period "
    "sum: what the recompiles cost (absent without recompiles after warm-up).",
    "compiled": "1 when the model runs under torch.compile (compile records or an OptimizedModule), else 0.",
    "ddp": "1 when the model is DDP-wrapped, else 0.",
    "fsdp": "1 when the model is sharded with FSDP2 (fully_shard), else 0.",
    "find_unused_parameters": "DDP's find_unused_parameters (1/0); absent without DDP.",
    "static_graph": "DDP's static_graph (1/0); absent without DDP or when not recorded.",
    "gradient_as_bucket_view": "DDP's gradient_as_bucket_view (1/0); absent without DDP or when not recorded.",
    "ddp_backend_gloo": "1 when DDP all-reduces through gloo, 0 for another backend; absent without DDP.",
    "unused_parameter_size": "Bytes of parameters DDP found unused in its latest sampled iteration.",
    "ddp_stats_iteration": "Iteration of DDP's latest runtime logging sample (0: none yet).",
    "bucket_cap_bytes": "DDP bucket_cap_mb in bytes.",
    "bucket_cap_mb": "DDP bucket_cap_mb.",
    "parameter_bytes": "Bytes of model parameters.",
    "model_on_gpu": "1 when the model's parameters are on a GPU, else 0.",
    "gpu_utilization_samples": "NVML utilization samples after warm-up (each averages up to a second): below "
    "NVML_STEADY_SAMPLES the reading is start-up as much as training, and the checklist leaves it out.",
    "gpu_busy_ratio": "Share of a typical step a kernel ran: with a sampled window, its kernel time per traced "
    "step (window_kernel_s_per_step) over the median step, at most 1 and at least the window's own "
    "kernel_busy_ratio; else NVML's gpu_utilization_ratio (up to each rank's last step) once 5 "
    "of its samples (~5 s) came after warm-up (1 s averages: a run's first seconds read start-up); else unknown.",
    "window_kernel_s_per_step": "Seconds of kernel time per traced step, the median over windows: the kernels "
    "the window's steps launched, on the GPU's clock (kernel_seconds_per_step); a window without that figure "
    "gives its kernel_busy_ratio times its traced steps' mean host duration. The profiler's own host work "
    "stretches traced steps (nanoGPT on one H200: 70-75 ms traced against 43 ms untraced), so a share of the "
    "window's span understates how busy an untraced step keeps the GPU; its kernel time does not change.",
    "window_stretch": "Traced steps' duration over the median step (1: the window cost the step nothing).",
    "idle_host_wait_ratio_traced": "idle_host_wait_ratio as the window measured it, before window_stretch: the "
    "profiler's host work shows as idle waiting for the host in a traced step.",
    "idle_ratio_traced": "idle_ratio as the window measured it, before window_stretch.",
    "sync_drain_idle_share_traced": "sync_drain_idle_share as the window measured it, before window_stretch.",
    "device_memory_bytes": "Total memory of the rank's GPU.",
    "model_state_bytes": "Weights + gradients + optimizer state (parameter_bytes x (2 + the optimizer's states per "
    "parameter: Adam 2, SGD with momentum 1)); absent for an optimizer ranksight does not know.",
    "model_state_share": "model_state_bytes over device_memory_bytes: what a replicated (unsharded) model takes of "
    "each GPU before any activation.",
    "loader_wrapped": "1 when a DataLoader was wrapped with mon.loader() (its settings are known), else 0.",
    "loader_num_workers": "The wrapped DataLoader's num_workers.",
    "loader_pin_memory": "The wrapped DataLoader's pin_memory (1/0).",
    "loader_prefetch_factor": "The wrapped DataLoader's prefetch_factor (absent with no workers).",
    "loader_persistent_workers": "The wrapped DataLoader's persistent_workers (1/0).",
    "loader_batch_size": "The wrapped DataLoader's batch_size.",
    "cpu_count": "CPUs of the rank's host.",
    "cpus_allowed": "CPUs this rank may run on (its affinity mask).",
    "local_world_size": "Ranks on this rank's node.",
    "torch_threads": "torch's intra-op threads in this rank.",
    "cpus_per_rank": "cpus_allowed / local_world_size: the cores each rank of the node may count on.",
    "threads_demanded": "local_world_size x (torch_threads + loader workers): the busy threads the node's ranks "
    "ask for.",
    "oversubscription_ratio": "threads_demanded / cpus_allowed (> 1: threads queue for cores).",
    "host_load_ratio": "1-minute load average over CPUs allowed (sampled; else from the rank's metadata).",
    "process_cpu_cores": "This rank's process CPU seconds per wall second (sampled).",
    "host_cpu_contended": "1 when tasks on this rank's host queued for CPUs while it ran: pressure stall "
    "information says some task waited >= 10 % of the time (host_cpu_pressure_ratio), or, without it, the load "
    "average is at least one per CPU allowed; else 0.",
    "host_bound_share": "Share of the step the host's threads drive: compute + optimizer + data wait on a CPU "
    "rank, the data wait on a GPU rank.",
    "records_dropped_total": "Records the agent dropped (its buffer was full).",
    "agent_errors_total": "Errors inside the agent (it turned the failing part off).",
    "memory_reserved_excess": "This rank's reserved GPU memory over the median across ranks, minus 1.",
    "memory_reserved_spread": "(max - min) / max of reserved GPU memory across ranks.",
    **{name: f"Sample: {doc}" for name, doc in SAMPLE_NAMES.items()},
    **FSDP_FEATURES,  # FSDP2 collectives, units, prefetching, precision (_fsdp_features)
}

#: Strings fix templates may name (never expressions: the rule language has numbers only).
CONTEXT: dict[str, str] = {
    "framework": "plain | lightning | transformers | accelerate | run (how the job was launched/trained).",
    "parallelism": "ddp | fsdp2 | none.",
    "data_source": "loader | marks | framework | unknown: where the data wait comes from.",
    "loader_class": "Class of the wrapped loader.",
    "backend": "Process group backend of DDP (nccl, gloo) or unknown.",
    "transport": "gloo-loopback | gloo-tcp | nvlink | infiniband | unknown: what the all-reduce bandwidth is "
    "judged against.",
    "top_collectives": "The blocking collectives that cost most, e.g. 'all_reduce x2/step (user)'.",
    "other_top": "Where the sampled stack window found the training thread during 'other' time, e.g. "
    "'log_metrics (train.py:88) 61 %'; empty when no window saw any.",
    **FSDP_CONTEXT,
}

CONTEXT_DEFAULTS: dict[str, str] = {
    "framework": "plain",
    "parallelism": "none",
    "data_source": "unknown",
    "loader_class": "",
    "backend": "unknown",
    "transport": "unknown",
    "top_collectives": "",
    "other_top": "no stack window saw it yet",
    **FSDP_CONTEXT_DEFAULTS,
}
"""What a template reads for a context name the run did not provide."""

_COUNTER_SUFFIX = "_total"  # cumulative samples: the latest value, not the median
_CONTENDED_PRESSURE = 0.10  # some task waited for a CPU >= 10 % of the time: a rank's lost time can be that wait


def compute_features(con, metas: list, warmup_steps: int, rows: list[dict], since_ns: int | None) -> dict[int, dict]:
    """Features per rank from a connection with the run's views, the ranks' metadata and their breakdown rows
    (``Run.breakdown``'s, kept by the reading).

    ``since_ns`` keeps only the steps (and samples, compile events) after that time (Unix ns).
    """
    meta_by_rank = {m.rank: m.data for m in metas}
    stats = rank_step_stats(con, warmup_steps, since_ns)
    compile_counts = _compile_counts(con, warmup_steps, since_ns)
    samples, steady = _sample_values(con, warmup_steps, since_ns)
    windows = _traced_windows(con, warmup_steps, since_ns)
    excess = recompile_excess(con, warmup_steps, since_ns)
    ranks = sorted(set(meta_by_rank) | {r["rank"] for r in rows})
    local_sizes = _ranks_per_node(meta_by_rank, rows)
    row_by_rank = {r["rank"]: r for r in reversed(rows)}  # the first row of a rank, as a scan would find it
    feats: dict[int, dict] = {}
    sampled = {r for r, _ in samples}  # a rank without samples keeps FEATURES' None for each sample name
    # Copied per rank, and written into by the ``_*_into`` helpers rather than merged from a dict each: at 10,000
    # ranks building dicts was most of the features' time (cpu_scale_history.md "Scale v6").
    blank = {**dict.fromkeys(FEATURES), "graph_breaks": 0, "recompiles": 0, "recompiles_after_warmup": 0}
    blank["compiled"] = 0  # changed below for a rank with compile records or an OptimizedModule
    for rank in ranks:
        f = blank.copy()
        f["rank"] = rank
        meta = meta_by_rank.get(rank, _NOTHING)
        backend, model_class = _meta_into(f, meta) if meta else (None, None)
        row = row_by_rank.get(rank)
        if row is not None:
            _steps_into(f, row, stats.get(rank, _NOTHING))
        counts = compile_counts.get(rank, _NOTHING)
        if counts or model_class == "OptimizedModule":  # a compiled model without any compile record: zeros
            f["graph_breaks"] = counts.get("graph_break", (0, 0))[0]
            f["recompiles"], f["recompiles_after_warmup"] = counts.get("recompile", (0, 0))
            f["compiled"] = 1
        if rank in sampled:
            f.update({name: samples.get((rank, name)) for name in SAMPLE_NAMES})
        _host_into(f, meta, local_sizes.get(rank))
        if f["recompiles_after_warmup"]:
            f["recompile_excess_share"] = excess.get(rank)
        busy = _untraced_shares(f, windows[rank]) if rank in windows else f["kernel_busy_ratio"]
        if f["gpu_utilization_ratio"] is not None:
            f["gpu_utilization_samples"] = steady.get((rank, "gpu_utilization_ratio"), 0)
        if busy is None and steady and steady.get((rank, "gpu_utilization_ratio"), 0) >= NVML_STEADY_SAMPLES:
            busy = f["gpu_utilization_ratio"]
        if busy is not None:
            f["gpu_busy_ratio"] = busy
        if f["h2d_copy_ratio"] is not None:
            f["h2d_gap_share"] = h2d_gap_share(f)
        if backend == "nccl":
            # NCCL completes its futures when the collective is enqueued: host all-reduce times say nothing
            # (exposed comm comes from the GPU's clock instead, see PHASE_SQL).
            f["allreduce_share"] = f["comm_overlap"] = f["allreduce_bytes_per_s"] = None
        feats[rank] = f
    _cross_rank(con, warmup_steps, since_ns, feats, stats)
    for rank, f in feats.items():
        f.update(transport_model(f, _transport((meta_by_rank.get(rank, {}).get("ddp") or {}).get("backend"), f)))
    fsdp_features(con, metas, feats, warmup_steps, since_ns, lambda backend, f: TRANSPORTS.get(_transport(backend, f)))
    return feats


def compute_context(
    con, metas: list, features: dict[int, dict], warmup_steps: int, since_ns: int | None
) -> Mapping[int, dict]:
    """Context strings per rank (``CONTEXT``): what fix templates are fitted to, beside the numbers. Its
    queries run here; each rank's strings are put together when that rank is first read (``RankContexts``)."""
    ops = collective_ops(con, warmup_steps, since_ns)
    return RankContexts(features, {m.rank: m.data for m in metas}, ops, fsdp_context(metas, features))


class RankContexts(Mapping):
    """rank -> its context strings, each rank's made the first time it is read: a verdict needs only the ranks
    its findings name (cpu_scale_history.md "Scale v6")."""

    def __init__(self, features: dict[int, dict], meta_by_rank: dict, ops: dict, fsdp: dict) -> None:
        self._features, self._meta, self._ops, self._fsdp = features, meta_by_rank, ops, fsdp
        self._made: dict[int, dict] = {}

    def __getitem__(self, rank: int) -> dict:
        ctx = self._made.get(rank)
        if ctx is None:
            ctx = _context_of(self._meta.get(rank, {}), self._features[rank])
            ctx["top_collectives"] = self._ops.get(rank, "")
            ctx.update(self._fsdp.get(rank, {}))
            self._made[rank] = ctx
        return ctx

    def __iter__(self) -> Iterator[int]:
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)


#: What an all-reduce should get from each transport: (bus bandwidth in bytes/s, latency of one small
#: all-reduce between 2 ranks in s); gloo measured here, the others public figures rounded down (the sources:
#: benchmarks/results/diagnosis_history.md, docs/diagnosis.md).
TRANSPORTS: dict[str, tuple[float, float]] = {
    "gloo-loopback": (1.0e9, 250e-6),
    "gloo-tcp": (1.0e9, 500e-6),
    "nvlink": (300e9, 20e-6),
    "pcie": (20e9, 30e-6),
    "infiniband": (20e9, 30e-6),
}


def transport_model(f: dict, transport: str) -> dict:
    """What the gradient all-reduce should cost on this transport, and what it achieved.

    Ring all-reduce sends 2(N-1)/N of the bytes per rank (the bandwidth term); each all-reduce also pays
    a latency that grows with log2(N) (NCCL's trees, gloo's halving-doubling). Bytes that take less time
    on the wire than the latencies do make a latency-bound all-reduce, whatever its exposed share.
    """
    out: dict = {}
    if transport not in TRANSPORTS:
        return out
    bandwidth, latency = TRANSPORTS[transport]
    n = f.get("world_size") or 1
    out["transport_bytes_per_s"], out["transport_latency_s"] = bandwidth, latency * max(1, math.ceil(math.log2(n)))
    grad_bytes, buckets = f.get("grad_bytes_per_step"), f.get("buckets_per_step")
    if n < 2 or not grad_bytes:
        return out
    wire_bytes = 2 * (n - 1) / n * grad_bytes
    out["allreduce_wire_s"] = wire_bytes / bandwidth
    out["allreduce_latency_s"] = (buckets or 1) * out["transport_latency_s"]
    # The all-reduce's own time per step: per-bucket host times where they mean something (not NCCL),
    # else the exposed time of the rank that waited least.
    per_step = None
    if f.get("allreduce_share") and f.get("step_mean_s"):
        per_step = f["allreduce_share"] * f["step_mean_s"]
    elif f.get("comm_floor_s"):
        per_step = f["comm_floor_s"]
    if per_step and per_step > 0:
        out["allreduce_achieved_bytes_per_s"] = wire_bytes / per_step
        out["allreduce_efficiency"] = out["allreduce_achieved_bytes_per_s"] / bandwidth
    return out


def _transport(backend: str | None, f: dict) -> str:
    """The transport a collective of this rank over ``backend`` (DDP's or FSDP2's) runs on (``TRANSPORTS``)."""
    multi_node = (f.get("nodes") or 1) > 1
    if backend == "gloo":
        return "gloo-tcp" if multi_node else "gloo-loopback"
    if backend == "nccl":
        return "infiniband" if multi_node else "nvlink"
    return "unknown"


def _context_of(meta: dict, f: dict) -> dict:
    ddp = meta.get("ddp") or {}
    backend = ddp.get("backend") or "unknown"
    framework = meta.get("framework") or "plain"
    parallelism = meta.get("parallelism") or ("ddp" if ddp else "none")
    data_source = meta.get("data_source") or ("loader" if meta.get("loader") else "unknown")
    transport = _transport(backend, f)
    loader = meta.get("loader") or {}
    window = meta.get("host_other_top") or {}
    places = window.get("top") if isinstance(window, dict) else None
    other_top = ", ".join(
        f"{p.get('where')} {float(p.get('share') or 0):.0%}" for p in (places or [])[:3] if isinstance(p, dict)
    )
    return {
        "other_top": other_top or CONTEXT_DEFAULTS["other_top"],
        "framework": str(framework),
        "parallelism": str(parallelism),
        "data_source": str(data_source),
        "loader_class": str(loader.get("class") or ""),
        "backend": str(backend),
        "transport": transport,
    }


def _ranks_per_node(meta_by_rank: dict, rows: list[dict]) -> dict[int, int]:
    """Ranks sharing each rank's node, counted from the records (LOCAL_WORLD_SIZE may be unset)."""
    node_of = {r: m.get("node") for r, m in meta_by_rank.items() if m.get("node")}
    node_of.update({r["rank"]: r["node"] for r in rows if r.get("node")})
    count = Counter(node_of.values())
    return {rank: count[node] for rank, node in node_of.items()}


def _compile_counts(con, warmup_steps: int, since_ns: int | None) -> dict[int, dict]:
    where = f"WHERE time_ns > {int(since_ns)}" if since_ns is not None else ""
    sql = f"""
        SELECT rank, kind, sum(count) AS total, coalesce(sum(count) FILTER (WHERE step >= ?), 0) AS late
        FROM compile {where} GROUP BY rank, kind
    """
    out: dict[int, dict] = {}
    for rank, kind, total, late in query(con, sql, [warmup_steps])[1]:
        out.setdefault(rank, {})[kind] = (int(total), int(late))
    return out


def _sample_values(
    con, warmup_steps: int, since_ns: int | None
) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], int]]:
    """(value per (rank, sample name), how many samples of it came after warm-up).

    The value is the median after warm-up when there is anything there, else of everything (a short or
    young run still says something); a counter's latest value."""
    where = f"WHERE time_ns > {int(since_ns)}" if since_ns is not None else ""
    # NVML's utilization after a rank's last step is the job's teardown, not its training: its samples count
    # only up to the rank's last step (benchmarks/results/diagnosis_history.md). Without NVML samples the steps
    # are not read for their last step.
    nvml = query(con, "SELECT count(*) FROM samples WHERE name = ?", [GPU_UTILIZATION_SAMPLE])[1][0][0]
    source = "samples"
    if nvml:
        source = f"""(
            WITH last AS (SELECT rank, max(time_ns) AS end_ns FROM steps GROUP BY rank)
            SELECT samples.* FROM samples LEFT JOIN last USING (rank)
            WHERE samples.name <> '{GPU_UTILIZATION_SAMPLE}' OR last.end_ns IS NULL
               OR samples.time_ns <= last.end_ns + {NVML_PERIOD_NS})"""
    sql = f"""
        SELECT rank, name,
               coalesce(median(value) FILTER (WHERE step >= ?), median(value)) AS typical,
               arg_max(value, time_ns) AS latest,
               count(value) FILTER (WHERE step >= ?) AS steady
        FROM {source} {where} GROUP BY rank, name
    """
    values, steady = {}, {}
    for rank, name, typical, latest, n in query(con, sql, [warmup_steps, warmup_steps])[1]:
        values[(rank, name)] = float(latest if name.endswith(_COUNTER_SUFFIX) else typical)
        steady[(rank, name)] = int(n or 0)
    return values, steady


_WINDOW_SHARES = (
    "kernel_busy_ratio",
    "idle_host_wait_ratio",
    "idle_ratio",
    "kernel_seconds_per_step",
    "sync_drain_idle_share",
)


def _traced_windows(con, warmup_steps: int, since_ns: int | None) -> dict[int, list[dict]]:
    """Per rank, its windows after warm-up (all of them if none came after): the window's shares and the
    mean ``step_s`` of the steps it traced (its sample's step and the ``trace_window_steps`` after it).
    Only those steps' rows are read."""
    where = f"AND time_ns > {int(since_ns)}" if since_ns is not None else ""
    names = (*_WINDOW_SHARES, "trace_window_steps")
    pivot = ", ".join(f"max(value) FILTER (WHERE name = '{n}') AS {n}" for n in names)
    cols, rows = query(
        con,
        f"SELECT rank, step, {pivot} FROM samples WHERE list_contains(?, name) {where} GROUP BY rank, step",
        [list(names)],
    )
    windows = [dict(zip(cols, row)) for row in rows]
    windows = [w for w in windows if w["kernel_busy_ratio"] is not None and (w["trace_window_steps"] or 0) >= 1]
    if not windows:
        return {}
    traced = {(w["rank"], w["step"] + k) for w in windows for k in range(int(w["trace_window_steps"]))}
    step_s = {
        (r, s): v
        for r, s, v in query(
            con,
            f"SELECT rank, step, avg(step_s) FROM {steps_source(since_ns)} "
            "WHERE step BETWEEN ? AND ? AND list_contains(?, rank) GROUP BY rank, step",
            [min(s for _, s in traced), max(s for _, s in traced), sorted({r for r, _ in traced})],
        )[1]
        if v is not None and (r, s) in traced
    }
    per_rank: dict[int, list[dict]] = {}
    for w in windows:
        durations = [
            step_s[key] for k in range(int(w["trace_window_steps"])) if (key := (w["rank"], w["step"] + k)) in step_s
        ]
        if durations:
            per_rank.setdefault(w["rank"], []).append({**w, "traced_step_s": sum(durations) / len(durations)})
    return {r: [w for w in ws if w["step"] >= warmup_steps] or ws for r, ws in per_rank.items()}


def _untraced_shares(f: dict, windows: list[dict] | None):
    """The window's GPU shares as an untraced step would show them, into ``f``; returns the busy share.

    The traced steps' host work includes the profiler's, so their span is longer than a typical step's
    while the kernels they ran are not: a window's kernel time over the median step is what an untraced
    step keeps the GPU busy (at most 1), and the idle it saw shrinks by the stretch (the stretch itself is
    the profiler's host time, not the job's). Each window is rescaled by its own stretch, then the median
    over windows is taken. Without step rows for the windows the shares stay as the windows measured them."""
    busy = f["kernel_busy_ratio"]
    median = f.get("step_median_s")
    if busy is None or not windows or not median:
        return busy
    stretch = [w["traced_step_s"] / median for w in windows]
    f["window_stretch"] = statistics.median(stretch)
    # The GPU's own kernel seconds per traced step where the window counted them; else the busy share of
    # the host's traced step time, which undercounts when the host ran ahead of a busy GPU during the window.
    f["window_kernel_s_per_step"] = statistics.median(
        w["kernel_seconds_per_step"]
        if w.get("kernel_seconds_per_step") is not None
        else w["kernel_busy_ratio"] * w["traced_step_s"]
        for w in windows
    )
    for name in ("idle_host_wait_ratio", "idle_ratio"):
        values = [(w[name], s) for w, s in zip(windows, stretch) if w[name] is not None]
        if values and f.get(name) is not None:
            f[name + "_traced"] = f[name]
            f[name] = statistics.median(max(0.0, 1 - (1 - v) * max(1.0, s)) for v, s in values)
    # The idle a sync drained keeps its part of the window's idle: the profiler's host time lengthens every
    # gap the host must fill, the drained ones with the rest.
    drained = [
        (w["sync_drain_idle_share"], w["idle_ratio"], s)
        for w, s in zip(windows, stretch)
        if w.get("sync_drain_idle_share") is not None and w.get("idle_ratio")
    ]
    if drained and f.get("sync_drain_idle_share") is not None:
        f["sync_drain_idle_share_traced"] = f["sync_drain_idle_share"]
        f["sync_drain_idle_share"] = statistics.median(
            min(1.0, d / idle) * max(0.0, 1 - (1 - idle) * max(1.0, s)) for d, idle, s in drained
        )
    # The window's own busy share is a floor: the profiler's host work only adds idle to the traced span.
    return max(busy, min(1.0, f["window_kernel_s_per_step"] / median))


NVML_PERIOD_NS = 1_000_000_000
"""An NVML row stands for the second before its time: the one after the last step's end still saw it."""

NVML_STEADY_SAMPLES = 5
"""NVML utilization samples after warm-up before ``gpu_busy_ratio`` falls back to them (without a sampled
kernel window). Each averages up to a second, so a run's first seconds read start-up
(benchmarks/results/diagnosis_history.md)."""


def h2d_gap_share(f: dict):
    """Copies the sampled window saw beyond the step's own copy span (``h2d_copy_ratio - h2d_share``, at
    least 0): copies issued before ``mon.step()``, which run in the gap before the step that a GPU rank's
    data wait is judged against. None without a window or a model on the GPU."""
    if f.get("h2d_copy_ratio") is None or f.get("model_on_gpu") != 1:
        return None
    return max(0.0, f["h2d_copy_ratio"] - (f.get("h2d_share") or 0.0))


def _flag(value):
    """1/0 for a recorded boolean, None when it was not recorded."""
    return None if value is None else int(bool(value))


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


_NOTHING: dict = {}
"""A rank's absent record (metadata, stats, compile counts): read, never written."""


def _meta_into(f: dict, meta: dict) -> tuple[str | None, str | None]:
    """The rank file's figures into ``f``: model, GPU, optimizer, DDP, loader; returns (DDP's backend, the model's
    class), which decide features beyond these. A section the rank file lacks leaves its features None."""
    get = meta.get
    f["world_size"] = get("world_size")
    counters = get("counters")
    if counters:
        f["records_dropped_total"] = counters.get("records_dropped_total")
        f["agent_errors_total"] = counters.get("agent_errors_total")
    model = get("model") or _NOTHING
    if model:
        f["parameter_bytes"] = model.get("parameter_bytes")
        devices = model.get("devices") or ()
        f["model_on_gpu"] = int(any(str(d).startswith("cuda") for d in devices))
    gpu_device = get("gpu_device")
    if gpu_device:
        f["device_memory_bytes"] = gpu_device.get("total_memory_bytes")
    optimizer = get("optimizer")
    states = optimizer.get("states_per_param") if optimizer else None
    if isinstance(states, int) and isinstance(f["parameter_bytes"], (int, float)):
        f["model_state_bytes"] = f["parameter_bytes"] * (2 + states)
        if f["device_memory_bytes"]:
            f["model_state_share"] = f["model_state_bytes"] / f["device_memory_bytes"]
    ddp = get("ddp")
    f["ddp"] = int(bool(ddp))
    f["fsdp"] = int(get("parallelism") == "fsdp2")
    if ddp:
        f["find_unused_parameters"] = int(bool(ddp.get("find_unused_parameters")))
        f["static_graph"] = _flag(ddp.get("static_graph"))
        f["gradient_as_bucket_view"] = _flag(ddp.get("gradient_as_bucket_view"))
        f["bucket_cap_bytes"] = _number(ddp.get("bucket_cap_bytes"))
        if f["bucket_cap_bytes"]:
            f["bucket_cap_mb"] = f["bucket_cap_bytes"] / 2**20
        backend = ddp.get("backend")
        f["ddp_backend_gloo"] = int(backend == "gloo")
    else:
        backend = None
    logging_data = get("ddp_logging")
    if logging_data:
        iteration = logging_data.get("iteration")
        f["ddp_stats_iteration"] = iteration if isinstance(iteration, (int, float)) else None
        unused = logging_data.get("unused_parameter_size")
        # DDP only fills this once it has sampled a runtime iteration (iteration > 0).
        if isinstance(unused, (int, float)) and iteration:
            f["unused_parameter_size"] = unused
    loader = get("loader")
    f["loader_wrapped"] = int(bool(loader))
    if loader:
        f["loader_num_workers"] = _number(loader.get("num_workers"))
        f["loader_pin_memory"] = _flag(loader.get("pin_memory"))
        f["loader_prefetch_factor"] = _number(loader.get("prefetch_factor"))
        f["loader_persistent_workers"] = _flag(loader.get("persistent_workers"))
        f["loader_batch_size"] = _number(loader.get("batch_size"))
    return backend, model.get("class")


def _host_into(f: dict, meta: dict, ranks_on_node: int | None) -> None:
    """CPU facts into ``f``: cores, threads, load. The oversubscription check compares the threads the node's
    ranks ask for (torch threads + loader workers, per rank) with the cores they may use."""
    host = meta.get("host") or _NOTHING
    cpu_count = _number(host.get("cpu_count"))
    allowed = _number(host.get("cpus_allowed")) or cpu_count
    threads = _number(host.get("torch_threads"))
    local = _number(host.get("local_world_size")) or ranks_on_node
    f["cpu_count"], f["cpus_allowed"], f["torch_threads"], f["local_world_size"] = cpu_count, allowed, threads, local
    load = _number(host.get("load_avg_1m"))
    if f["host_load_ratio"] is None and load is not None and allowed:
        f["host_load_ratio"] = load / allowed
    pressure = f["host_cpu_pressure_ratio"]
    if pressure is not None:
        f["host_cpu_contended"] = int(pressure >= _CONTENDED_PRESSURE)
    elif f["host_load_ratio"] is not None:
        f["host_cpu_contended"] = int(f["host_load_ratio"] >= 1.0)
    if allowed and local:
        f["cpus_per_rank"] = allowed / local
        if threads is not None:
            workers = f["loader_num_workers"] or 0
            f["threads_demanded"] = local * (threads + workers)
            f["oversubscription_ratio"] = f["threads_demanded"] / allowed
    wait = f["data_wait_share"] or 0.0
    if f["compute_share"] is not None:
        on_gpu = f["model_on_gpu"] == 1
        f["host_bound_share"] = wait if on_gpu else wait + f["compute_share"] + (f["optimizer_share"] or 0.0)


_ROW_FEATURES = tuple(k for k in BREAKDOWN_COLUMNS if k not in ("rank", "node"))
"""The features a rank's breakdown row gives as they are: its keys but the rank's identity."""
_row_values = operator.itemgetter(*_ROW_FEATURES)
_STATS_FEATURES = (
    ("run_time_s", "run_time_s"),
    ("grad_comm_share", "grad_comm_share"),
    ("comm_blocked_share", "blocked_share"),
    ("data_wait_share_noise", "data_noise"),
    ("collectives_per_step", "collectives_per_step"),
    ("collective_bytes_per_step", "collective_bytes_per_step"),
)
"""The features a rank's step statistics give as they are: (feature, the statistics' key)."""


def _steps_into(f: dict, row: dict, stats: dict) -> None:
    """The rank's breakdown row and step statistics into ``f``; the row's figures taken in one call (10,000
    ranks: a lookup and a store each took twice as long)."""
    f.update(zip(_ROW_FEATURES, _row_values(row)))
    f["data_measured"] = int(f["data_wait_share"] is not None)
    get = stats.get
    for name, key in _STATS_FEATURES:
        f[name] = get(key)
    grad = f["grad_comm_share"]
    if f["compute_share"] and grad is not None:
        f["comm_to_compute"] = grad / f["compute_share"]
    allreduce_sum, exposed_sum = stats.get("allreduce_sum"), stats.get("exposed_sum")
    if allreduce_sum and allreduce_sum > 0:
        f["comm_overlap"] = max(0.0, 1.0 - (exposed_sum or 0.0) / allreduce_sum)
        if stats.get("bytes_sum"):
            f["allreduce_bytes_per_s"] = stats["bytes_sum"] / allreduce_sum
    f["buckets_per_step"] = stats.get("buckets_per_step")
    f["grad_bytes_per_step"] = stats.get("grad_bytes_per_step")
    if stats.get("world_size"):
        f["world_size"] = int(stats["world_size"])


def _cross_rank(con, warmup_steps: int, since_ns, feats: dict[int, dict], stats: dict[int, dict]) -> None:
    """Figures that compare ranks: who waits for whom at collectives, compute scores, memory spread."""
    reporting = [r for r, f in feats.items() if f["steps"]]
    nodes = {node for r in reporting if (node := stats.get(r, _NOTHING).get("node"))}
    measured = sum(1 for r in reporting if feats[r]["data_measured"])
    shared = {"ranks_reporting": len(reporting), "nodes": len(nodes) or None, "ranks_data_measured": measured}
    shared.update(_compute_scores(con, warmup_steps, since_ns, feats, stats, reporting))
    shared.update(_wait_figures(con, warmup_steps, since_ns, feats, reporting))
    reserved = {r: f["memory_reserved_bytes"] for r, f in feats.items() if f.get("memory_reserved_bytes")}
    if len(reserved) >= 2:
        median, high = statistics.median(reserved.values()), max(reserved.values())
        shared["memory_reserved_spread"] = (high - min(reserved.values())) / high
        for r, value in reserved.items():
            feats[r]["memory_reserved_excess"] = value / median - 1.0
    # Job-level figures into every rank's dict (the rules stay per rank): one pass over the ranks, not one
    # per figure (10,000 ranks).
    for f in feats.values():
        f.update(shared)


def _compute_scores(con, warmup_steps, since_ns, feats, stats, reporting) -> dict:
    """Each reporting rank's compute against the others' (into its dict); the job-level figures returned."""
    # GPU compute when every reporting rank has it (host time includes launch queueing), else host compute.
    use_gpu = bool(reporting) and all(stats.get(r, {}).get("gpu_compute_median_s") for r in reporting)
    compute = {}
    for r in reporting:
        value = stats[r]["gpu_compute_median_s"] if use_gpu else feats[r]["compute_median_s"]
        if value and value > 0:
            compute[r] = value
    if use_gpu:
        for r, value in compute.items():
            feats[r]["compute_median_s"] = value
    if len(compute) >= 2:
        for r, share in slowest_shares(con, warmup_steps, since_ns, sorted(compute), use_gpu).items():
            feats[r]["slowest_step_share"] = share
        fastest, median = min(compute.values()), statistics.median(compute.values())
        slowest = max(compute, key=compute.get)
        for r, value in compute.items():
            feats[r]["straggler_score"] = fastest / value
            feats[r]["compute_vs_median"] = value / median
        return {"slowest_rank": slowest}
    return {}


def _wait_figures(con, warmup_steps, since_ns, feats, reporting) -> dict:
    """Who waits for whom: per step, the rank that waits least at collectives is the one the others wait
    for; what the all-reduce costs by itself is that rank's wait (see ``wait_asymmetry``). Each rank's
    figures into its dict; the job-level ones returned."""
    found = wait_asymmetry(con, warmup_steps, since_ns, sorted(reporting)) if reporting else None
    if found is None:
        return {}
    shared, per_rank = found
    compute_shares = [feats[r]["compute_share"] for r in reporting if feats[r]["compute_share"]]
    if compute_shares and shared["comm_floor_share"] is not None:
        shared["comm_floor_to_compute"] = shared["comm_floor_share"] / statistics.median(compute_shares)
    if len(reporting) >= 2:
        for r in reporting:  # a rank with no late step: nothing its lateness costs (work_explained stays unknown)
            feats[r].update(per_rank.get(r, _NEVER_LATE))
        shared["least_wait_top_share"] = max(feats[r]["least_wait_step_share"] for r in reporting)
    return shared


_NEVER_LATE = dict.fromkeys(("least_wait_step_share", "straggler_cost_share", "straggler_cost_share_noise"), 0.0)
