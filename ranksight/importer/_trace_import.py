"""Turn ``torch.profiler`` (Kineto) traces into a ranksight run, so ``diagnose``, ``summary``,
``compare`` and the dashboard read them like a run the agent recorded.

Why a streaming parser and a spill file: a trace is one JSON object whose ``traceEvents`` list can
hold millions of events (1 GB for a few seconds of a busy GPU). ``ijson``'s C backend yields one event
at a time (300 MB read in 2.8 s with 13 MB resident, against 1.4-1.9 GB for ``json`` or ``orjson``
loading it whole; benchmarks/import_trace.py). Each event is cut to seven columns and appended to a
temporary DuckDB table, which sorts them by step within its memory limit (spilling to disk past it).
The steps are then reduced one at a time (``_trace_reduce_steps``), so memory grows with the largest
step, not with the file. Holistic Trace Analysis loads a whole trace into pandas instead.

What a trace cannot tell is said in one line each (``ImportResult.problems``) and the rest imported:
a file with no ``ProfilerStep#N`` marks (profiled without a schedule / ``prof.step()``), a truncated or
damaged file (the events before the damage), ranks of the job with no trace.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import secrets
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Callable, Optional

from ranksight._version import __version__
from ranksight.collectors import RunDirError
from ranksight.format.schema import (
    KINDS,
    RANKS_DIR,
    SAMPLE_NAMES,
    SCHEMA_VERSION,
    SPOOL_SUFFIX,
    TMP_PREFIX,
    arrow_schema,
)
from ranksight.trace_reduce import ACTIVITY_KIND

from ._trace_reduce_steps import GPU_KINDS, StepSpan, TraceEvent, reduce_step

TRACE_SUFFIXES = (".json", ".json.gz")
STEP_MARK = "ProfilerStep#"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_BATCH_EVENTS = 100_000
_ROWS_PER_SEGMENT = 20_000
SPILL_MEMORY_LIMIT = "512MB"
"""DuckDB's memory limit while it sorts the events by step; past it, it spills to the temporary folder."""

Progress = Callable[[int, int], None]
"""Called with (bytes read so far, total bytes) while the traces are read."""


@dataclass
class ImportResult:
    """What an import wrote and what the traces could not tell."""

    run_path: str
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> steps imported
    world_size: int = 0
    files: int = 0
    events: int = 0
    gpu: bool = False
    problems: list[str] = field(default_factory=list)  # one line each


@dataclass
class _File:
    path: str
    index: int
    rank: Optional[int] = None
    world_size: Optional[int] = None
    backend: Optional[str] = None
    node: Optional[str] = None
    base_ns: Optional[int] = None
    device: Optional[dict] = None
    pid: int = 0
    events: int = 0
    damage: Optional[str] = None
    not_trace: Optional[str] = None  # why the file is no trace at all: it is left out, not imported


def find_trace_files(paths: Iterable[str]) -> list[str]:
    """Trace files named by ``paths``: files as given, folders searched for ``*.json`` / ``*.json.gz``."""
    paths = list(paths)
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in sorted(files) if f.endswith(TRACE_SUFFIXES)]
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise RunDirError(f"{path}: no such file or folder")
    if not found:
        empty = [p for p in paths if os.path.isdir(p) and not any(files for _, _, files in os.walk(p))]
        if empty and len(empty) == len(paths):
            raise RunDirError(f"{', '.join(empty)}: an empty folder, no trace files (*.json, *.json.gz) to import")
        raise RunDirError(f"no trace files (*.json, *.json.gz) in {', '.join(paths)}: nothing imported")
    return found


class _Counting:
    """A binary file wrapper that counts the bytes read through it (the compressed bytes of a .gz)."""

    def __init__(self, raw, progress: Optional[Callable[[int], None]]) -> None:
        self._raw, self._progress, self.count = raw, progress, 0

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self.count += len(data)
        if self._progress is not None:
            self._progress(len(data))
        return data

    def readinto(self, b) -> int:  # gzip reads through readinto
        n = self._raw.readinto(b)
        self.count += n or 0
        if self._progress is not None:
            self._progress(n or 0)
        return n


