"""What reading a run through many per-node stores costs (``<run>/nodes/*.duckdb``, the multi-node path without a
shared filesystem, docs/scale.md), against absorbing them into one store first (``ingest --nodes``).

One node's store is made the way a node makes it (8 ranks' node spool, ``ingest``), then copied under
``--counts`` node names into a head's run folder: copies, not distinct nodes, so the figures are what
``open_run`` pays per attached store (an ATTACH, its catalog, one more SELECT in each view), not a verdict.
Each count is timed in fresh processes: ``open_run`` + ``step_breakdown``, then ``ingest --nodes`` (absorbing
them) and the same read of the one store it leaves.

Usage: ``python benchmarks/node_stores.py [--counts 16,128,1250] [--steps 1000] [--dir DIR] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _harness import write_results  # noqa: E402
from first_call_time import first_calls_s  # noqa: E402

PROCESSES = 3


def node_store(base: str, steps: int) -> str:
    """One node's store: 8 ranks x ``steps`` in a node spool file, ingested where the node ran."""
    sys.path.insert(0, HERE)
    from scale import build_spool

    from ranksight.collectors import ingest

    run = os.path.join(base, "node", "bench-run")
    build_spool(run, 8, steps, per_node=True)
    ingest(run)
    return os.path.join(run, "store.duckdb")


def head_with_copies(base: str, store: str, count: int) -> str:
    """A head's run folder holding ``count`` copies of ``store`` under node names, and its rank files."""
    run = os.path.join(base, f"head-{count}", "bench-run")
    shutil.rmtree(os.path.dirname(run), ignore_errors=True)
    os.makedirs(os.path.join(run, "nodes"))
    shutil.copytree(os.path.join(os.path.dirname(store), "ranks"), os.path.join(run, "ranks"))
    for i in range(count):
        shutil.copyfile(store, os.path.join(run, "nodes", f"node{i:05d}.duckdb"))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="16,128,1250")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from ranksight.collectors import ingest

    base = args.dir or tempfile.mkdtemp(prefix="ranksight-nodes-")
    store = node_store(base, args.steps)
    results = []
    for count in (int(c) for c in args.counts.split(",")):
        run = head_with_copies(base, store, count)
        attached = first_calls_s(run, "breakdown", PROCESSES)
        t0 = time.perf_counter()
        absorbed = ingest(run, absorb_node_stores=True)
        absorb_s = time.perf_counter() - t0
        one_store = first_calls_s(run, "breakdown", PROCESSES)
        row = {
            "node_stores": count,
            "rows": absorbed.rows,
            "read_attached_s": statistics.median(attached),
            "read_attached_each_s": attached,
            "ingest_nodes_s": absorb_s,
            "read_absorbed_s": statistics.median(one_store),
            "read_absorbed_each_s": one_store,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(os.path.dirname(run), ignore_errors=True)
    if args.json:
        figures = {"steps": args.steps, "ranks_per_node": 8, "cpus": os.cpu_count(), "counts": results}
        write_results(args.json, figures, rounds=PROCESSES)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
