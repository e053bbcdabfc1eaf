"""What the pages read of a run, kept by the server between refreshes and shared by every tab.

Per run, one ``Snapshot`` at a time (``snapshot``): the clock (step, as of, status) and the verdict, re-made
only when the run's files changed, from what arrived since (the rollup folds the new step segments, the kept
rows take in the new segments, ``_kept``). Pulls (``pull``, ``st.cache_data``) are keyed by the snapshot's
serial: a refresh with nothing new re-runs no query, and every part of a page shows the same refresh.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable

import streamlit as st

from ranksight.collectors import (
    Rollup,
    RunDirError,
    list_runs,
    open_run,
    rank_is_live,
    read_rank_meta,
    spool_signature,
    store_path,
)
from ranksight.format.schema import KINDS, RANKS_DIR, SPOOL_SUFFIX

from . import _source, _warm
from ._kept import KEEP_STEP_ROWS, KeptRows

PULL_TTL_S = 30


@st.cache_resource(max_entries=8, show_spinner=False)
def _rollup(run_path: str) -> Rollup:
    return _warm.take_rollup(run_path) or _warm.build_rollup(run_path)


def rollup(run_path: str) -> Rollup:
    """The run's rollup as of its latest ``snapshot`` (built the first time a page needs it)."""
    snapshot(run_path)
    return _follower(run_path).rollup()


_prefetching: set[str] = set()
_prefetch_lock = threading.Lock()


def prefetch(run_path: str) -> None:
    """Build the run's rollup on a background thread while the landing page waits for the rules.

    The Verdict page needs only ``diagnose``; the other pages need the rollup, so starting it early
    makes the second page quick. ``st.cache_resource`` holds the result whichever thread built it.
    """
    with _prefetch_lock:
        if run_path in _prefetching:
            return
        _prefetching.add(run_path)

    def build() -> None:
        try:
            _warm.wait_released(run_path)  # not while the landing page draws (see _warm.release)
            if not _warm.stopping():  # released by the server's exit: nothing to build for
                _rollup(run_path)
        except Exception:  # the page that needs it reports the problem in one line
            pass

    _warm.background(build, (), "ranksight-rollup-prefetch")


@st.cache_data(ttl=PULL_TTL_S, max_entries=256, show_spinner=False)
def _pull(run_path: str, serial: int, query: str, args: tuple, _fn: Callable[..., Any], _rollup_obj: Rollup):
    # Keyed by the query's qualified name: the function itself is left out of the hash (leading underscore).
    return _fn(_rollup_obj.cursor(), *args)


def pull(run_path: str, fn: Callable[..., Any], *args):
    """Run ``fn(cursor, *args)`` (a function of ``_queries``) on the run as of its latest ``snapshot``: cached
    until the next snapshot that saw new records, shared by every tab."""
    snap = current(run_path)
    return _pull(run_path, snap.serial, f"{fn.__module__}.{fn.__qualname__}", args, fn, _follower(run_path).rollup())


def landing_drawn(run_path: str) -> None:
    """The Verdict page's script has run: background work held back for it may start once the browser has
    drawn it (``_warm.LANDING_GRACE_S``)."""
    _warm.release(run_path, after_s=_warm.LANDING_GRACE_S)


def skipped(run_path: str) -> list[str]:
    """'path: reason' of each file the run's reader left out (a damaged or foreign segment); empty when none."""
    return [str(f) for f in _follower(run_path).rollup().run.skipped]


@st.cache_data(ttl=2, show_spinner=False)
def _runs(root: str) -> list[dict]:
    return list_runs(root)


def runs(root: str) -> list[dict]:
    """The runs under ``root`` with their live status (re-read every 2 s), each run already followed by a
    ``snapshot`` told as that snapshot sees it: the picker, the Runs table and the clock say the same."""
    out = []
    for r in _runs(root):
        f = _followers.get(r["path"])
        snap = f.snap if f is not None else None
        out.append(r if snap is None else {**r, **snap.run_fields()})
    return out


