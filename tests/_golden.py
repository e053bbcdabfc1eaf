"""The read side's safety net: what the verdict, the features and the context of fixed runs are.

``tests/data/golden_reads.json.gz`` holds them as the reader of commit 686ffe1 computed them (before the read
side became one summary relation), for: the demo scenarios' CPU runs (``tests/data/golden_runs.tgz``, two ranks,
30 steps each, written by ``ranksight demo``), the three GPU corpus runs of ``tests/data/gpu/h200_corpus_runs.tgz``
and a synthetic spool of 1,024 ranks (``synthetic_spool``: fixed seed, 20 steps, one file per node of 8 as the
node spool publishes them). ``tests/test_golden_reads.py`` computes them again and compares.

Record them again (only when a change of a figure is meant, and say so in its commit):
``.venv/bin/python -m tests._golden``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import tarfile

from ranksight.format.warmup import WARMUP_STEPS

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "data", "golden_reads.json.gz")
DEMO_RUNS = os.path.join(HERE, "data", "golden_runs.tgz")
GPU_RUNS = os.path.join(HERE, "data", "gpu", "h200_corpus_runs.tgz")
SYNTHETIC = "synthetic-1024"
RANKS_PER_NODE = 8


def synthetic_spool(run_path: str, ranks: int = 1024, steps: int = 20, digests: bool = False) -> str:
    """Write ``ranks`` x ``steps`` step rows as the node spool publishes them (one zstd Parquet file and one
    rank file per node of 8, with ``digests`` each file's step digest too), from a fixed seed: data wait on
    every rank, the last rank 1.3x slower in compute, DDP's exposed all-reduce and a blocking collective's
    time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ranksight.format.schema import arrow_schema

    schema = arrow_schema("steps")
    os.makedirs(os.path.join(run_path, "steps"), exist_ok=True)
    os.makedirs(os.path.join(run_path, "ranks"), exist_ok=True)
    rng = np.random.default_rng(0)
    for first in range(0, ranks, RANKS_PER_NODE):
        members = np.arange(first, min(ranks, first + RANKS_PER_NODE), dtype=np.int32)
        n = len(members) * steps
        rank = np.repeat(members, steps)
        step = np.tile(np.arange(steps, dtype=np.int64), len(members))
        compute = rng.gamma(20.0, 0.0005, n) * np.where(rank == ranks - 1, 1.3, 1.0)
        wait, exposed, other = rng.exponential(0.001, n), rng.exponential(0.0005, n), rng.exponential(0.0002, n)
        blocked = rng.exponential(0.0003, n)
        opt = rng.normal(0.002, 0.0002, n).clip(0)
        node = f"node{first // RANKS_PER_NODE:04d}"
        cols = {
            "job": pa.array(["golden"] * n),
            "run": pa.array([SYNTHETIC] * n),
            "node": pa.array([node] * n),
            "rank": pa.array(rank),
            "local_rank": pa.array(rank % RANKS_PER_NODE),
            "world_size": pa.array(np.full(n, ranks, dtype=np.int32)),
            "pid": pa.array(1000 + rank),
            "step": pa.array(step),
            "time_ns": pa.array(1_700_000_000_000_000_000 + step * 10_000_000),
            "step_s": pa.array(wait + compute + exposed + blocked + opt + other),
            "data_wait_s": pa.array(wait),
            "compute_s": pa.array(compute),
            "comm_exposed_s": pa.array(exposed),
            "comm_blocked_s": pa.array(blocked),
            "collectives": pa.array(np.ones(n, dtype=np.int64)),
            "collective_bytes": pa.array(np.full(n, 4096, dtype=np.int64)),
            "allreduce_s": pa.array(exposed * 3),
            "optimizer_s": pa.array(opt),
            "other_s": pa.array(other),
            "buckets": pa.array(np.full(n, 4, dtype=np.int64)),
            "bucket_bytes": pa.array(np.full(n, 1 << 24, dtype=np.int64)),
        }
        arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        name = f"{node}_m{first:020d}-000000.parquet"
        if digests:  # as the node spool's publisher writes them: the digest first
            from ranksight.agent._node_spool import _write_durably
            from ranksight.format.digest_file import parquet_bytes, write_digest

            data = parquet_bytes(table)
            write_digest(table, os.path.join(run_path, "steps"), name, _write_durably)
            with open(os.path.join(run_path, "steps", name), "wb") as f:
                f.write(data)
        else:
            pq.write_table(table, os.path.join(run_path, "steps", name), compression="zstd")
        metas = [
            {
                "rank": int(r),
                "node": node,
                "run": SYNTHETIC,
                "status": "finished",
                "heartbeat_ns": 1,
                "steps": steps,
                "world_size": ranks,
                "ddp": {"backend": "gloo", "find_unused_parameters": False, "bucket_cap_bytes": 25 << 20},
            }
            for r in members
        ]
        with open(os.path.join(run_path, "ranks", f"node-{node}.json"), "w") as f:
            json.dump({"node": node, "ranks": metas}, f)
    return run_path


def golden_runs(base: str) -> dict[str, str]:
    """Unpack (or write) every golden run under ``base``: {name: run folder}."""
    out = {}
    for archive, folder in ((DEMO_RUNS, "demo"), (GPU_RUNS, "gpu")):
        target = os.path.join(base, folder)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        for root, dirs, _ in os.walk(target):
            if "steps" in dirs:
                out[os.path.basename(root)] = root
                dirs.clear()
    out[SYNTHETIC] = synthetic_spool(os.path.join(base, SYNTHETIC))
    return dict(sorted(out.items()))


def run_features(run_path: str, warmup_steps: int = WARMUP_STEPS) -> dict[int, dict]:
    """The features per rank of the run folder at ``run_path`` (``Run.features``), the reading closed after."""
    from ranksight.collectors import open_run

    with open_run(run_path) as run:
        return run.features(warmup_steps=warmup_steps)


def read_figures(run_path: str) -> dict:
    """The verdict (``diagnose``'s object), the features and the context of a run, as plain JSON values."""
    from ranksight.collectors import open_run
    from ranksight.rules import diagnose

    verdict = diagnose(run_path)
    run = open_run(run_path, follow_spool=False)
    try:
        features = run.features()
        context = run.context()
        out = {"verdict": verdict, "features": features, "context": {r: dict(context[r]) for r in context}}
    finally:
        run.close()
    return plain(out)


def plain(value):
    """``value`` as JSON reads it back (keys strings, tuples lists), NaN as the string 'nan'."""
    return json.loads(json.dumps(value, default=str, allow_nan=True).replace("NaN", '"nan"'))


def differences(want, got, where: str = "", tol: float = 1e-6) -> list[str]:
    """Where ``got`` differs from ``want``: floats within ``tol`` (absolute, or relative to the larger) count
    as equal; every other value must be equal. A key the golden lacks counts only where it reads a value: a
    feature added since it was written reads None on these runs, which have no such figure."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}/{k}: missing" for k in want if k not in got]
        out += [f"{where}/{k}: unexpected ({got[k]!r})" for k in got if k not in want and got[k] is not None]
        for k in want:
            if k in got:
                out += differences(want[k], got[k], f"{where}/{k}", tol)
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(want)} items, got {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{where}[{i}]", tol)]
    numbers = (int, float)
    if (
        isinstance(want, numbers)
        and isinstance(got, numbers)
        and not isinstance(want, bool)
        and not isinstance(got, bool)
    ):
        if math.isclose(want, got, rel_tol=tol, abs_tol=tol):
            return []
        return [f"{where}: {want!r} != {got!r}"]
    return [] if want == got else [f"{where}: {want!r} != {got!r}"]


def record(path: str = GOLDEN) -> None:
    """Compute every golden run's figures with this checkout's code and write them to ``path``."""
    import tempfile

    base = tempfile.mkdtemp(prefix="ranksight-golden-")
    try:
        figures = {name: read_figures(run) for name, run in golden_runs(base).items()}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(figures, indent=1, sort_keys=True).encode())


def load() -> dict:
    """The golden figures, by run name."""
    with gzip.open(GOLDEN, "rb") as f:
        return json.loads(f.read())


if __name__ == "__main__":
    record()