@contextlib.contextmanager
def _open(path: str, progress: Optional[Callable[[int], None]] = None):
    raw = open(path, "rb")
    counting = _Counting(raw, progress)
    try:
        with open(path, "rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
        yield (gzip.GzipFile(fileobj=counting, mode="rb") if gz else counting), counting
    finally:
        raw.close()


_DAMAGE = (EOFError, OSError, zlib.error, ValueError, UnicodeDecodeError)
"""What a truncated or damaged file raises (gzip: EOFError / OSError), besides ijson's ``JSONError``."""


def _describe_damage(exc: BaseException, read: int, size: int) -> str:
    what = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
    if isinstance(exc, EOFError) or "incomplete" in what.lower() or "premature" in what.lower():
        return f"truncated at byte {read:,} of {size:,} ({what})"
    return f"damaged near byte {read:,} of {size:,} ({what})"


def _first_byte(fh) -> bytes:
    """The first byte that is not white space (a JSON trace's is ``{`` or ``[``), reading at most 4 KiB."""
    head = fh.read(4096)
    return head.lstrip()[:1]


def _read_header(f: _File) -> Optional[str]:
    """Read the metadata before ``traceEvents`` (rank, world size, clock base); return the events' prefix,
    or None (with ``f.not_trace`` saying why) for a file that is no trace: not JSON, or JSON without events."""
    import ijson

    name = os.path.basename(f.path)
    try:
        with _open(f.path) as (fh, _):
            first = _first_byte(fh)
    except _DAMAGE as exc:  # a .gz that does not even start: damaged, not a trace of ours to judge
        f.not_trace = f"{name} is not a torch.profiler trace: it cannot be read ({str(exc)[:60] or type(exc).__name__})"
        return None
    if not first:
        f.not_trace = f"{name} is not a torch.profiler trace: it is empty"
        return None
    if first not in (b"{", b"["):
        shown = first.decode("latin-1")
        f.not_trace = f"{name} is not a torch.profiler trace: it is not JSON (it starts with {shown!r}, not '{{')"
        return None
    with _open(f.path) as (fh, counting):
        try:
            for prefix, event, value in ijson.parse(fh, use_float=True):
                if prefix == "" and event == "start_array":
                    return "item"  # a bare Chrome trace array: no metadata
                if prefix == "" and event == "map_key" and value == "traceEvents":
                    return "traceEvents.item"
                if prefix == "distributedInfo.rank" and isinstance(value, int):
                    f.rank = value
                elif prefix == "distributedInfo.world_size" and isinstance(value, int):
                    f.world_size = value
                elif prefix == "distributedInfo.backend" and isinstance(value, str):
                    f.backend = value
                elif prefix == "host_name" and isinstance(value, str):
                    f.node = value
                elif prefix == "baseTimeNanoseconds" and isinstance(value, int):
                    f.base_ns = value
                elif prefix == "deviceProperties.item.name" and isinstance(value, str) and f.device is None:
                    f.device = {"name": value}
                elif prefix == "deviceProperties.item.totalGlobalMem" and f.device is not None:
                    f.device.setdefault("total_memory_bytes", int(value))
        except (*_DAMAGE, ijson.JSONError) as exc:
            f.damage = _describe_damage(exc, counting.count, os.path.getsize(f.path))
            return "traceEvents.item"  # cut or damaged in its header: what comes before the damage, if any
    f.not_trace = f"{name} is not a torch.profiler trace: a JSON object without traceEvents"
    return None


def _lane(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return zlib.crc32(str(value).encode())  # e.g. "stream 7 ": stable across processes, unlike hash()


_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2, "long int": 8,
    "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
}  # fmt: skip
"""Bytes per element of the dtype names ``record_shapes=True`` writes in a trace's ``Input type``."""
_COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def _collective_bytes(name: str, args: dict) -> Optional[int]:
    """Tensor bytes of a collective, when the trace was recorded with ``record_shapes=True``."""
    if not name.startswith(_COLLECTIVE_PREFIXES):
        return None
    n, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(n, int) and isinstance(dtype, str) and dtype in _DTYPE_BYTES:
        return n * _DTYPE_BYTES[dtype]
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(types, list) or not types:
        return None
    first, dtype = dims[0], types[0]
    shapes = first if first and isinstance(first[0], list) else [first]  # a TensorList or one tensor
    # A TensorList hides its dtype: gradients are float32 unless the gloo / nccl span says otherwise.
    size = _DTYPE_BYTES.get(dtype, 4 if dtype == "TensorList" else 0)
    total = 0
    for shape in shapes:
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None
        count = 1
        for d in shape:
            count *= d
        total += count
    return total * size or None


def _stream_events(con, f: _File, prefix: str, progress: Optional[Callable[[int], None]]) -> None:
    """Append the file's complete ("X") events of known kinds to the ``ev`` table, in batches."""
    import ijson
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("file", "kind", "name", "start_ns", "end_ns", "lane", "corr", "nbytes")}

    def flush() -> None:
        if cols["kind"]:
            batch = pa.table(cols)
            con.register("_batch", batch)
            con.execute("INSERT INTO ev SELECT * FROM _batch")
            con.unregister("_batch")
            for v in cols.values():
                v.clear()

    with _open(f.path, progress) as (fh, counting):
        try:
            for e in ijson.items(fh, prefix, use_float=True):
                if not isinstance(e, dict) or e.get("ph") != "X":
                    continue
                kind = ACTIVITY_KIND.get(e.get("cat", ""))
                if kind is None:
                    continue
                ts = e.get("ts")
                if not isinstance(ts, (int, float)):
                    continue
                start = round(ts * 1000)
                dur = e.get("dur", 0)
                args = e.get("args") or {}
                if not f.pid and kind not in GPU_KINDS:
                    f.pid = _lane(e.get("pid", 0))
                cols["file"].append(f.index)
                cols["kind"].append(kind)
                cols["name"].append(str(e.get("name", "")))
                cols["start_ns"].append(start)
                cols["end_ns"].append(start + round(dur * 1000 if isinstance(dur, (int, float)) else 0))
                cols["lane"].append(_lane(e.get("tid", 0)))
                corr = args.get("correlation", 0) if isinstance(args, dict) else 0
                cols["corr"].append(corr if isinstance(corr, int) else 0)
                cols["nbytes"].append(_collective_bytes(cols["name"][-1], args) if isinstance(args, dict) else None)
                f.events += 1
                if len(cols["kind"]) >= _BATCH_EVENTS:
                    flush()
        except (*_DAMAGE, ijson.JSONError) as exc:
            f.damage = _describe_damage(exc, counting.count, os.path.getsize(f.path))
    flush()


