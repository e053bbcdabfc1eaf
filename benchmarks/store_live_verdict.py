"""The verdict of a live run that ``ingest --every`` compacts: its store holds the rows and no answers yet
(ranks still write), so ``step_breakdown`` and ``diagnose()`` read either the verdict's digest parts the
store kept or, with those tables dropped, the store's rows -- side by side, in one run.

    python benchmarks/store_live_verdict.py RUN_DIR --json out.json

RUN_DIR: a run folder with node spool files and their digests (``scale.py``'s ``build_spool``, e.g. the
1,024 x 10,000 node layout). It is copied; the copy is ingested, its answers dropped, then timed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import write_results  # noqa: E402


def _timed_verdict(run: str, repeats: int) -> dict:
    from ranksight.collectors import open_run, step_breakdown
    from ranksight.rules import diagnose

    breakdown, judged, first = [], [], None
    for _ in range(repeats):
        con = open_run(run)
        started = time.perf_counter()
        step_breakdown(con)
        breakdown.append(time.perf_counter() - started)
        con.close()
        started = time.perf_counter()
        found = diagnose(run)
        judged.append(time.perf_counter() - started)
        first = [(f["rule"], f["ranks"], f["severity"]) for f in found["findings"]]
    return {"breakdown_s": breakdown, "diagnose_s": judged, "findings": first}


def main() -> None:
    import duckdb

    from ranksight.collectors import ingest
    from ranksight.collectors._tables import VERDICT_PART_TABLES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ranksight-store-live-")
    try:
        run = os.path.join(work, "run")
        shutil.copytree(args.run_dir, run)
        result = ingest(run)
        store = os.path.join(run, "store.duckdb")
        con = duckdb.connect(store)
        con.execute("DROP TABLE IF EXISTS _answers")  # as while ranks still write: no answers kept
        con.close()
        figures = {"rows": result.rows, "ingest_s": result.seconds, "cpus": os.cpu_count()}
        figures["from_digest_parts"] = _timed_verdict(run, args.repeats)
        con = duckdb.connect(store)
        for table in VERDICT_PART_TABLES.values():
            con.execute(f"DROP TABLE IF EXISTS {table}")  # as a store without them: the rows are read
        con.close()
        figures["from_rows"] = _timed_verdict(run, args.repeats)
        print(json.dumps(figures))
        if args.json:
            write_results(args.json, figures)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
