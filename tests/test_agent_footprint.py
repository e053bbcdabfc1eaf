"""What the agent pulls into a training process: never pandas (pyarrow's conversion path would)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from ranksight.agent._arrow_columns import build_column

_SCRIPT = """
import os, sys
os.environ.update(RANK="0", WORLD_SIZE="1")
import torch, ranksight
mon = ranksight.init(run_dir=sys.argv[1], job="footprint", run_id="f", flush_interval_s=0.1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon.watch(model, optimizer=opt)
for x in mon.loader([torch.randn(2, 4) for _ in range(20)]):
    with mon.step():
        model(x).sum().backward()
        opt.step()
mon.close()
from ranksight.collectors import read_rank_meta
assert read_rank_meta(os.path.join(sys.argv[1], "f"))[0].steps == 20
print("pandas" in sys.modules)
"""


def test_a_monitored_run_does_not_import_pandas(tmp_path):
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "kind, arrow_type, values",
    [
        ("int64", pa.int64(), [1, None, -(2**62)]),
        ("int32", pa.int32(), [0, 7, None]),
        ("float64", pa.float64(), [1.5, None, float("inf")]),
        ("bool", pa.bool_(), [True, None, False]),
        ("string", pa.string(), ["a", None, "héllo ✓", ""]),
        ("string", pa.string(), [None, None]),
    ],
)
def test_columns_match_pyarrows_own_conversion(kind, arrow_type, values):
    built = build_column(kind, arrow_type, values)
    built.validate(full=True)
    assert built.to_pylist() == values
    assert built.equals(pa.array(values, type=arrow_type))
