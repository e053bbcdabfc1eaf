"""Merge a node's spool segments into one file per record kind per interval on the shared run folder.

Why: every rank writing one segment per kind every 2 s is ~2.5 k file creations a second at 1,024 ranks
and ~25 k at 10,000, which a shared filesystem's metadata server feels. With
``Config.node_spool_dir`` set, ranks write their segments and rank files to a node-local folder
(``<node_spool_dir>/<run>/``, same layout as a run folder) exactly as before, and whichever rank of the
node gets the node's lock first publishes them every ``publish_interval_s``: one Parquet file per kind
(``<kind>/<node>_m<batch>.parquet``) and one rank file for the node (``ranks/node-<node>.json``).

Exactly once, also when a publisher is killed at any point, by a journal on the local disk:

1. *claim*: the segments to publish are renamed into ``.batches/<batch>/<kind>/`` (a rename on one
   filesystem: a segment is either still pending or in exactly one batch);
2. *publish*: each kind's batch is written whole under a temporary name on the shared folder, fsync'd,
   and renamed to the batch's final name, which is a function of the batch id alone;
3. *release*: the batch's files are deleted.

Every publish first finishes the batches a killed publisher left: a kind whose final file exists is only
released (it was published), any other is published. So a crash between 2 and 3 cannot publish a row
twice, and a crash anywhere else loses nothing. Only the node-local disk's loss (the node itself gone)
loses rows: at most one publish interval.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass

from ranksight.format.schema import KINDS, RANKS_DIR, SPOOL_SUFFIX, TMP_PREFIX

QUARANTINE_DIR = "quarantine"  # the collectors' name for it (collectors._rundir); the agent cannot import it
log = logging.getLogger("ranksight")
BATCHES_DIR = ".batches"
LOCAL_SUFFIX = ".arrow"
"""Segments on a node spool are Arrow IPC files (cheap to write and read); the publisher also takes
Parquet ones, and publishes Parquet."""
_LOCAL_SUFFIXES = (LOCAL_SUFFIX, SPOOL_SUFFIX)
LOCK_NAME = ".publish.lock"
STAMP_NAME = ".published"
FILES_PER_PUBLISH = len(KINDS) + 2
"""Files one publish can create on the shared folder: one per record kind with rows, the step file's digest
(``ranksight.format.digest``) and the node's rank file."""
NODE_FILE_PREFIX = "node-"
_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")


def publish_interval_s(
    flush_interval_s: float, world_size: int, local_world_size: int, max_job_files_per_s: float
) -> float:
    """How often a node publishes so that the whole job creates at most ``max_job_files_per_s`` files a second.

    Each publish creates at most ``FILES_PER_PUBLISH`` files, and there are ``world_size /
    local_world_size`` nodes; never more often than the ranks flush.
    """
    nodes = math.ceil(max(1, world_size) / max(1, local_world_size))
    return max(float(flush_interval_s), FILES_PER_PUBLISH * nodes / float(max_job_files_per_s))


def local_world_size_from_env() -> int | None:
    """Ranks per node as the launcher says (torchrun ``LOCAL_WORLD_SIZE``, SLURM ``SLURM_NTASKS_PER_NODE``)."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        match = re.match(r"\s*(\d+)", os.environ.get(name, ""))
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


@dataclass(frozen=True)
class PublishResult:
    """What one publish moved to the shared folder."""

    files: int  # files created on the shared folder (segments and the node's rank file)
    segments: int  # node-local segments merged into them
    rows: int


def safe_name(text: str) -> str:
    """A node name as it may appear in a file name (what the spool writer does to its stem)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text).lstrip(".") or "node"


