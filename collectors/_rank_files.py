"""What a run's rank files say: each ``ranks/rank-N.json`` (and a node spool's ``node-<node>.json``) read and
its fields checked, so a file that does not parse or holds a field of the wrong type reads as a rank of status
``unknown`` with one warning line, never as a traceback or a wrong figure.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

from ranksight.format.schema import RANKS_DIR

from ._rundir import first_line, warn_once


@dataclass(frozen=True)
class RankMeta:
    """What one rank's metadata file says about it.

    ``status`` is what the agent wrote (``running``, or the final ``finished``, ``crashed``,
    ``terminated``), ``lost`` once a running rank's heartbeat stopped (see ``LIVE_FLUSHES``), or
    ``unknown`` when the file does not parse or holds a field of the wrong type (``problem`` says which;
    such fields are left out of ``data``).
    """

    rank: int
    status: str
    heartbeat_ns: int
    steps: int
    data: dict
    problem: str | None = None
    path: str = field(default="", compare=False)


UNKNOWN_STATUS = "unknown"
_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
_INT, _NUMBER, _TEXT, _OBJECT = "an integer", "a positive number", "a string", "an object"
_RANK_FIELDS = {
    **dict.fromkeys(("rank", "local_rank", "world_size", "pid", "node_rank"), _INT),
    **dict.fromkeys(("heartbeat_ns", "started_ns", "steps", "schema_version"), _INT),
    "flush_interval_s": _NUMBER,
    **dict.fromkeys(("status", "job", "run", "node", "hostname", "framework", "parallelism", "data_source"), _TEXT),
    **dict.fromkeys(("counters", "model", "gpu_device", "optimizer", "ddp", "ddp_logging", "loader", "host"), _OBJECT),
}
"""Types of the rank file's fields that readers compute with; a field of another type is left out."""
_REQUIRED_RANK_FIELDS = ("rank", "status", "heartbeat_ns")
_NESTED_NUMBERS = {
    "counters": ("agent_errors_total", "records_dropped_total", "rows_spooled_total"),
    "model": ("parameter_bytes",),
    "gpu_device": ("total_memory_bytes",),
    "optimizer": ("states_per_param",),
    "ddp": ("bucket_cap_bytes",),
    "ddp_logging": ("iteration", "unused_parameter_size"),
}
"""Numbers inside the rank file's objects that become rule features as they are."""


def read_rank_files(run_path: str) -> list[RankMeta]:
    """Every rank file of the run as the agent wrote it (status not derived; see ``read_rank_meta``).

    A file that does not parse, or whose fields have the wrong types, reads as a rank with status
    ``unknown`` (its rank from the file name) and one warning line; a file that vanished mid-read (an
    atomic rewrite) is simply not there this time.
    """
    folder = os.path.join(run_path, RANKS_DIR)
    try:
        listed = sorted(e.name for e in os.scandir(folder))
    except OSError:
        return []
    names = [n for n in listed if _RANK_FILE.match(n)]
    metas = [m for m in (_read_rank_file(os.path.join(folder, n)) for n in names) if m is not None]
    node_files = [n for n in listed if _NODE_FILE.match(n)]
    if node_files:  # a node spool's publisher: the newest heartbeat of each rank wins
        newest: dict[int, RankMeta] = {}
        for meta in metas + [m for n in node_files for m in _read_node_file(os.path.join(folder, n))]:
            held = newest.get(meta.rank)
            if held is None or meta.heartbeat_ns > held.heartbeat_ns:
                newest[meta.rank] = meta
        metas = [newest[r] for r in sorted(newest)]
    for meta in metas:
        if meta.problem:
            warn_once(f"ranksight: read {meta.path} as status {UNKNOWN_STATUS}: {meta.problem}")
    return metas


_NODE_FILE = re.compile(r"^node-[^/]+\.json$")


def _read_node_file(path: str) -> list[RankMeta]:
    """The ranks of one node's rank file (``{"node": ..., "ranks": [rank file, ...]}``), each checked like a
    ``rank-N.json``; a file that does not parse is left out with one warning line (it names no rank)."""
    try:
        raw, mtime_ns = _read_whole(path)
        data = json.loads(raw.decode("utf-8"))
        ranks = data["ranks"]
        if not isinstance(ranks, list):
            raise ValueError("its ranks are not a list")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as exc:
        warn_once(f"ranksight: skipped {path}: not a node rank file ({first_line(exc)})")
        return []
    metas = (_rank_from_data(path, entry, mtime_ns) for entry in ranks if isinstance(entry, dict))
    return [m for m in metas if m is not None]


