"""The record schema shared by the agent, the collectors, the rules and the dashboard.

This module imports without torch (and without pyarrow until an Arrow schema is asked for), so the
machine that serves the dashboard needs neither. Each record kind is one table in the store and one
folder of Parquet spool segments in a run directory. Columns are typed; every row carries the
identity columns, so a query never has to join to find out which rank a number came from.

Columns that only a GPU can fill are nullable and left null (absent, not zero) on a CPU job.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 6
"""2 added ``steps.gpu_gap_s``, ``gpu_comm_exposed_s``, ``gpu_optimizer_s``; 3 added ``steps.comm_blocked_s``,
``collectives``, ``collective_bytes``, ``gpu_comm_blocked_s`` and the ``collectives`` kind, and made a NULL
``data_wait_s`` mean "not measured"; 4 added ``steps.cpu_s``; 5 added ``steps.gpu_data_idle_s`` and
``data_wait_in_step_s``; 6 added ``steps.gpu_sampled``. Readers give NULL for a column an older segment or
store lacks."""

#: Folder names inside a run directory.
RANKS_DIR = "ranks"  # one JSON file per rank: identity, status, heartbeat, configuration
SPOOL_SUFFIX = ".parquet"
TMP_PREFIX = ".tmp-"  # segments are written under this name, then renamed: globs never see them


@dataclass(frozen=True)
class Column:
    """One typed column of a record kind."""

    name: str
    type: str  # one of: string, int64, int32, float64, bool
    doc: str
    nullable: bool = True


IDENTITY: tuple[Column, ...] = (
    Column("job", "string", "Job name given to ranksight.init (or RANKSIGHT_JOB).", False),
    Column("run", "string", "Run id, shared by every rank of one launch.", False),
    Column("node", "string", "Node name (hostname unless RANKSIGHT_NODE is set).", False),
    Column("rank", "int32", "Global rank.", False),
    Column("local_rank", "int32", "Rank within its node.", False),
    Column("world_size", "int32", "Number of ranks in the job.", False),
    Column("pid", "int32", "Process id of the rank.", False),
)

STEPS: tuple[Column, ...] = IDENTITY + (
    Column("step", "int64", "Step index on this rank, from 0.", False),
    Column("time_ns", "int64", "Wall-clock time (Unix ns) at the end of the step.", False),
    Column("step_s", "float64", "Wall time of the step: data wait plus the step body.", False),
    Column(
        "data_wait_s",
        "float64",
        "Time blocked in the wrapped loader for this step's batch plus time inside mon.data() blocks; "
        "NULL when the rank measures no input (no wrapped loader, no mon.data()).",
    ),
    Column("h2d_s", "float64", "Host-to-device copy time (GPU only)."),
    Column("compute_s", "float64", "Forward + backward until the last gradient bucket was ready."),
    Column("comm_exposed_s", "float64", "Time after backward compute ended spent waiting on all-reduce."),
    Column("allreduce_s", "float64", "Sum of per-bucket all-reduce times (overlapped or not)."),
    Column("optimizer_s", "float64", "Time in optimizer.step()."),
    Column("other_s", "float64", "What the named phases do not cover (loss, zero_grad, logging, ...)."),
    Column("buckets", "int32", "Gradient buckets all-reduced in this step."),
    Column("bucket_bytes", "int64", "Bytes all-reduced in this step."),
    # GPU-only, filled by the GPU signals (CUDA events), null on CPU jobs.
    Column("gpu_compute_s", "float64", "Forward + backward time on the GPU (CUDA events)."),
    Column("gpu_step_s", "float64", "Step time on the GPU stream (CUDA events)."),
    Column(
        "gpu_gap_s",
        "float64",
        "GPU stream idle before the step: previous step's end to this step's start (CUDA events); "
        "about 0 when the host had queued the step ahead.",
    ),
    Column(
        "gpu_comm_exposed_s",
        "float64",
        "Last gradient bucket ready to its all-reduce done, on the GPU (CUDA events): comm backward did not hide.",
    ),
    Column("gpu_optimizer_s", "float64", "optimizer.step() start to step end, on the GPU (CUDA events)."),
    Column(
        "comm_blocked_s",
        "float64",
        "Host time the step was held in torch.distributed collectives and barriers outside DDP's gradient buckets "
        "(metric all_reduce, barrier, object collectives, FSDP all-gather / reduce-scatter); NULL when not timed.",
    ),
    Column("collectives", "int32", "Collectives counted in comm_blocked_s."),
    Column("collective_bytes", "int64", "Tensor bytes of those collectives."),
    Column(
        "gpu_comm_blocked_s",
        "float64",
        "Time those collectives held the step's GPU stream (CUDA events around each call; GPU only).",
    ),
    Column(
        "data_wait_in_step_s",
        "float64",
        "The part of data_wait_s spent inside the step (mon.data() blocks after the step opened, e.g. a prefetch "
        "between forward and backward); the rest came before it. NULL when the data wait is not measured.",
    ),
    Column(
        "gpu_data_idle_s",
        "float64",
        "GPU stream time inside the step's mon.data() blocks (CUDA events around each): what an in-step fetch "
        "(a prefetch between forward and backward) cost the GPU, its idle plus any GPU work the block queued "
        "(keep .to(device) after the block). GPU only; NULL without such blocks.",
    ),
    Column(
        "cpu_s",
        "float64",
        "CPU time the training thread used during the step (its thread CPU clock). Against step_s it tells a "
        "rank doing more work from one waiting for a core on a busy host.",
    ),
    Column(
        "gpu_sampled",
        "bool",
        "Whether CUDA events timed this step: false on a GPU rank's step left out of event sampling (its GPU "
        "columns NULL, its host columns kept; readers take phase shares from the sampled steps), NULL on a "
        "CPU rank or with GPU events off.",
    ),
)

BUCKETS: tuple[Column, ...] = IDENTITY + (
    Column("step", "int64", "Step the bucket belongs to.", False),
    Column("bucket", "int32", "DDP bucket index (0 is reduced first: it holds the last layers).", False),
    Column("bytes", "int64", "Size of the bucket's flat gradient buffer."),
    Column("ready_s", "float64", "When the bucket became ready, seconds after the step began."),
    Column("allreduce_s", "float64", "From bucket ready to its all-reduce future completing."),
    Column("is_last", "bool", "Whether DDP flagged it as the last bucket of the step."),
)

COLLECTIVES: tuple[Column, ...] = IDENTITY + (
    Column("step", "int64", "Step the collectives were issued in (the next step's index between steps).", False),
    Column(
        "op",
        "string",
        "all_reduce, barrier, all_gather_single, reduce_scatter_tensor, broadcast, ...; FSDP2 units' own: "
        "all_gather_forward, all_gather_backward, reduce_scatter",
        False,
    ),
    Column(
        "origin",
        "string",
        "Who issued it: ddp (gradient buckets), fsdp, framework (Lightning, transformers, accelerate), "
        "torch (other torch internals) or user.",
        False,
    ),
    Column("process_group", "string", "Process group: 'default' or '<description>/<size>'.", False),
    Column("count", "int32", "Calls summed in this row.", False),
    Column("bytes", "int64", "Tensor bytes sent or reduced (0 for barriers and object collectives)."),
    Column("blocked_s", "float64", "Time the calling thread was held (an async op: issue plus its wait())."),
    Column("busy_s", "float64", "Time the collectives were in flight, overlapped or not (DDP buckets, host clock)."),
    Column("gpu_s", "float64", "Time they held the issuing GPU stream (CUDA events)."),
)

COMPILE: tuple[Column, ...] = IDENTITY + (
    Column("time_ns", "int64", "Wall-clock time (Unix ns) the event was noticed.", False),
    Column("step", "int64", "Latest step when the event was noticed."),
    Column("kind", "string", "graph_break or recompile.", False),
    Column("reason", "string", "First line of dynamo's reason."),
    Column("detail", "string", "Dynamo's full reason text."),
    Column("count", "int64", "How many new occurrences since the last poll.", False),
)

SAMPLES: tuple[Column, ...] = IDENTITY + (
    Column("time_ns", "int64", "Wall-clock time (Unix ns) of the sample.", False),
    Column("step", "int64", "Latest step when sampled."),
    Column("name", "string", "Signal name, e.g. gpu_utilization_ratio, memory_reserved_bytes.", False),
    Column("value", "float64", "The sampled value, in the base unit its name ends with.", False),
)

EVENTS: tuple[Column, ...] = IDENTITY + (
    Column("time_ns", "int64", "Wall-clock time (Unix ns).", False),
    Column("level", "string", "info, warning or error.", False),
    Column("component", "string", "Part of the agent that reported it.", False),
    Column("message", "string", "One line.", False),
)

KINDS: dict[str, tuple[Column, ...]] = {
    "steps": STEPS,
    "buckets": BUCKETS,
    "collectives": COLLECTIVES,
    "compile": COMPILE,
    "samples": SAMPLES,
    "events": EVENTS,
}

_ARROW_TYPES = {"string": "string", "int64": "int64", "int32": "int32", "float64": "float64", "bool": "bool_"}
DUCKDB_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "int32": "INTEGER", "float64": "DOUBLE", "bool": "BOOLEAN"}


def column_names(kind: str) -> list[str]:
    """Return the column names of a record kind, in order."""
    return [c.name for c in KINDS[kind]]


def arrow_schema(kind: str):
    """Build the pyarrow schema of a record kind (pyarrow is imported only here)."""
    import pyarrow as pa

    return pa.schema([pa.field(c.name, getattr(pa, _ARROW_TYPES[c.type])(), nullable=c.nullable) for c in KINDS[kind]])


def duckdb_columns(kind: str) -> str:
    """Return a DuckDB column list (``name TYPE, ...``) for a record kind."""
    return ", ".join(f"{c.name} {DUCKDB_TYPES[c.type]}" for c in KINDS[kind])


#: Names used in the ``samples`` kind (``name`` column), with their meaning. The agent's samplers
#: emit them; the rules, the dashboard and the Prometheus exporter read them. Units are in the name.
SAMPLE_NAMES: dict[str, str] = {
    # NVML, sampled about once a second on the agent thread.
    "gpu_utilization_ratio": "NVML utilization: share of time some kernel was running (coarse).",
    "gpu_memory_used_bytes": "NVML device memory in use (all processes).",
    # Sampled kernel-level window (torch.profiler over 1-2 steps, reduced off the training thread).
    "kernel_busy_ratio": "Union of all GPU kernel intervals over the window span.",
    "impossible_gpu_records": "GPU records in the window that start before the host call that launched them (a "
    "profiler clock fault), left out of every other window figure; absent when there are none.",
    "kernel_seconds_per_step": "Union of the kernels the window's steps launched, in seconds per traced step.",
    "d2h_copies_per_step": "Device-to-host copies the window's steps launched, per step (a loss read is one).",
    "compute_kernel_ratio": "Union of compute kernels over the window span.",
    "comm_kernel_ratio": "Union of communication (nccl*) kernels over the window span.",
    "memcpy_ratio": "Union of memory copies over the window span.",
    "idle_ratio": "Span minus the union of all GPU activity, over the span.",
    "idle_host_wait_ratio": "Idle time where the CPU launched late (host-bound), over the span.",
    "comm_overlap_ratio": "|union(compute) & union(comm)| / |union(comm)| (Holistic Trace Analysis).",
    "h2d_copy_ratio": "Host-to-device copies over the window span.",
    "h2d_pageable_ratio": "Share of host-to-device copy time that came from pageable memory (0-1).",
    "cpu_op_ratio": "Aten ops on CPU tensors inside the traced steps (DataLoader next() left out) while the model is "
    "on the GPU, over the steps' time.",
    "loader_cpu_op_ratio": "Aten ops inside the DataLoader's next() in the traced steps (collate in the main process), "
    "over the steps' time: input work, not a misplaced layer.",
    "host_syncs_per_step": "cudaStreamSynchronize / cudaDeviceSynchronize / synchronous copies per step.",
    "compiled_syncs_per_step": "Those blocking calls made inside a torch.compile'd frame's run (its 'Torch-Compiled "
    "Region'): the eager code at a graph break, since a compiled graph does not sync.",
    "host_sync_wait_share": "Host time inside those blocking calls, over the traced steps' time: what the CPU "
    "waited for the GPU to drain.",
    "copy_syncs_per_step": "Those blocking calls that end a blocking copy of host memory to the GPU "
    "(x.to(device) without non_blocking): the op around the sync also copied host memory in.",
    "sync_drain_idle_share": "GPU idle in the gap each blocking call returned into, where the op around it began "
    "with the GPU busy (from the last GPU activity before the return to the next one), over the window span: the "
    "queue each such sync drained.",
    "sync_op_share": "Host time inside the ops that made those blocking calls (.item(), nonzero, .cpu(): the wait, "
    "the copy back and the op's own work; each op once), over the traced steps' time.",
    "pageable_copy_host_share": "Host time inside the runtime calls that copied pageable host memory to the GPU "
    "(staging and waiting for the copy), over the traced steps' time.",
    "alloc_calls_per_step": "cudaMalloc / cudaFree (and the driver's cuMem* mapping calls) per traced step: the "
    "caching allocator going to the device after warm-up.",
    "alloc_call_share": "Host time inside those allocator calls (cudaFree waits for the device), over the traced "
    "steps' time.",
    "kernels_per_step": "GPU kernels launched per step.",
    "short_kernel_ratio": "Share of kernels whose GPU time is shorter than their CPU launch time.",
    "launch_delay_seconds": "Median delay between a kernel's launch call and its start on the GPU.",
    "trace_window_steps": "Steps covered by the sampled window that produced the ratios above.",
    "trace_window_stop_seconds": "The training thread's time inside the profiler's stop at the window's end.",
    "trace_window_cost_seconds": "What the window cost the training thread: its steps' time less as many "
    "untraced steps (at least the profiler calls' own time); with trace_window_reduce_seconds, spaces the "
    "next window under the gpu option trace_budget.",
    "trace_window_reduce_seconds": "The agent thread's CPU time reading and reducing the window, holding the "
    "GIL most of it: a training thread that releases the GIL for every op loses about as much.",
    # CUDA caching allocator (torch.cuda.memory_stats / memory_snapshot), sampled.
    "memory_allocated_bytes": "Bytes held by live tensors.",
    "memory_reserved_bytes": "Bytes reserved by the caching allocator.",
    "memory_peak_bytes": "Peak allocated bytes since start.",
    "memory_inactive_split_bytes": "Bytes in inactive split blocks (fragmentation inside segments).",
    "memory_free_blocks": "Number of free blocks in reserved segments.",
    "memory_alloc_retries_total": "cudaMalloc retries after freeing the cache (num_alloc_retries).",
    "memory_ooms_total": "Out-of-memory errors seen by the allocator.",
    "memory_device_allocs_total": "Device allocations (cudaMalloc or a segment mapped) by the caching allocator "
    "since start (num_device_alloc).",
    "memory_device_frees_total": "Device frees (cudaFree or a segment unmapped) since start (num_device_free): "
    "growing after warm-up, the cache gives memory back and takes it again.",
    "memory_fragmentation_ratio": "1 - largest free block / total free bytes in reserved segments.",
    "memory_headroom_ratio": "Free device memory over total device memory.",
    # The host, sampled at each flush on every rank (CPU and GPU jobs).
    "process_cpu_cores": "CPU seconds this rank's process used per wall second: the cores it keeps busy.",
    "host_load_ratio": "1-minute load average over the CPUs this process may run on.",
    "host_cpu_pressure_ratio": "Share of wall time some task on the host was runnable but waiting for a CPU "
    "(Linux pressure stall information, /proc/pressure/cpu 'some'; absent without it).",
}