class NodePublisher:
    """Publishes one node's local spool to the shared run folder; every rank of the node holds one.

    ``maybe_publish`` is called by each rank after its flush: it costs one ``stat`` of the node's stamp
    file until the interval is up, then one rank takes the node's lock (non-blocking: the others go on)
    and publishes everything pending, its neighbours' segments included.
    """

    def __init__(
        self,
        local_path: str,
        run_path: str,
        node: str,
        *,
        flush_interval_s: float,
        world_size: int,
        max_job_files_per_s: float,
        local_world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.local_path = local_path
        self._rank_file = None if rank is None else f"rank-{rank:05d}.json"
        self.run_path = run_path
        self.node = node
        self._flush_interval_s = flush_interval_s
        self._world_size = world_size
        self._max_files = max_job_files_per_s
        self._local_world_size = local_world_size or local_world_size_from_env()
        self.published = PublishResult(0, 0, 0)

    def interval_s(self) -> float:
        """The node's publish interval now: ranks per node as the launcher says, or as many as wrote a rank file."""
        seen = _count_rank_files(self.local_path)
        local = max(self._local_world_size or 0, seen, 1)
        return publish_interval_s(self._flush_interval_s, self._world_size, local, self._max_files)

    def maybe_publish(self, final: bool = False) -> PublishResult | None:
        """Publish the node's pending segments if its interval is up; None when not.

        On a rank's last flush (``final``) its rows go out before it returns: it waits (bounded) for the
        neighbours still running to close too, then publishes unless one of them did after its last write.
        The first call only starts the node's clock, at a phase of its own.
        """
        interval = self.interval_s()
        stamp = os.path.join(self.local_path, STAMP_NAME)
        last = _mtime(stamp)
        if not last and not final:
            _start_clock(stamp, self.node, interval)
            return None
        if not final and time.time() - last < interval:
            return None
        if final:
            # Ranks of a node close within moments of each other: wait (a few flushes at most) until the
            # neighbours said their last word, so that one publish per node carries them all.
            deadline = time.monotonic() + 3 * self._flush_interval_s + 1.0
            while time.monotonic() < deadline and _neighbour_running(
                self.local_path, self._rank_file, self._flush_interval_s
            ):
                time.sleep(0.05)
        with _node_lock(self.local_path, wait_s=10.0 if final else 0.0) as held:
            if not held:
                return None
            if not final and time.time() - _mtime(stamp) < interval:
                return None  # a neighbour published while we waited
            if (
                final
                and self._rank_file
                and _mtime_ns(stamp) > _mtime_ns(os.path.join(self.local_path, RANKS_DIR, self._rank_file))
            ):
                return None  # a neighbour published after our last rows and status were written
            began = time.time()
            result = publish_node(self.local_path, self.run_path, self.node, interval)
            _touch(stamp, began)  # the clock runs from the start: a slow publish does not stretch the window
        self.published = PublishResult(
            self.published.files + result.files,
            self.published.segments + result.segments,
            self.published.rows + result.rows,
        )
        return result


def publish_node_spool(local_path: str, run_path: str, node: str | None = None) -> PublishResult:
    """Publish a node's local spool now, after its job ended or crashed (e.g. from a SLURM epilog).

    ``local_path`` is ``<node_spool_dir>/<run>``; ``node`` defaults to the node name the rank files say.
    Takes the node's lock, so it is safe while ranks still run.
    """
    node = node or _node_of(local_path) or safe_name(os.uname().nodename)
    with _node_lock(local_path, wait_s=60.0) as held:
        if not held:
            raise TimeoutError(f"{local_path}: another publisher holds the node's lock")
        return publish_node(local_path, run_path, node, None)


def publish_node(local_path: str, run_path: str, node: str, interval_s: float | None) -> PublishResult:
    """Finish what a killed publisher left, then claim, publish and release everything pending.

    The caller holds the node's lock. ``interval_s`` is written into the node's rank file as each rank's
    ``flush_interval_s``: readers judge a rank lost after ``LIVE_FLUSHES`` of those without a heartbeat,
    and the shared copy of a heartbeat is refreshed once per publish.
    """
    node = safe_name(node)
    total = PublishResult(0, 0, 0)
    batches = os.path.join(local_path, BATCHES_DIR)
    for batch in sorted(_listdir(batches)):  # left by a publisher that was killed
        total = _add(total, _publish_batch(os.path.join(batches, batch), run_path, node, batch))
    batch = f"{time.time_ns():020d}-{secrets.token_hex(3)}"
    batch_dir = os.path.join(batches, batch)
    if _claim(local_path, batch_dir):
        total = _add(total, _publish_batch(batch_dir, run_path, node, batch))
    if _publish_rank_files(local_path, run_path, node, interval_s):
        total = _add(total, PublishResult(1, 0, 0))
    return total


def _claim(local_path: str, batch_dir: str) -> bool:
    """Rename every finished segment of the local spool into the batch folder; False when there was none."""
    claimed = False
    for kind in KINDS:
        folder = os.path.join(local_path, kind)
        names = [n for n in _listdir(folder) if n.endswith(_LOCAL_SUFFIXES) and not n.startswith(".")]
        if not names:
            continue
        target = os.path.join(batch_dir, kind)
        os.makedirs(target, exist_ok=True)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.rename(os.path.join(folder, name), os.path.join(target, name))
                claimed = True
    return claimed


def published_name(node: str, batch: str) -> str:
    """The shared folder's name for one kind's part of a batch: a function of the batch alone (idempotent)."""
    return f"{safe_name(node)}_m{batch}{SPOOL_SUFFIX}"


def _read_segment(path: str):
    """A node-local segment as an Arrow table (IPC, or Parquet from an older agent)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(LOCAL_SUFFIX):
        import pyarrow.ipc as ipc

        with pa.OSFile(path) as f:
            return ipc.open_file(f).read_all()
    # ParquetFile, not read_table: read_table imports pyarrow.dataset and with it pandas (~38 MB in a
    # training process that never uses it; see _arrow_columns.py).
    return pq.ParquetFile(path).read()


def _publish_batch(batch_dir: str, run_path: str, node: str, batch: str) -> PublishResult:
    files = segments = rows = 0
    for kind in sorted(_listdir(batch_dir)):
        kind_dir = os.path.join(batch_dir, kind)
        names = sorted(_listdir(kind_dir))
        if kind in KINDS and names:
            f, r = _publish_kind(kind_dir, names, os.path.join(run_path, kind), node, batch)
            files, segments, rows = files + f, segments + len(names), rows + r
        shutil.rmtree(kind_dir, ignore_errors=True)  # release: the rows are on the shared folder now
    shutil.rmtree(batch_dir, ignore_errors=True)
    return PublishResult(files, segments, rows)


def _publish_kind(kind_dir: str, names: list[str], target_dir: str, node: str, batch: str) -> tuple[int, int]:
    """Write one kind's claimed segments as one file on the shared folder unless it is there already.

    A segment pyarrow cannot read is copied as it is to the run's ``quarantine/<kind>/`` (under its own
    name, also idempotent), where ``ingest`` keeps the segments it cannot read: nothing is deleted unread.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(target_dir, exist_ok=True)
    tables, created = [], 0
    for name in names:
        path = os.path.join(kind_dir, name)
        try:
            tables.append(_read_segment(path))
        except (OSError, pa.ArrowException, ValueError) as exc:
            quarantine = os.path.join(os.path.dirname(target_dir), QUARANTINE_DIR, os.path.basename(target_dir))
            if not os.path.exists(os.path.join(quarantine, name)):
                os.makedirs(quarantine, exist_ok=True)
                _write_durably(quarantine, name, lambda f, p=path: _copy_into(p, f))
                created += 1
                log.warning("ranksight: moved %s to %s: it does not read (%s)", path, quarantine, exc)
    if not tables:
        return created, 0
    final = published_name(node, batch)
    if os.path.exists(os.path.join(target_dir, final)):
        return created, 0  # published before its publisher was killed: only the release was left
    table = pa.concat_tables(tables, promote_options="permissive")
    if os.path.basename(target_dir) != "steps":
        _write_durably(target_dir, final, lambda f: pq.write_table(table, f, compression="zstd"))
        return created + 1, table.num_rows
    from ranksight.format.digest_file import parquet_bytes

    data = parquet_bytes(table)
    created += _write_digest(table, target_dir, final)  # first: a published file then has its digest
    _write_durably(target_dir, final, lambda f: f.write(data))
    return created + 1, table.num_rows