def import_traces(
    paths: Iterable[str],
    run_root: str,
    *,
    run_id: Optional[str] = None,
    job: str = "import",
    progress: Optional[Progress] = None,
) -> ImportResult:
    """Read Kineto traces (one or more per rank) and write them as a run under ``run_root``.

    Never raises for what is wrong inside a trace: each such problem is one line in the result's
    ``problems`` and the rest is imported. Raises ``RunDirError`` when there is nothing to read.
    """
    import duckdb

    files = [_File(p, i) for i, p in enumerate(find_trace_files(paths))]
    total = sum(os.path.getsize(f.path) for f in files)
    read = [0]

    def advance(n: int) -> None:
        read[0] += n
        if progress is not None:
            progress(read[0], total)

    if run_id is not None:
        _check_run_id(run_root, run_id)
    prefixes = [_read_header(f) for f in files]
    skipped = [f.not_trace for f in files if f.not_trace]
    files = [f for f, prefix in zip(files, prefixes) if prefix is not None]
    prefixes = [p for p in prefixes if p is not None]
    if not files:
        raise RunDirError(_nothing_imported(skipped))
    _assign_ranks(files)
    result = ImportResult(run_path="", files=len(files), problems=[f"{line}: left out" for line in skipped])

    tmp = tempfile.mkdtemp(prefix="ranksight-import-")
    con = None
    try:
        con = duckdb.connect(os.path.join(tmp, "events.duckdb"))
        con.execute(f"SET memory_limit = '{SPILL_MEMORY_LIMIT}'")
        con.execute(f"SET temp_directory = '{os.path.join(tmp, 'spill')}'")
        con.execute("SET preserve_insertion_order = false")
        con.execute(
            "CREATE TABLE ev (file INTEGER, kind VARCHAR, name VARCHAR, start_ns BIGINT, end_ns BIGINT, "
            "lane BIGINT, corr BIGINT, nbytes BIGINT)"
        )
        for f, prefix in zip(files, prefixes):
            if f.damage is None:
                _stream_events(con, f, prefix, advance)
            else:
                advance(os.path.getsize(f.path))
            result.events += f.events
        # Nothing is written before the traces are known to hold a complete step: a file that is no trace or
        # one cut before its first step leaves no run behind (a run of no steps would only be listed, empty).
        stepped = _files_with_steps(con, files)
        if not stepped:
            raise RunDirError(_nothing_imported(skipped + [_why_no_steps(f) for f in files]))
        run_id = run_id or _run_id(job, files, _first_event_ns(con))
        run_path = _check_run_id(run_root, run_id)
        result.run_path = run_path
        os.makedirs(os.path.join(run_path, RANKS_DIR), exist_ok=True)
        world = max([f.world_size or 0 for f in files] + [max(f.rank for f in files) + 1])
        result.world_size = world
        for rank in sorted({f.rank for f in files}):
            mine = [f for f in files if f.rank == rank]
            steps, gpu, lines = _import_rank(con, run_path, job, run_id, rank, world, mine)
            result.ranks[rank] = steps
            result.gpu = result.gpu or gpu
            result.problems += lines
    finally:
        if con is not None:
            con.close()
        shutil.rmtree(tmp, ignore_errors=True)
    missing = sorted(set(range(world)) - set(result.ranks))
    if missing:
        result.problems.append(
            f"no trace for rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} of {world}: "
            "findings that compare ranks (stragglers, who waits for whom) see only the ranks imported"
        )
    return result