@dataclass(frozen=True)
class Snapshot:
    """One refresh of a run: the clock, the status and the verdict every part of a page shows of it.

    Why one object: the Verdict, the charts beside it, the Runs table and the sidebar each read the run at a
    different moment otherwise, and told different step counts (225 in a table, 799 in the chart below it).
    """

    path: str
    serial: int
    """Counts the snapshots of the run that saw new records: the pulls' cache key and the pages' change mark."""
    status: str
    """``live``, ``finished`` or ``stopped`` (``list_runs``' rule)."""
    steps: int
    """Steps recorded: the most any rank has reported (its rank file, written at each flush)."""
    as_of_ns: int
    """When the newest rank file was written (its heartbeat): the run as of then."""
    started_ns: int
    diagnosis: dict | None = None
    error: str | None = None
    """Why the verdict could not be made (one line), when it could not."""
    cost_s: float = 0.0
    """CPU seconds this snapshot took the server (reading what was new, the verdict)."""
    verdict_steps: int = 0
    """The run's steps when its verdict was made (``steps`` where this snapshot made it; fewer where it kept an
    earlier one, ``REJUDGE_GROWTH``)."""
    verdict_as_of_ns: int = 0
    """The ``as_of_ns`` of the snapshot that made the verdict."""

    @property
    def key(self) -> tuple:
        return (self.path, self.serial, self.status)

    def run_fields(self) -> dict:
        """The ``list_runs`` fields this snapshot knows better (taken at the same moment as the verdict)."""
        return {
            "status": self.status,
            "steps": self.steps,
            "last_update_ns": self.as_of_ns,
            "duration_s": max(0, self.as_of_ns - self.started_ns) / 1e9,
        }


class _Follower:
    """What the server keeps of one run between refreshes: its reading, its rollup and its last snapshot."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.signature: tuple | None = None
        self.checked = -1e9
        self.made_at = -1e9  # when the last snapshot was made (monotonic), and the process's CPU time then
        self.cpu_at = 0.0
        self.ranks_stamp: tuple = ()  # the rank files' names and mtimes when ``_ended`` last read them
        self.ended_metas: list | None = None
        self.snap: Snapshot | None = None
        self.metas: list = []
        self.kept: KeptRows | None = None  # the rows read so far: each refresh takes in only the new segments
        self.run = None  # or, for a run too big to keep or compacted, its own reading, kept
        self.listing = RunListing(path)  # its folders' names: each refresh lists again only those that changed
        self._rollup: Rollup | None = None

    def rollup(self) -> Rollup:
        """The run's rollup: built the first time a page needs it, then brought up to date by ``snapshot``."""
        with self.lock:
            if self._rollup is None:
                _warm.release(self.path)  # a page needs it: the warm-up builds it now, not after the landing page
                self._rollup = _rollup(self.path)
                self._rollup.refresh()
                _one_thread(self._rollup)
            return self._rollup

    def close(self) -> None:
        """Let go of the kept rows (the rollup stays in ``_rollup``'s cache, which bounds it)."""
        with self.lock:
            if self.kept is not None:
                self.kept.close()
                self.kept = None


def _one_thread(rollup: Rollup) -> None:
    """Run the rollup's later queries (the pulls, each refresh's fold) on one DuckDB thread, its first build
    done. Why: a second thread makes the same query cost more CPU, and more the bigger the table; at 1,024
    ranks the pulls of one refresh cost 0.096 CPU-s at 1,000 steps and 0.224 at 8,000 with DuckDB's threads,
    0.098 and 0.128 with one (2 cores, idle otherwise), for a few ms of wall time each. The server is a
    guest of the job: its CPU counts, not its wall time (``SERVER_CPU_SHARE``)."""
    import duckdb

    try:
        rollup.con.execute("SET threads = 1")
    except duckdb.Error:  # a connection that does not take it keeps DuckDB's threads: more CPU, same figures
        pass