def _read_whole(path: str) -> tuple[bytes, int]:
    """(the file's bytes, its mtime in ns), from one opening: half the system calls of ``open()`` and ``os.stat``
    (cpu_scale_history.md "Scale v4"), and the time is the opened file's own, so it belongs to the bytes read
    even where the file was replaced meanwhile."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        want = st.st_size + 1  # one read of the whole file; a full one means it grew since: read on to its end
        data = os.read(fd, want)
        if len(data) == want:
            chunks = [data]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data, st.st_mtime_ns
    finally:
        os.close(fd)


def _read_rank_file(path: str) -> RankMeta | None:
    try:
        raw, mtime_ns = _read_whole(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _rank_meta(path, {}, f"cannot be read ({exc.strerror})", 0)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _rank_meta(path, {}, f"not valid JSON ({first_line(exc)})", mtime_ns)
    if not isinstance(data, dict):
        return _rank_meta(path, {}, f"not a JSON object (a {type(data).__name__})", mtime_ns)
    return _rank_from_data(path, data, mtime_ns)


def _rank_from_data(path: str, data: dict, mtime_ns: int) -> RankMeta | None:
    clean, problems = _checked_fields(data)
    problems += [f"no {key} field" for key in _REQUIRED_RANK_FIELDS if data.get(key) is None]
    return _rank_meta(path, clean, "; ".join(problems) or None, mtime_ns)


def _rank_meta(path: str, clean: dict, problem: str | None, mtime_ns: int) -> RankMeta | None:
    """The rank of a checked file. One with a ``problem`` readers cannot trust: status unknown, its rank from the
    file name when the file lacks one (None without either); the heartbeat falls back to the file's mtime (the
    agent rewrites it every flush), so a rank still writing is not taken for a dead one."""
    if "rank" not in clean:
        match = _RANK_FILE.match(os.path.basename(path))
        if match is None:
            return None
        clean = {**clean, "rank": int(match.group(1))}
    status = UNKNOWN_STATUS if problem else clean["status"]
    heartbeat_ns, steps = clean.get("heartbeat_ns", mtime_ns), clean.get("steps", 0)
    return RankMeta(clean["rank"], status, heartbeat_ns, steps, clean, problem, path)


def _checked_fields(data: dict) -> tuple[dict, list[str]]:
    """(the data without fields of the wrong type, one line per such field). A typed field that is None is
    left out too: absent, so every reader's default applies."""
    clean, problems = {}, []
    for key, value in data.items():
        kind = _RANK_FIELDS.get(key)
        if kind is None:
            clean[key] = value
            continue
        if value is None:
            continue
        # The common cases, taken here without ``_fit``'s calls (it sees the rest): a string where one is expected,
        # an int (not a bool) within a float's range where an integer is, a JSON object where one is.
        kind_of = type(value)
        if (kind_of is str and kind is _TEXT) or (
            kind_of is int and kind is _INT and -_FLOAT_MAX <= value <= _FLOAT_MAX
        ):
            clean[key] = value
            continue
        if kind is _OBJECT and isinstance(value, dict):
            clean[key], nested = _checked_numbers(key, value)
            if nested:
                problems += nested
            continue
        fitted = _fit(value, kind)
        if fitted is None:
            problems.append(f"{key} is {_shown(value)}, expected {kind}")
            continue
        clean[key] = fitted
    return clean, problems


def _checked_numbers(key: str, obj: dict) -> tuple[dict, list[str]]:
    """(the object without its numbers of the wrong type, one line per such number): the object itself where
    every number is right, a copy only where one is left out (cpu_scale_history.md "Scale v8")."""
    names = _NESTED_NUMBERS.get(key)
    if not names:
        return obj, []
    bad = [name for name in names if (value := obj.get(name)) is not None and not _is_number(value)]
    if not bad:
        return obj, []
    clean = dict(obj)
    for name in bad:
        del clean[name]
    return clean, [f"{key}.{name} is {_shown(obj[name])}, expected a number" for name in bad]


_FLOAT_MAX = sys.float_info.max


def _is_number(value) -> bool:
    """A finite int or float, not a bool. An integer beyond a float's range is not one: readers compute with
    these numbers in floats (a JSON writer may emit any number of digits)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -_FLOAT_MAX <= value <= _FLOAT_MAX


def _fit(value, kind: str):
    """The value as ``kind`` (an integral float is an integer), or None when it is not one. A string or an object
    where one is expected was taken before (``_checked_fields``): one reaching here is of the wrong type."""
    if kind in (_TEXT, _OBJECT) or not _is_number(value):
        return None
    if kind == _INT:
        return int(value) if float(value).is_integer() else None
    return value if value > 0 else None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