def _write_digest(table, steps_dir: str, name: str) -> int:
    """Write the step file's digest (``ranksight.format.digest``); 1 when written. A digest only saves readers
    time, so one that cannot be made (no DuckDB here, a full disk) is left out with a debug line: the file
    itself is still published, and readers read its rows."""
    try:
        from ranksight.format.digest_file import write_digest

        write_digest(table, steps_dir, name, _write_durably)
        return 1
    except Exception as exc:  # noqa: BLE001 -- the publish goes on without it
        log.debug("ranksight: no digest for %s: %s", name, exc)
        return 0


def _copy_into(path: str, f) -> None:
    with open(path, "rb") as src:
        shutil.copyfileobj(src, f)


def _write_durably(directory: str, name: str, write) -> None:
    """Write under a dot-prefixed temporary name, fsync, rename into place: readers see it whole or not at
    all, and the local copy is released only after the bytes are on the shared filesystem."""
    tmp = os.path.join(directory, f"{TMP_PREFIX}{name}.{os.getpid()}.{secrets.token_hex(3)}.partial")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _publish_rank_files(local_path: str, run_path: str, node: str, interval_s: float | None) -> bool:
    """Write the node's ranks' metadata as one file, ``ranks/node-<node>.json`` (readers take each rank's
    newest heartbeat from it or from a ``rank-N.json``); False when the node has no rank file yet."""
    folder = os.path.join(local_path, RANKS_DIR)
    metas = []
    for name in sorted(_listdir(folder)):
        if not _RANK_FILE.match(name):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                meta = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError):
            continue  # being replaced right now, or damaged: the next publish takes it
        if not isinstance(meta, dict):
            continue
        if interval_s is not None and isinstance(meta.get("flush_interval_s"), (int, float)):
            meta["flush_interval_s"] = max(float(meta["flush_interval_s"]), interval_s)
        metas.append(meta)
    if not metas:
        return False
    target = os.path.join(run_path, RANKS_DIR)
    os.makedirs(target, exist_ok=True)
    body = json.dumps({"node": node, "ranks": metas}, default=str).encode()
    _write_durably(target, f"{NODE_FILE_PREFIX}{safe_name(node)}.json", lambda f: f.write(body))
    return True