FOLLOWED_AT_MOST = 8
"""Runs the server keeps a follower for (the least recently asked for is dropped), as ``_rollup`` keeps 8."""
_followers: OrderedDict[str, _Follower] = OrderedDict()
_followers_lock = threading.Lock()


def _follower(path: str) -> _Follower:
    with _followers_lock:
        f = _followers.get(path)
        if f is None:
            f = _followers[path] = _Follower(path)
            while len(_followers) > FOLLOWED_AT_MOST:
                _followers.popitem(last=False)[1].close()
        _followers.move_to_end(path)
        return f


def current(run_path: str) -> Snapshot:
    """The run's latest snapshot, without looking at its files: what the rest of a page run draws, so every
    part of it shows the refresh its clock shows (``snapshot`` where there is none yet)."""
    f = _follower(run_path)
    return f.snap if f.snap is not None else snapshot(run_path)


LISTING_SLACK_NS = 2_000_000_000
"""How close to now a folder's mtime may be for its listing to be taken again at the next look (``FolderListing``):
above the coarsest mtime tick of a filesystem the run may live on (1 s on some network ones) and the clock
skew between a shared filesystem's server and this host."""


class FolderListing:
    """The names in one folder, listed again only when the folder may have changed since its last listing.

    Why: a live run's dashboard looks at the run's folders at every refresh, and a spool folder holds a file per
    node (or rank) and flush: listing every folder and looking at each name again in Python cost more the longer
    the run (benchmarks/results/cpu_dashboard_live_history.md). A folder whose mtime (with its device and inode)
    is what it was at a listing taken more than ``LISTING_SLACK_NS`` after that mtime has the same entries: an
    entry added, removed or renamed since would have moved the mtime past it. A folder changed within the slack
    is listed again at every look, so a change in the same mtime tick as the listing is never missed. Where it
    is listed again, the names are compared as sets (in C), and ``keep`` is asked of the added names alone.
    """

    __slots__ = ("path", "names", "_keep", "_all", "_stamp", "listings")

    def __init__(self, path: str, keep: Callable[[str], bool] | None = None) -> None:
        self.path = path
        self.names: frozenset[str] = frozenset()
        """The names the last look found that ``keep`` keeps (a new object only when they changed)."""
        self._keep = keep
        self._all: frozenset[str] = frozenset()  # every name of the last listing
        self._stamp: tuple[int, int, int] | None = None  # (device, inode, mtime_ns) of a listing that can be trusted
        self.listings = 0  # how often the folder was listed (the tests count them)

    def look(self) -> bool:
        """Bring ``names`` up to date (one ``stat``; a listing only where the folder may have changed); True
        when they changed."""
        now = time.time_ns()  # before the stat: a change after it moves the mtime past ``now - slack``
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._all = None, frozenset()
            changed, self.names = bool(self.names), frozenset()
            return changed
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if stamp == self._stamp:
            return False
        try:
            found = frozenset(os.listdir(self.path))
        except OSError:
            found, stamp = frozenset(), None
        self.listings += 1
        self._stamp = stamp if st.st_mtime_ns < now - LISTING_SLACK_NS else None
        added = found - self._all
        # Names gone (a compaction, a prune) show in the counts; only then is the old listing gone through.
        removed = self._all - found if len(self._all) + len(added) != len(found) else frozenset()
        self._all = found
        if self._keep is not None:
            added = frozenset(n for n in added if self._keep(n))
        removed &= self.names
        if not added and not removed:
            return False
        self.names = (self.names - removed if removed else self.names) | added
        return True


def _is_segment(name: str) -> bool:
    """What the readers' glob matches: ``*.parquet`` not starting with a dot (renamed into place whole)."""
    return name.endswith(SPOOL_SUFFIX) and not name.startswith(".")