def _assign_ranks(files: list[_File]) -> None:
    """A file's rank: its ``distributedInfo``, else ``rank<N>`` in its name, else its place in the list."""
    for f in files:
        if f.rank is None:
            m = _RANK_IN_NAME.search(os.path.basename(f.path))
            if m:
                f.rank = int(m.group(1))
    taken = {f.rank for f in files if f.rank is not None}
    spare = (r for r in range(len(files) + len(taken)) if r not in taken)
    for f in files:
        if f.rank is None:
            f.rank = next(spare)


def _check_run_id(run_root: str, run_id: str) -> str:
    """The new run's folder; raises ``RunDirError`` for an id that is no folder name or a run that exists."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", run_id):
        raise RunDirError(f"run id {run_id!r}: use letters, digits and -_. (no leading dot)")
    run_path = os.path.join(run_root, run_id)
    if os.path.exists(os.path.join(run_path, RANKS_DIR)):
        raise RunDirError(f"{run_path} already exists: pass another --run-id or remove it")
    return run_path


def _files_with_steps(con, files: list[_File]) -> set[int]:
    """Indexes of the files holding at least one complete ``ProfilerStep#N`` span."""
    rows = con.execute(
        f"SELECT DISTINCT file FROM ev WHERE kind = 'ann' AND name LIKE '{STEP_MARK}%' "
        f"AND TRY_CAST(substr(name, {len(STEP_MARK) + 1}) AS BIGINT) IS NOT NULL"
    ).fetchall()
    return {r[0] for r in rows}


def _why_no_steps(f: _File) -> str:
    name = os.path.basename(f.path)
    if f.damage:
        return f"{name} is {f.damage}, before its first complete profiled step"
    if not f.events:
        return f"{name} holds no trace events"
    return f"{name} has no {STEP_MARK}N marks (profile with a schedule and call prof.step() each step)"


def _nothing_imported(reasons: list[str]) -> str:
    """One line: why no file gave a step, file by file (the first three, then how many more)."""
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return f"nothing imported, no run written: {shown}"


def _first_event_ns(con) -> dict[int, int]:
    """Per file, its first event's start on the trace's own clock (before ``baseTimeNanoseconds``)."""
    return dict(con.execute("SELECT file, min(start_ns) FROM ev GROUP BY file").fetchall())


def _run_id(job: str, files: list[_File], first_ns: dict[int, int]) -> str:
    """``<job>-<when the trace was recorded>-<4 hex>``. Kineto's event times count from
    ``baseTimeNanoseconds`` (the profiler's start, weeks before the trace on a long-lived host), so the
    recorded time is that base plus the first event's time; an older trace without a base has epoch times."""
    stamps = [(f.base_ns or 0) + first_ns[f.index] for f in files if first_ns.get(f.index)]
    stamp = min((s for s in stamps if s > 0), default=None)
    when = time.strftime("%Y%m%d-%H%M%S", time.localtime(stamp / 1e9 if stamp else time.time()))
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", job).lstrip(".") or "import"
    return f"{safe}-{when}-{secrets.token_hex(2)}"


def _ranges(values: list[int]) -> str:
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


_STEPS_SQL = f"""
    SELECT file, CAST(substr(name, {len(STEP_MARK) + 1}) AS BIGINT) AS step, start_ns AS s0, end_ns AS s1, lane
    FROM ev WHERE kind = 'ann' AND name LIKE '{STEP_MARK}%' AND file IN (SELECT unnest(?))
      AND TRY_CAST(substr(name, {len(STEP_MARK) + 1}) AS BIGINT) IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY step ORDER BY file, start_ns) = 1
"""

