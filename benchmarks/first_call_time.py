"""A fresh process's first reader call (``diagnose()``, ``open_run`` + ``step_breakdown``, the dashboard's rollup
build): where its time goes, two versions of the readers side by side, and the call beside DuckDB's floor.

Why fresh processes: a CLI call or a new dashboard server pays the first call, with no part of the run read
before; and on this VM the same first call takes 0.6 s in one hour and 1.2 s in another with the same code,
so a figure is judged only against another measured in the same rounds.

``RUN [--what diagnose|breakdown] [--processes 8] [--site OLD]``
    Wall, user and system (kernel page faults) seconds of the call, and of the reader's steps (``open_run``'s
    views, the rank files, the breakdown with its wait for the digests' parts, reading and merging those parts
    on their thread, the per-rank medians, the features, the context, the rules), and the bytes in memory of
    each digest part it read; of an installed older commit with ``--site``. (The rules evaluated rank by rank
    against over the columns, ``--rules both`` and ``--rules-only``, settled the columns' evaluator: at commit
    e9426fd.)
``RUN --old-site OLD [--what breakdown,diagnose,rollup] [--rounds 5] [--repeats 3] [--write-old-digests]``
    Two versions on one run folder, each round running the older and this checkout's readers one after the
    other in fresh processes (the first call of each, and ``--repeats - 1`` later calls); medians compared.
    OLD is an installed copy of an older commit, outside the checkout::

        git worktree add /tmp/ranksight-old COMMIT
        pip install --no-deps --no-build-isolation --target /tmp/ranksight-old-site /tmp/ranksight-old

    RUN needs the step digests of both versions' definitions where their keys differ (a digest is read only
    under its own key): ``--write-old-digests`` writes the older one's first.

``RUN --publishes N --into DIR [...]`` times a copy of RUN whose node step files are cut into N publishes each
(a live job's node publishes about once a minute).

``scale.py --sections first`` runs ``first_call_figures``: these first calls at 10,000 ranks taking turns with
DuckDB's GROUP BY over the same files.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from _harness import cli, fresh_process, in_rounds, machine_load, write_results

HERE = os.path.dirname(os.path.abspath(__file__))

_CALL = r"""
import functools, json, resource, sys, time
old_site, run, what, repeats, rules = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
if old_site:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]  # not the checkout's finder
    sys.path.insert(0, old_site)
import duckdb, pyarrow  # imported before the clock starts, as in a reader that has run before
from ranksight.collectors import open_run
from ranksight.collectors._queries import step_breakdown  # an older version has it there too
from ranksight.rules import diagnose
if what == "rollup":
    from ranksight.dashboard import Rollup
steps, part_bytes, digested = {}, {}, None
if rules:  # where the call goes: the reader's steps that vary most, timed in place
    from ranksight.collectors import _digest_fold, _digest_queries, _run
    from ranksight.rules import _diagnose

    def timed(module, name, label):
        inner = getattr(module, name)

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            try:
                out = inner(*args, **kwargs)
                if name == "read_digest_parts":  # bytes in memory of each part (the per-step part: its largest)
                    for part, table in out.items():  # added up over the batches of one reading
                        part_bytes[part] = part_bytes.get(part, 0) + table.nbytes
                return out
            finally:
                after = resource.getrusage(resource.RUSAGE_SELF)
                wall, system = steps.get(label, (0.0, 0.0))
                steps[label] = (wall + time.perf_counter() - start, system + after.ru_stime - before.ru_stime)

        setattr(module, name, wrapper)

    timed(_run, "open_views", "open_run's views (footer checks)")
    timed(_run, "read_rank_meta", "rank files")
    timed(_run, "step_breakdown", "breakdown (waits for the parts)")
    timed(_run, "compute_features", "features")
    timed(_run, "compute_context", "context")
    timed(_digest_fold, "read_digest_parts", "read digest parts")
    timed(_digest_fold, "_merged", "merge per-step part")
    timed(_digest_queries, "_rows_medians", "per-rank medians (rows; a rank in several files)")
    timed(_diagnose, "evaluate", "rules")
    timed(_diagnose, "run_checklist", "checklist")