class RunListing:
    """A run's record folders, each a ``FolderListing`` of its segments, kept by the run's follower."""

    def __init__(self, path: str) -> None:
        self.folders = {kind: FolderListing(os.path.join(path, kind), _is_segment) for kind in KINDS}

    def look(self) -> dict[str, frozenset[str]]:
        """kind -> the segment names in its folder now."""
        for folder in self.folders.values():
            folder.look()
        return {kind: folder.names for kind, folder in self.folders.items()}


def run_listing(path: str, kept: RunListing | None = None) -> tuple[tuple, dict[str, frozenset[str]]]:
    """(signature, kind -> segment names) of the run's files, no file opened: each record folder listed again only
    where it may have changed since ``kept`` last looked (``FolderListing``; a new one lists them all). Segments
    appear whole under a new name and never change, so their names say what arrived; rank files are rewritten in
    place (sizes and mtimes), the store renamed into place. Equal signatures: nothing was written."""
    names = (kept or RunListing(path)).look()
    stats = []
    for sub, only in ((os.path.join(path, RANKS_DIR), None), (path, os.path.basename(store_path(path)))):
        try:
            with os.scandir(sub) as it:
                for e in it:
                    if (only is None or e.name == only) and not e.name.startswith("."):
                        st_ = e.stat()
                        stats.append((e.name, st_.st_size, st_.st_mtime_ns, st_.st_ino))
        except OSError:
            pass
    # The name sets themselves: one unchanged is the same object (compared in O(1)), one changed a new one.
    signature = (tuple(sorted(stats)), tuple(names.values()))
    return signature, names


def _status(metas: list) -> str:
    now = time.time_ns()
    if any(rank_is_live(m, now) for m in metas):
        return "live"
    return "finished" if metas and all(m.status == "finished" for m in metas) else "stopped"


SERVER_CPU_SHARE = 0.04
"""The share of one core the dashboard server holds itself to while it follows a live run: a run's files are
looked at again only once the server's CPU since its last snapshot (that snapshot, the pulls and page runs it
caused in every tab, the clocks' ticks) averages under this share, or ``HOLD_AT_MOST`` refresh intervals
have passed. Why: a dashboard on a training node is a guest; where watching costs more than that, the pages
refresh less often (the clock says how old their figures are) rather than slow the job down."""
REJUDGE_GROWTH = 0.10
"""A live run's verdict is made again once the run has grown by this share of the steps the last one rests on
(from 8,000 steps: at 8,800); the snapshots between keep it, and the Verdict page says which step it is from
(``verdict_note``). Why: a verdict reads every step of the run (its per-step figures, its medians), so
making it at every refresh cost more the longer the run: at 1,024 ranks a refresh that makes it 0.36 CPU-s at
1,000 steps and 0.69 at 8,000, one that keeps it 0.11 and 0.17. Made once per 10 % of growth (a verdict of N
steps spread over the refreshes of 0.1 N steps), the server's CPU per refresh over a verdict's cycle is
0.14-0.18 from 1,000 to 8,000 steps (docs/dashboard.md). A run that ended, or whose verdict could not be
made, is judged at once: a finished run's verdict is the one ``ranksight diagnose`` gives of the same steps."""
HOLD_AT_MOST = 60
"""Refresh intervals a new snapshot is held back at most (``SERVER_CPU_SHARE``): 2 minutes at the default 2 s,
where one refresh costs more than 4.8 CPU-s (at 1,024 ranks one that makes the verdict cost 0.36-0.69 CPU-s from
1,000 to 8,000 steps on 2 cores, one that keeps it 0.11-0.17, docs/dashboard.md)."""