# Host events go to the step whose span holds their start; GPU activities to the step that launched
# them (by correlation id), whenever they ran.
_EVENTS_SQL = """
    WITH host AS (
        SELECT e.file, e.kind, e.name, e.start_ns, e.end_ns, e.lane, e.corr, e.nbytes, s.step
        FROM (SELECT * FROM ev WHERE file IN (SELECT unnest(?)) AND kind NOT IN ('kernel', 'memcpy', 'memset')) e
        ASOF JOIN _steps s ON e.file = s.file AND e.start_ns >= s.s0
        WHERE e.start_ns < s.s1),
    launch AS (SELECT file, corr, any_value(step) AS step FROM host WHERE kind = 'rt' AND corr <> 0 GROUP BY ALL),
    device AS (
        SELECT e.file, e.kind, e.name, e.start_ns, e.end_ns, e.lane, e.corr, e.nbytes, l.step
        FROM ev e JOIN launch l ON e.file = l.file AND e.corr = l.corr
        WHERE e.file IN (SELECT unnest(?)) AND e.kind IN ('kernel', 'memcpy', 'memset'))
    SELECT step, kind, name, start_ns, end_ns, lane, corr, nbytes FROM host
    UNION ALL SELECT step, kind, name, start_ns, end_ns, lane, corr, nbytes FROM device
    ORDER BY step, start_ns
"""


def _import_rank(con, run_path: str, job: str, run_id: str, rank: int, world: int, files: list[_File]):
    """Reduce one rank's steps and write its segments and metadata; return (steps, gpu seen, problems)."""
    ids = [f.index for f in files]
    names = ", ".join(os.path.basename(f.path) for f in files)
    problems = [
        f"rank {rank}: {os.path.basename(f.path)} is {f.damage}; imported the events before it"
        for f in files
        if f.damage
    ]
    head = files[0]
    node = head.node or "trace"
    identity = {
        "job": job,
        "run": run_id,
        "node": node,
        "rank": rank,
        "local_rank": rank,
        "world_size": world,
        "pid": head.pid,
    }
    base = next((f.base_ns for f in files if f.base_ns), 0)
    writer = _SegmentWriter(run_path, identity)
    con.execute("DROP TABLE IF EXISTS _steps")
    con.execute(f"CREATE TEMP TABLE _steps AS {_STEPS_SQL}", [ids])
    spans = {
        step: StepSpan(step, s0, s1, lane)
        for _, step, s0, s1, lane in con.execute("SELECT * FROM _steps ORDER BY step").fetchall()
    }
    counts = con.execute(
        "SELECT count(*) FILTER (kind IN ('kernel', 'memcpy', 'memset')), "
        "count(*) FILTER (name LIKE 'DistributedDataParallel.forward%'), "
        "count(*) FILTER (name LIKE 'enumerate(DataLoader)%'), min(start_ns), max(end_ns) "
        "FROM ev WHERE file IN (SELECT unnest(?))",
        [ids],
    ).fetchone()
    gpu_events, ddp_marks, loader_marks, first_ns, last_ns = counts
    if not spans:
        problems.append(
            f"rank {rank}: no {STEP_MARK}N marks in {names} (profile with a schedule and call prof.step() each "
            "step): its events cannot be split into steps, so it has no step rows"
        )
    prev_gpu_end = None
    steps = 0
    if spans:
        cur = con.execute(_EVENTS_SQL, [ids, ids])
        pending: list[TraceEvent] = []
        current = None
        while True:
            chunk = cur.fetchmany(50_000)
            for step, kind, name, s, e, lane, corr, nbytes in chunk:
                if step != current:
                    if current is not None:
                        prev_gpu_end = _write_step(writer, spans[current], pending, prev_gpu_end, base)
                        steps += 1
                    current, pending = step, []
                pending.append(TraceEvent(kind, name, s, e, lane, corr, nbytes))
            if not chunk:
                break
        if current is not None:
            _write_step(writer, spans[current], pending, prev_gpu_end, base)
            steps += 1
        steps += _write_empty_steps(writer, spans, writer.steps_seen, base)
    if writer.impossible_gpu_records:
        n = writer.impossible_gpu_records
        problems.append(
            f"rank {rank}: {n} GPU record{'s start' if n > 1 else ' starts'} before the host call that launched "
            f"{'them' if n > 1 else 'it'} (a clock fault in the profiler's CUPTI records); left out of the steps' "
            "GPU figures"
        )
    writer.add_event(
        "info", f"imported from torch.profiler trace{'s' if len(files) > 1 else ''}: {names} ({steps} steps)"
    )
    for line in problems:
        writer.add_event("warning", line)
    writer.close()
    meta = {
        "schema_version": SCHEMA_VERSION,
        "ranksight_version": __version__,
        **identity,
        "node_rank": 0,
        "status": "finished",
        "started_ns": (first_ns or 0) + base,
        "heartbeat_ns": (last_ns or 0) + base,
        "steps": steps,
        "hostname": node,
        "source": {"kind": "torch.profiler", "files": [os.path.abspath(f.path) for f in files]},
        "framework": "plain",
        "parallelism": "ddp" if ddp_marks else "none",
        "model": {"devices": ["cuda"] if gpu_events else ["cpu"]},
        "data_source": "loader" if loader_marks else "none",
    }
    if ddp_marks:
        meta["ddp"] = {"backend": head.backend or ("nccl" if gpu_events else "gloo")}
    if head.device:
        meta["gpu_device"] = head.device
    _atomic_write(os.path.join(run_path, RANKS_DIR, f"rank-{rank:05d}.json"), json.dumps(meta, indent=1).encode())
    return steps, bool(gpu_events), problems