times = []
for _ in range(repeats):
    before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if what == "breakdown":
        con = open_run(run, follow_spool=False)
        step_breakdown(con)
        con.close()
    elif what == "rollup":  # the dashboard's first build of a run
        rollup = Rollup(run)
        digested = getattr(rollup, "digested", None)
        rollup.close()
    else:
        diagnose(run)
    times.append(time.perf_counter() - t)
    if len(times) == 1:  # the first call's own CPU
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {"user_s": after.ru_utime - before.ru_utime, "system_s": after.ru_stime - before.ru_stime}
import ranksight
print(json.dumps({"times": times, "module": ranksight.__file__, "digested": digested, "rules": rules,
                  "wall_s": times[0], **cpu,
                  "steps": {k: {"wall_s": w, "system_s": s} for k, (w, s) in steps.items()},
                  "part_bytes": part_bytes}))
"""

_WRITE_DIGESTS = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path[:0] = [sys.argv[1], sys.argv[3]]  # the older version first, then this folder's scripts
from digest_verdict_corpus import digest_every_segment  # the publisher's digest beside every step segment
digest_every_segment(sys.argv[2])
"""


_OLD_DIGESTS_READY = r"""
import os, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, sys.argv[1])
from ranksight.format.digest import chunk_steps_for, digest_paths
steps, ranks = os.path.join(sys.argv[2], "steps"), int(sys.argv[3])
names = [n for n in os.listdir(steps) if n.endswith(".parquet") and not n.startswith(".")]
print(len(digest_paths(steps, chunk_steps_for(ranks), names)) == len(names))
"""


def with_old_digests(run: str, old_site: str, ranks: int) -> None:
    """Write the older version's digests beside ``run``'s files unless they are there: a digest is read only
    under its own definition's key, so an older reader would read the rows of a spool this code built."""
    ready = subprocess.run(
        [sys.executable, "-c", _OLD_DIGESTS_READY, old_site, run, str(ranks)], check=True, capture_output=True
    )
    if ready.stdout.strip() != b"True":
        subprocess.run([sys.executable, "-c", _WRITE_DIGESTS, old_site, run, HERE], check=True)


def measure(old_site: str, run: str, what: str, repeats: int = 1, rules: str = "") -> dict:
    """``what`` ("breakdown", "diagnose" or "rollup") on ``run`` ``repeats`` times in one fresh process, the
    older version's (``old_site``) or, with "", this checkout's: {"times": each call's seconds, "module":
    where ranksight came from, "wall_s"/"user_s"/"system_s" of the first call, ...}; with ``rules``
    ("columns" or "per-rank"), the seconds of the reader's steps under "steps" too."""
    return fresh_process(_CALL, old_site, run, what, repeats, rules)


def first_calls_s(run: str, what: str, processes: int) -> list[float]:
    """The first call of ``what`` on ``run`` in each of ``processes`` fresh processes of this checkout."""
    return [measure("", run, what)["times"][0] for _ in range(processes)]


# ------------------------------------------------------------------ where the first call goes


def _medians(calls: list[dict]) -> dict:
    out = {k: statistics.median(c[k] for c in calls) for k in ("wall_s", "user_s", "system_s")}
    for label in sorted({label for c in calls for label in c["steps"]}):
        times = [c["steps"][label]["wall_s"] for c in calls if label in c["steps"]]
        out[f"{label}_s"] = statistics.median(times)
    return out


