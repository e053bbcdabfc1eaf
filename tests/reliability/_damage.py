"""Real runs to damage: written by ``ranksight.init`` and ``mon.step()``, then broken the way disks,
copies and people break files. Shared by the reader and store tests of this folder."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

import ranksight
from ranksight.format.schema import arrow_schema

STEPS = 30
WARMUP = 5


def write_run(root: str, run_id: str = "run", steps: int = STEPS) -> str:
    """A finished one-rank run of ``steps`` monitored steps under ``root``; returns its folder.

    The caller sets RANK / WORLD_SIZE (the ``one_rank`` fixture): identity must be certain before the
    agent writes anything."""
    mon = ranksight.init(run_dir=root, job="reliability", run_id=run_id, flush_interval_s=0.05)
    for _ in mon.loader(range(steps)):
        with mon.step():
            pass
    mon.close()
    return os.path.join(root, run_id)


def first_segment(run: str, kind: str = "steps") -> str:
    return sorted(glob.glob(os.path.join(glob.escape(run), kind, "*.parquet")))[0]


def zero_bytes(run: str) -> str:
    path = os.path.join(run, "steps", "zz-empty.parquet")
    open(path, "wb").close()
    return path


def truncated(run: str) -> str:
    """A real segment cut short, as a full disk or an interrupted copy leaves it."""
    source = first_segment(run)
    path = os.path.join(run, "steps", "zz-truncated.parquet")
    with open(source, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return path


def not_parquet(run: str) -> str:
    path = os.path.join(run, "steps", "zz-notes.parquet")
    with open(path, "w") as f:
        f.write("this is a text file with the wrong name\n")
    return path


def other_columns(run: str) -> str:
    """A whole Parquet file of another table dropped into steps/."""
    path = os.path.join(run, "steps", "zz-foreign.parquet")
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), path)
    return path


def wrong_type(run: str) -> str:
    """A copy of a real segment whose step_s became a string."""
    table = pq.read_table(first_segment(run))
    i = table.schema.get_field_index("step_s")
    table = table.set_column(i, "step_s", pa.array(["slow"] * table.num_rows))
    path = os.path.join(run, "steps", "zz-wrong-type.parquet")
    pq.write_table(table, path)
    return path


def null_rank(run: str) -> str:
    """A copy of a real segment whose rows lost their rank (a nullable column, all NULL)."""
    table = pq.read_table(first_segment(run))
    i = table.schema.get_field_index("rank")
    field = pa.field("rank", pa.int32(), nullable=True)
    table = table.set_column(i, field, pa.array([None] * table.num_rows, pa.int32()))
    path = os.path.join(run, "steps", "zz-null-rank.parquet")
    pq.write_table(table, path)
    return path


AGENT_LIKE = "n0_r00007_p4242-c0ffee_000003.parquet"  # named the way the agent names its segments


def rank_dropped(run: str) -> str:
    """A real segment rewritten without its rank column (as a pandas round trip might), under an agent's
    name: the other segments still have the column, so DuckDB's union of schemas would hide the loss."""
    table = pq.read_table(first_segment(run)).drop_columns(["rank"])
    path = os.path.join(run, "steps", AGENT_LIKE)
    pq.write_table(table, path)
    return path


def other_kind(run: str) -> str:
    """A samples segment, whole and named like the agent's, copied into steps/ by mistake."""
    rows = {"job": "j", "run": "r", "node": "n0", "rank": 0, "local_rank": 0, "world_size": 1, "pid": 1}
    rows.update(time_ns=1, step=3, name="gpu_utilization_ratio", value=0.5)
    schema = arrow_schema("samples")
    table = pa.table({f.name: pa.array([rows[f.name]], f.type) for f in schema}, schema=schema)
    path = os.path.join(run, "steps", AGENT_LIKE)
    pq.write_table(table, path)
    return path


def corrupt_pages(run: str) -> str:
    """A copy of a real segment whose data pages were overwritten: the footer still reads."""
    with open(first_segment(run), "rb") as f:
        data = bytearray(f.read())
    footer = int.from_bytes(data[-8:-4], "little")
    data[4 : len(data) - 8 - footer] = b"\xff" * (len(data) - 12 - footer)
    path = os.path.join(run, "steps", "zz-corrupt-pages.parquet")
    with open(path, "wb") as f:
        f.write(data)
    return path


DAMAGES = {
    "zero bytes": zero_bytes,
    "truncated": truncated,
    "not parquet": not_parquet,
    "other columns": other_columns,
    "wrong type": wrong_type,
    "null rank": null_rank,
    "rank dropped": rank_dropped,
    "other kind": other_kind,
}


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m ranksight ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ranksight", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def lines_naming(text: str, path: str) -> list[str]:
    return [line for line in text.splitlines() if os.path.basename(path) in line]


def copy_run(run: str, to: str) -> str:
    shutil.copytree(run, to)
    return to