def _write_step(writer: _SegmentWriter, span: StepSpan, events: list[TraceEvent], prev_gpu_end, base: int):
    red = reduce_step(span, events, prev_gpu_end, base)
    writer.add("steps", [red.step])
    writer.add("buckets", red.buckets)
    writer.add("collectives", red.collectives)
    t = red.step["time_ns"]
    writer.add(
        "samples",
        [
            {"time_ns": t, "step": span.step, "name": k, "value": float(v)}
            for k, v in red.samples.items()
            if k in SAMPLE_NAMES
        ],
    )
    writer.steps_seen.add(span.step)
    writer.impossible_gpu_records += int(red.samples.get("impossible_gpu_records", 0))
    return red.gpu_end_ns if red.gpu_end_ns is not None else prev_gpu_end


def _write_empty_steps(writer: _SegmentWriter, spans: dict, seen: set, base: int) -> int:
    """Steps whose span held no event at all (a truncated file): rows with their wall time only."""
    n = 0
    for step, span in spans.items():
        if step not in seen:
            _write_step(writer, span, [], None, base)
            n += 1
    return n


def _atomic_write(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), f"{TMP_PREFIX}{os.path.basename(path)}.{secrets.token_hex(4)}")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


class _SegmentWriter:
    """Rows of one rank to Parquet spool segments: written under a ``.tmp-`` name, then renamed, as the
    agent's spool writer does (readers never see half a file)."""

    def __init__(self, run_path: str, identity: dict) -> None:
        self.run_path, self.identity = run_path, identity
        stem = f"{identity['node']}_r{identity['rank']:05d}_p{identity['pid']}-import"
        self._stem = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in stem)
        self._rows: dict[str, list[dict]] = {k: [] for k in KINDS}
        self._seq: dict[str, int] = {}
        self.steps_seen: set[int] = set()
        self.impossible_gpu_records = 0  # left out of the steps' GPU figures (``possible_gpu_records``)

    def add(self, kind: str, rows: list[dict]) -> None:
        self._rows[kind].extend(rows)
        if len(self._rows[kind]) >= _ROWS_PER_SEGMENT:
            self._flush(kind)

    def add_event(self, level: str, message: str) -> None:
        self.add("events", [{"time_ns": time.time_ns(), "level": level, "component": "import", "message": message}])

    def close(self) -> None:
        for kind in KINDS:
            self._flush(kind)

    def _flush(self, kind: str) -> None:
        rows = self._rows[kind]
        if not rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema(kind)
        columns = {
            c.name: [self.identity[c.name]] * len(rows) if c.name in self.identity else [r.get(c.name) for r in rows]
            for c in KINDS[kind]
        }
        table = pa.Table.from_pydict(columns, schema=schema)
        directory = os.path.join(self.run_path, kind)
        os.makedirs(directory, exist_ok=True)
        seq = self._seq.get(kind, 0)
        name = f"{self._stem}_{seq:06d}{SPOOL_SUFFIX}"
        tmp = os.path.join(directory, f"{TMP_PREFIX}{name}.partial")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, os.path.join(directory, name))
        self._seq[kind] = seq + 1
        self._rows[kind] = []


__all__ = ["ImportResult", "Progress", "find_trace_files", "import_traces"]