def _ended(f: _Follower, run_path: str) -> bool:
    """Whether a live run's rank files now say it ended: its last snapshot is not held back by the budget, so
    the end shows on every page at once. Reads the rank files only when one changed (one listing)."""
    if f.snap is None or f.snap.status != "live":
        return False
    ranks = os.path.join(run_path, RANKS_DIR)
    try:
        stamp = tuple(sorted((e.name, e.stat().st_mtime_ns) for e in os.scandir(ranks)))
    except OSError:
        return False
    if stamp == f.ranks_stamp:
        return False
    f.ranks_stamp = stamp
    metas = read_rank_meta(run_path)
    if _status(metas) == "live":
        return False
    f.ended_metas = metas
    return True


def snapshot(run_path: str, refresh_s: float | None = None) -> Snapshot:
    """The run as of its latest refresh, shared by every tab: its files looked at at most once per
    ``refresh_s`` (held back further by ``SERVER_CPU_SHARE``), re-read only when they changed
    (``run_listing``); the rollup takes in the new segments and the verdict is made again from the kept rows,
    in the same refresh as the clock it is shown with. ``refresh_s`` 0: look at the files now."""
    f = _follower(run_path)
    gap = refresh_s if refresh_s is not None else _source.from_env().refresh_s
    with f.lock:
        now = time.monotonic()
        if f.snap is not None and gap:
            since = now - f.made_at
            busy = since < HOLD_AT_MOST * gap and time.process_time() - f.cpu_at > SERVER_CPU_SHARE * since
            if now - f.checked < gap or (busy and not _ended(f, run_path)):
                return f.snap
        f.checked = now
        sig, listing = run_listing(run_path, f.listing)
        if f.snap is not None and sig == f.signature:
            status = _status(f.metas)  # a heartbeat can go stale without a file changing
            if status != f.snap.status:
                f.snap = replace(f.snap, serial=f.snap.serial + 1, status=status)
            return f.snap
        cpu = time.process_time()
        f.made_at, f.cpu_at = now, cpu
        f.signature = sig
        f.metas = metas = f.ended_metas or read_rank_meta(run_path)
        f.ended_metas = None
        if f._rollup is not None:
            f._rollup.refresh(listing)  # the names just listed: no second listing of every segment
        status = _status(metas)
        steps = max((m.steps for m in metas), default=0)
        as_of = max((m.heartbeat_ns for m in metas), default=0)
        prev = f.snap
        if _rejudge(prev, status, steps):
            diagnosis, error = _diagnose(f, listing, status == "live")
            verdict_steps, verdict_as_of = steps, as_of
        else:  # the run has not grown by REJUDGE_GROWTH since its verdict: kept, and the page says from when
            diagnosis, error = prev.diagnosis, prev.error
            verdict_steps, verdict_as_of = prev.verdict_steps, prev.verdict_as_of_ns
        if status != "live":
            f.close()  # its last verdict is made: a run that no longer grows needs no rows kept in memory
        started = min((m.data["started_ns"] for m in metas if "started_ns" in m.data), default=0)
        f.snap = Snapshot(
            path=run_path,
            serial=(prev.serial + 1) if prev is not None else 1,
            status=status,
            steps=steps,
            as_of_ns=as_of,
            started_ns=started or as_of,
            diagnosis=diagnosis,
            error=error,
            # the process's CPU meanwhile (DuckDB's threads too; another tab's page run would count: an upper bound)
            cost_s=time.process_time() - cpu,
            verdict_steps=verdict_steps,
            verdict_as_of_ns=verdict_as_of,
        )
        return f.snap


def _rejudge(prev: Snapshot | None, status: str, steps: int) -> bool:
    """Whether this snapshot makes the verdict again (``REJUDGE_GROWTH``): the first, one of a run that is not
    live, one after a verdict that could not be made, or the run grown by that share since the last one."""
    if prev is None or status != "live" or prev.diagnosis is None:
        return True
    return steps >= rejudge_at(prev.verdict_steps)


def rejudge_at(verdict_steps: int) -> int:
    """The run's step from which a live run's verdict of ``verdict_steps`` is made again (``REJUDGE_GROWTH``)."""
    return verdict_steps + max(1, math.ceil(round(REJUDGE_GROWTH * verdict_steps, 6)))


