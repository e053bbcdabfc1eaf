"""What a node spool publisher spends on one step file's digest: every part against the rollup's part alone.

Why: the digest is folded on the publishing rank's agent thread, once per publish, so its CPU time is part of
what ranksight costs a job with a node spool (docs/scale.md "The verdict from digests"). One node file of 8
ranks (``scale.py``'s synthetic rows) at 68 steps per rank (a 6.8 s batch at 1,024 ranks and 100 ms steps)
and at 1,000, the job's world size 1,024; medians of seven, ``time.process_time`` (DuckDB runs on one thread here).

    python benchmarks/digest_cost.py
"""

from __future__ import annotations

import glob
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, HERE)
    from scale import build_spool

    from ranksight.format.digest import WARMUP_STEPS, digest_of, fold_sql, pack_parts

    with tempfile.TemporaryDirectory() as tmp:
        for steps in (68, 1000):
            run = os.path.join(tmp, f"s{steps}", "run")
            build_spool(run, 8, steps, per_node=True, digests=False)
            table = pq.read_table(glob.glob(os.path.join(run, "steps", "*.parquet"))[0])
            i = table.schema.get_field_index("world_size")  # one node of a 1,024-rank job: 64-step chunks
            table = table.set_column(i, table.schema.field(i), pa.array([1024] * table.num_rows, pa.int32()))
            every, rollup, sizes = [], [], []
            for _ in range(7):
                t = time.process_time()
                chunk, parts = digest_of(table)
                data = pack_parts(parts)
                every.append(time.process_time() - t)
                sizes.append(len(data))
                con = duckdb.connect(config={"threads": 1})
                con.register("batch", table)
                t = time.process_time()
                con.sql(fold_sql("batch"), params={"chunk": chunk, "warm": WARMUP_STEPS}).fetchall()
                rollup.append(time.process_time() - t)
                con.close()
            print(
                f"{table.num_rows} rows: every part {statistics.median(every) * 1e3:.1f} ms CPU, the rollup's part "
                f"alone {statistics.median(rollup) * 1e3:.1f} ms; digest {sizes[-1] / 1e3:.0f} KB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