@contextlib.contextmanager
def _node_lock(local_path: str, wait_s: float):
    """Hold the node's publish lock (an ``flock``: the kernel releases it when its holder dies)."""
    os.makedirs(local_path, exist_ok=True)
    fd = os.open(os.path.join(local_path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.02)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _node_of(local_path: str) -> str | None:
    folder = os.path.join(local_path, RANKS_DIR)
    for name in sorted(_listdir(folder)):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(os.path.join(folder, name), "rb") as f:
                return str(json.loads(f.read())["node"])
    return None


def _start_clock(stamp: str, node: str, interval: float) -> None:
    """Start the node's publish clock at a phase of its own (from its name), so that the nodes of a job do
    not all publish in the same second of each interval."""
    phase = int.from_bytes(hashlib.sha256(node.encode()).digest()[:4], "big") / 2**32
    os.makedirs(os.path.dirname(stamp), exist_ok=True)
    _touch(stamp)
    now = time.time()
    os.utime(stamp, (now, now - phase * interval))


def _neighbour_running(local_path: str, own: str | None, flush_interval_s: float) -> bool:
    """Whether another rank of the node still runs: its rank file says ``running`` and was rewritten within
    the last three flushes (one killed without a word stops counting that soon)."""
    folder = os.path.join(local_path, RANKS_DIR)
    fresh_after = time.time() - max(3 * flush_interval_s, 1.0)
    for name in _listdir(folder):
        if name == own or not _RANK_FILE.match(name):
            continue
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime < fresh_after:
                continue
            with open(path, "rb") as f:
                if json.loads(f.read()).get("status") == "running":
                    return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _count_rank_files(local_path: str) -> int:
    return sum(1 for n in _listdir(os.path.join(local_path, RANKS_DIR)) if _RANK_FILE.match(n))


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _touch(path: str, when: float | None = None) -> None:
    with open(path, "a"):
        pass
    os.utime(path, None if when is None else (when, when))


def _add(a: PublishResult, b: PublishResult) -> PublishResult:
    return PublishResult(a.files + b.files, a.segments + b.segments, a.rows + b.rows)