def _diagnose(f: _Follower, listing: dict[str, frozenset[str]], live: bool) -> tuple[dict | None, str | None]:
    """The rules' verdict (``ranksight.rules.diagnose``) on a live run's rows the follower keeps (``_kept``),
    after taking in the segments in ``listing`` it has not read; on the run's own reading, brought up to date,
    for a run that does not grow, is too big to keep, or was compacted into a store. A warm-up's verdict of
    exactly these segments is taken instead of the first."""
    import duckdb

    from ranksight.rules import RuleError, diagnose

    try:
        rows = sum(m.steps for m in f.metas)  # step rows the ranks say they wrote, before any is read
        keep = live and rows <= KEEP_STEP_ROWS and KeptRows.suits(f.path)
        if f.kept is None and f.run is None:
            warm = _warm.finished(f.path)  # waits for the server's warm-up rather than diagnosing twice
            made = _warm.take_diagnosis(f.path, spool_signature(f.path)) if warm is not None else None
            if made is not None and not keep:
                return made, None
        if f.kept is not None and not keep:
            f.close()  # too big to keep, compacted, or no longer live: judged from the files from now on
        if keep:
            if f.kept is None:
                f.kept = KeptRows(f.path)
            f.kept.take_in(listing)
            return diagnose(f.kept.run()), None
        if f.run is None:
            f.run = open_run(f.path, follow_spool=False, incremental=True)
        else:
            f.run.refresh()
        return diagnose(f.run), None
    except (RunDirError, RuleError, duckdb.Error, OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, first


def diagnosis(run_path: str) -> dict:
    """The rules' verdict on the run as of its latest ``snapshot`` (``ranksight.rules.diagnose``).

    Raises ``RunDirError`` with the reason when the verdict could not be made (a run with nothing recorded yet).
    """
    snap = current(run_path)
    if snap.diagnosis is None:
        raise RunDirError(snap.error or f"{run_path}: no verdict yet")
    return snap.diagnosis


def provisional_note(run_path: str) -> str | None:
    """'provisional: rests on 3 steps after warm-up ...' when the live run's verdict rests on fewer steps than
    the rules' stated minimum (``rules._provisional``, the floor ``ranksight diagnose`` uses too); else None."""
    from ranksight.rules import provisional, provisional_text

    snap = current(run_path)
    steps = provisional(snap.diagnosis) if snap.diagnosis is not None and snap.status == "live" else None
    return None if steps is None else provisional_text(steps)


def verdict_note(run_path: str) -> str | None:
    """'verdict of step 7360 (as of 09:11:40); made again from step 8096' when the run's latest snapshot kept
    an earlier verdict (``REJUDGE_GROWTH``); None when the verdict is of the step the clock shows."""
    snap = current(run_path)
    if snap.diagnosis is None or snap.verdict_steps == snap.steps:
        return None
    clock = time.strftime("%H:%M:%S", time.localtime(snap.verdict_as_of_ns / 1e9))
    return (
        f"verdict of step {snap.verdict_steps} (as of {clock}); made again from step {rejudge_at(snap.verdict_steps)}, "
        f"as the run grows by {REJUDGE_GROWTH:.0%}"
    )


def prometheus_snapshot(url: str) -> dict:
    """Runs and the latest per-rank values from a Prometheus server (multi-node jobs)."""
    from ranksight.collectors import PrometheusReader

    reader = PrometheusReader(url, timeout_s=5.0)
    runs_ = reader.runs()
    return {"runs": runs_, "ranks": {r: reader.rank_snapshot(r) for r in runs_[:5]}, "at": time.time()}


__all__ = [
    "RunDirError",
    "diagnosis",
    "prometheus_snapshot",
    "verdict_note",
    "pull",
    "rollup",
    "runs",
    "skipped",
    "snapshot",
    "Snapshot",
]