def where_it_goes(run: str, what: str, processes: int, site: str = "") -> dict:
    """``processes`` fresh first calls, each with its steps; of this checkout, or of the installed copy ``site``."""
    calls = [{"load": machine_load(), **measure(site, run, what, 1, "columns")} for _ in range(processes)]
    assert all((site in c["module"]) if site else "site-packages" not in c["module"] for c in calls)
    for call in calls:
        parts = ", ".join(f"{k} {v['wall_s']:.3f} s ({v['system_s']:.3f} system)" for k, v in call["steps"].items())
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in call["part_bytes"].items())
        print(f"{call['wall_s']:.3f} s: user {call['user_s']:.3f}, system {call['system_s']:.3f}; {parts}; {sizes}")
    medians = _medians(calls)
    print("medians: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    return {"run": run, "what": what, "site": site or None, "medians": medians, "calls": calls}


# ------------------------------------------------------------------ two versions taking turns


def compare_versions(run: str, old_site: str, whats: list[str], rounds: int, repeats: int) -> dict:
    """Each of ``whats`` by the older version and this checkout, one after the other in every round."""
    results: dict = {"run": run, "old_site": old_site, "rounds": rounds, "repeats": repeats}
    sites = {"older": old_site, "newer": ""}
    for what in whats:
        runs = in_rounds(sites, rounds, lambda version, _, what=what: measure(sites[version], run, what, repeats))
        loads = [r["load"] for r in runs["older"]]
        assert all(old_site in r["module"] for r in runs["older"])
        assert not any(old_site in r["module"] for r in runs["newer"])
        figures = {}
        for version, each in runs.items():
            first = [r["times"][0] for r in each]
            later = [t for r in each for t in r["times"][1:]]
            figures[version] = {
                "first_call_median_s": statistics.median(first),
                "later_calls_median_s": statistics.median(later) if later else None,
                "first_calls_s": first,
                "later_calls_s": later,
            }
        older, newer = figures["older"], figures["newer"]
        figures["newer_over_older_first"] = newer["first_call_median_s"] / older["first_call_median_s"]
        if older["later_calls_median_s"]:
            figures["newer_over_older_later"] = newer["later_calls_median_s"] / older["later_calls_median_s"]
        results[what] = {**figures, "loads": loads}
        print(
            f"{what}: first call {older['first_call_median_s']:.3f} s -> {newer['first_call_median_s']:.3f} s; "
            f"later calls {older['later_calls_median_s'] or 0:.3f} s -> {newer['later_calls_median_s'] or 0:.3f} s",
            flush=True,
        )
    return results


# ------------------------------------------------------------------ beside DuckDB's floor (scale.py's `first`)

FLOOR_SQL = "SELECT rank, median(step_s), avg(step_s) FROM read_parquet('{glob}') GROUP BY rank"
"""DuckDB's floor for a verdict over step files: the per-rank median and mean of the step time in one pass."""

_FLOOR = r"""
import json, sys, time
import duckdb  # imported before the clock starts, as in the readers' fresh processes
con = duckdb.connect()
times = []
for _ in range(3):
    t = time.perf_counter()
    con.execute(sys.argv[1]).fetchall()
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times}))
"""


def fresh_floor_s(glob: str) -> list[float]:
    """``FLOOR_SQL`` over the files of ``glob`` three times on one connection of a fresh process: the first
    reads the footers, the next two what a repeated query costs (``scale.py``'s floors are such a median)."""
    return fresh_process(_FLOOR, FLOOR_SQL.format(glob=glob))["times"]


def _spool_ready(run_path: str, ranks: int) -> bool:
    """Whether ``run_path`` holds a node spool of ``ranks`` that ``build_spool`` wrote with this code's digests
    (a file per node of 8 and a digest for each, with its file's card; a rank file per node), so that a kept
    ``--dir`` is read again instead of rebuilt."""
    from ranksight.format.digest import chunk_steps_for, digest_paths
    from ranksight.format.digest_file import read_card

    steps_dir = os.path.join(run_path, "steps")
    try:
        names = [n for n in os.listdir(steps_dir) if n.endswith(".parquet") and not n.startswith(".")]
    except OSError:
        return False
    nodes = -(-ranks // 8)
    found = digest_paths(steps_dir, chunk_steps_for(ranks), names)
    node_rank_file = os.path.join(run_path, "ranks", "node-node0000.json")
    return (
        len(names) == nodes
        and len(found) == nodes
        and read_card(next(iter(found.values()))) is not None
        and os.path.exists(node_rank_file)
    )


def node_spool(base: str, ranks: int, steps: int, build_spool) -> str:
    """The node spool of ``ranks`` x ``steps`` under ``base`` (``build_spool``, ``scale.py``'s: a file per node of
    8 with its digest), built unless a kept one is ready: the first and live sections read the same folder."""
    run_path = os.path.join(base, f"first-{ranks}x{steps}", "bench-run")
    if not _spool_ready(run_path, ranks):
        import shutil

        shutil.rmtree(os.path.dirname(run_path), ignore_errors=True)
        build_spool(run_path, ranks, steps, per_node=True)
    return run_path


JOB_RANK_ENTRY = {
    "job": "bench",
    "run": "bench-run",
    "hostname": "bench-host",
    "framework": "plain",
    "data_source": "loader",
    "schema_version": 1,
    "flush_interval_s": 2.0,
    "started_ns": 1,
    "counters": {"records_dropped_total": 0, "agent_errors_total": 0, "rows_spooled_total": 1000},
    "model": {"class": "GPT", "parameter_bytes": 497_664_000, "devices": ["cpu"]},
    "optimizer": {"class": "AdamW", "states_per_param": 2},
    "ddp": {"backend": "gloo", "bucket_cap_bytes": 26_214_400, "find_unused_parameters": False,
            "static_graph": False, "gradient_as_bucket_view": False},
    "ddp_logging": {"iteration": 1000, "unused_parameter_size": 0},
    "loader": {"class": "DataLoader", "num_workers": 4, "pin_memory": True, "batch_size": 32,
               "prefetch_factor": 2, "persistent_workers": True},
    "host": {"cpu_count": 96, "cpus_allowed": 96, "torch_threads": 12, "local_world_size": 8, "load_avg_1m": 30.5},
}  # fmt: skip
"""The sections the agent writes into a DDP rank's entry beyond its identity (a CPU job on gloo here): what a
job's rank files hold, where the benchmark's own entries hold five fields."""


def with_job_rank_entries(run: str) -> str:
    """A sibling of ``run`` (``<run>-job``: its step files and digests hard links, made once) whose node rank
    files give every rank ``JOB_RANK_ENTRY``'s sections: a job's first verdict reads and checks those (0.22 s
    against 0.05 s for 1,250 node files)."""
    import json
    import shutil

    into = run.rstrip("/") + "-job"
    ranks_dir = os.path.join(into, "ranks")
    if not os.path.isdir(ranks_dir):
        shutil.rmtree(into, ignore_errors=True)
        shutil.copytree(run, into, copy_function=os.link)
        for name in sorted(os.listdir(ranks_dir)):
            path = os.path.join(ranks_dir, name)
            with open(path) as f:
                node = json.load(f)
            node["ranks"] = [{**JOB_RANK_ENTRY, **meta, "node": node["node"]} for meta in node["ranks"]]
            os.remove(path)  # a link to the other run's file: written anew
            with open(path, "w") as f:
                json.dump(node, f)
    return into


def first_call_figures(
    base: str, ranks: int, steps: int, rounds: int, build_spool, old_site: str | None = None, job_ranks: bool = False
) -> dict:
    """The first calls of fresh processes on a node spool of ``ranks`` x ``steps`` (``build_spool``,
    ``scale.py``'s: a file per node of 8 with its digest, as the node spool publishes them) beside DuckDB's
    GROUP BY over the same files, ``rounds`` rounds taking turns; medians and each round's figures. With
    ``job_ranks`` the rank files hold a job's sections (``with_job_rank_entries``)."""
    run_path = node_spool(base, ranks, steps, build_spool)
    if job_ranks:
        run_path = with_job_rank_entries(run_path)
    glob = os.path.join(run_path, "steps", "[!.]*.parquet")
    calls = {"duckdb_groupby_files": lambda: {"times": fresh_floor_s(glob)},
             "diagnose_first_s": lambda: measure("", run_path, "diagnose"),
             "breakdown_first_s": lambda: measure("", run_path, "breakdown")}  # fmt: skip
    if old_site:
        with_old_digests(run_path, old_site, ranks)
        calls["diagnose_first_before_s"] = lambda: measure(old_site, run_path, "diagnose")
    runs = in_rounds(calls, rounds, lambda arm, _: calls[arm](), lambda _, x: " ".join(f"{t:.3f}" for t in x["times"]))
    floors = [r["times"] for r in runs.pop("duckdb_groupby_files")]
    each = {"duckdb_groupby_files_s": [statistics.median(f) for f in floors],
            "duckdb_groupby_files_first_s": [f[0] for f in floors],
            **{name: [r["times"][0] for r in rs] for name, rs in runs.items()}}  # fmt: skip
    figures: dict = {"ranks": ranks, "steps": steps, "rows": ranks * steps, "files": -(-ranks // 8),
                     "rounds": rounds, "old_site": old_site,
                     "rank_entries": "job" if job_ranks else "five fields"}  # fmt: skip
    figures.update({name: statistics.median(values) for name, values in each.items()})
    figures["each"] = each
    return figures


def as_publishes(run: str, into: str, publishes: int) -> str:
    """A copy of ``run`` at ``into`` whose node step files are each cut by step into ``publishes`` files, with
    this checkout's digests; its path. Why: the benchmark spools hold one publish per node, but a live job's
    node publishes about once a minute, so its ranks' rows lie in several files."""
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from digest_verdict_corpus import digest_every_segment

    from ranksight.agent._node_spool import published_name

    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(run, into, ignore=shutil.ignore_patterns(".digests"))
    steps = os.path.join(into, "steps")
    for name in sorted(n for n in os.listdir(steps) if n.endswith(".parquet")):
        table = pq.read_table(os.path.join(steps, name))
        lo, hi = pc.min(table["step"]).as_py(), pc.max(table["step"]).as_py() + 1
        os.remove(os.path.join(steps, name))
        for k in range(publishes):
            a, b = lo + (hi - lo) * k // publishes, lo + (hi - lo) * (k + 1) // publishes
            part = table.filter(pc.and_(pc.greater_equal(table["step"], a), pc.less(table["step"], b)))
            pq.write_table(part, os.path.join(steps, published_name(name.split("_m")[0], f"{k + 1:020d}-a{k:05d}")))
    digest_every_segment(into)
    return into


def main() -> int:
    parser = cli(__doc__)
    parser.add_argument("run")
    parser.add_argument("--what", default=None, help="diagnose (default), breakdown; with --old-site also rollup")
    parser.add_argument("--processes", "--rounds", dest="rounds", type=int, default=None)
    parser.add_argument("--old-site", default=None, help="pip install --target folder of an older commit")
    parser.add_argument("--site", default="", help="where the call goes for that folder's commit instead")
    parser.add_argument("--repeats", type=int, default=3, help="--old-site: calls per process (the first is fresh)")
    parser.add_argument("--write-old-digests", action="store_true")
    parser.add_argument("--publishes", type=int, default=None, help="time a copy of RUN cut into N publishes a node")
    parser.add_argument("--into", default=None, help="--publishes: where the copy is made (replaced)")
    args = parser.parse_args()
    if args.publishes:
        if not args.into:
            parser.error("--publishes needs --into DIR")
        args.run = as_publishes(args.run, args.into, args.publishes)
    if args.old_site:
        whats = (args.what or "breakdown,diagnose").split(",")
        if not set(whats) <= {"breakdown", "diagnose", "rollup"}:
            parser.error(f"--what: {args.what!r} (breakdown, diagnose, rollup)")
        if args.write_old_digests:
            subprocess.run([sys.executable, "-c", _WRITE_DIGESTS, args.old_site, args.run, HERE], check=True)
        rounds = args.rounds or 5
        out = compare_versions(args.run, args.old_site, whats, rounds, args.repeats)
        arms = ["older", "newer"]
    else:
        if (args.what or "diagnose") not in ("diagnose", "breakdown"):
            parser.error("--what: diagnose or breakdown")
        rounds = args.rounds or 8
        out, arms = where_it_goes(args.run, args.what or "diagnose", rounds, args.site), None
    if args.json:
        write_results(args.json, out, arms=arms, rounds=rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
