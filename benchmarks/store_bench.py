"""Spool -> store throughput and per-rank breakdown query time over many step rows.

Builds a run directory holding ``--rows`` step rows (default 10 million) spread over ``--ranks``
ranks as real spool segments (the agent's Arrow schema, zstd Parquet, ``--segment-rows`` rows each,
the size of one 2 s flush of a ~1 ms step), then measures, in one run on this machine:

1. ``ingest``: ``ranksight.collectors.ingest`` from spool to ``store.duckdb`` -> rows/s.
2. ``step_breakdown`` (``ranksight.collectors.step_breakdown``, the per-rank query the CLI, rules
   and dashboard run) over a fresh ``open_run`` connection: on the live spool (before ingest) and on
   the compacted store (after), median of ``--repeats`` runs each.

Usage: ``python benchmarks/store_bench.py [--rows 10000000] [--ranks 8] [--segment-rows 20000]
[--threads N] [--dir DIR] [--json OUT]``
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import write_results  # noqa: E402


def build_spool(run_path: str, rows: int, ranks: int, segment_rows: int) -> int:
    """Write ``rows`` step rows as spool segments (and rank metadata); returns segments written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ranksight.format.schema import RANKS_DIR, arrow_schema

    schema = arrow_schema("steps")
    os.makedirs(os.path.join(run_path, "steps"), exist_ok=True)
    os.makedirs(os.path.join(run_path, RANKS_DIR), exist_ok=True)
    rng = np.random.default_rng(0)
    per_rank = rows // ranks
    segments = 0
    for rank in range(ranks):
        n_rank = per_rank + (1 if rank < rows % ranks else 0)
        with open(os.path.join(run_path, RANKS_DIR, f"rank-{rank:05d}.json"), "w") as f:
            json.dump({"rank": rank, "status": "finished", "heartbeat_ns": 1, "steps": n_rank, "world_size": ranks}, f)
        for seq, start in enumerate(range(0, n_rank, segment_rows)):
            n = min(segment_rows, n_rank - start)
            step = np.arange(start, start + n, dtype=np.int64)
            compute = rng.gamma(20.0, 0.0005, n) * (1.3 if rank == ranks - 1 else 1.0)
            wait = rng.exponential(0.001, n)
            exposed = rng.exponential(0.0005, n)
            opt = rng.normal(0.002, 0.0002, n).clip(0)
            other = rng.exponential(0.0002, n)
            step_s = wait + compute + exposed + opt + other
            cols = {
                "job": pa.array(["bench"] * n),
                "run": pa.array(["bench-run"] * n),
                "node": pa.array([f"node{rank // 4}"] * n),
                "rank": pa.array(np.full(n, rank, dtype=np.int32)),
                "local_rank": pa.array(np.full(n, rank % 4, dtype=np.int32)),
                "world_size": pa.array(np.full(n, ranks, dtype=np.int32)),
                "pid": pa.array(np.full(n, 1000 + rank, dtype=np.int32)),
                "step": pa.array(step),
                "time_ns": pa.array(1_700_000_000_000_000_000 + step * 10_000_000),
                "step_s": pa.array(step_s),
                "data_wait_s": pa.array(wait),
                "h2d_s": pa.nulls(n, pa.float64()),
                "compute_s": pa.array(compute),
                "comm_exposed_s": pa.array(exposed),
                "allreduce_s": pa.array(exposed * 3),
                "optimizer_s": pa.array(opt),
                "other_s": pa.array(other),
                "buckets": pa.array(np.full(n, 4, dtype=np.int32)),
                "bucket_bytes": pa.array(np.full(n, 100_000_000, dtype=np.int64)),
                "gpu_compute_s": pa.nulls(n, pa.float64()),
                "gpu_step_s": pa.nulls(n, pa.float64()),
                "gpu_gap_s": pa.nulls(n, pa.float64()),
                "gpu_comm_exposed_s": pa.nulls(n, pa.float64()),
                "gpu_optimizer_s": pa.nulls(n, pa.float64()),
            }
            # Columns added to the schema later (and GPU-only ones) stay NULL, as on a CPU rank.
            arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
            table = pa.Table.from_arrays(arrays, schema=schema)
            pq.write_table(
                table,
                os.path.join(run_path, "steps", f"node{rank // 4}_r{rank:05d}_p{1000 + rank}_{seq:06d}.parquet"),
                compression="zstd",
            )
            segments += 1
    return segments


def time_breakdown(run_path: str, repeats: int, threads: int | None) -> tuple[float, list[dict]]:
    """Median seconds of open_run + step_breakdown over ``repeats`` fresh connections."""
    from ranksight.collectors import open_run, step_breakdown

    times, result = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        con = open_run(run_path)
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        result = step_breakdown(con)
        times.append(time.perf_counter() - t0)
        con.close()
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--segment-rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: DuckDB's choice)")
    parser.add_argument("--dir", default=None, help="where to build the run (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()

    from ranksight.collectors import ingest

    base = args.dir or tempfile.mkdtemp(prefix="ranksight-store-bench-")
    run_path = os.path.join(base, "bench-run")
    shutil.rmtree(run_path, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        segments = build_spool(run_path, args.rows, args.ranks, args.segment_rows)
        build_s = time.perf_counter() - t0
        spool_bytes = sum(e.stat().st_size for e in os.scandir(os.path.join(run_path, "steps")))
        print(
            f"spool: {args.rows:,} step rows, {args.ranks} ranks, {segments} segments, "
            f"{spool_bytes / 1e6:.0f} MB (built in {build_s:.1f} s)"
        )

        live_s, live = time_breakdown(run_path, args.repeats, args.threads)
        print(f"step_breakdown on the live spool:      {live_s:.3f} s (median of {args.repeats})")

        result = ingest(run_path)
        rate = result.rows / result.seconds
        store_bytes = os.path.getsize(result.store_path)
        print(
            f"ingest spool -> store:                 {result.seconds:.2f} s, {rate:,.0f} rows/s "
            f"({store_bytes / 1e6:.0f} MB store)"
        )

        store_s, stored = time_breakdown(run_path, args.repeats, args.threads)
        print(f"step_breakdown on the compacted store: {store_s:.3f} s (median of {args.repeats})")
        assert [r["steps"] for r in live] == [r["steps"] for r in stored], "store and spool disagree"
        assert sum(r["steps"] for r in stored) + 5 * args.ranks == args.rows  # warm-up steps left out

        figures = {
            "rows": args.rows,
            "ranks": args.ranks,
            "segments": segments,
            "spool_mb": spool_bytes / 1e6,
            "store_mb": store_bytes / 1e6,
            "ingest_s": result.seconds,
            "ingest_rows_per_s": rate,
            "breakdown_live_spool_s": live_s,
            "breakdown_store_s": store_s,
            "cpus": os.cpu_count(),
        }
        if args.json:
            write_results(args.json, figures, rounds=args.repeats)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
