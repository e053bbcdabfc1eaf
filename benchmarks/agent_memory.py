"""Where the agent's memory goes: RSS added by ranksight in a torch process, and what the buffers hold when full.

Each measurement runs in a fresh interpreter that has already imported torch (as a training process
has): RSS before ``ranksight.init``, then after 300 watched steps and two flushes. Variants:

- ``as shipped``: what a user gets.
- ``pandas kept out``: the same with ``sys.modules["pandas"] = None`` before the agent starts. pyarrow's
  ``pa.array()`` probes for pandas objects and imports pandas when it is installed; the spool writer
  used it until commit 4e84e75 (+38 MB per rank). Now both variants should match: a gap means pandas
  crept back in.
- ``imports only``: ``import pyarrow, pyarrow.parquet`` and ``import pandas`` alone, for reference.

Also: the bytes held by the hot-path event deque when full (``max_buffered_events`` step events, the
bound that applies when the agent thread cannot keep up or a sink is down).

Usage: ``python benchmarks/agent_memory.py [--json OUT]``
"""

from __future__ import annotations

import sys

from _harness import cli, fresh_process, write_results

_PROBE = r"""
import os, re, sys, tempfile, time, json
os.environ.update(RANK="0", WORLD_SIZE="1", RANKSIGHT_RUN_ID="mem")
def rss_mb():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 1024
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(8, 32) for _ in range(300)]
before = rss_mb()
variant = sys.argv[1]
if variant == "imports only: pyarrow":
    import pyarrow, pyarrow.parquet
elif variant == "imports only: pandas":
    import pandas
else:
    if variant == "pandas kept out":
        sys.modules["pandas"] = None
    import ranksight
    mon = ranksight.init(run_dir=tempfile.mkdtemp(), job="mem", flush_interval_s=0.5)
    mon.watch(model, optimizer=opt)
    for x in mon.loader(data):
        with mon.step():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        time.sleep(0.003)
    time.sleep(1.2)
after = rss_mb()
print(json.dumps({"variant": variant, "rss_before_mb": before, "rss_added_mb": after - before,
                  "pandas_imported": "pandas" in sys.modules and sys.modules["pandas"] is not None}))
"""

VARIANTS = ("as shipped", "pandas kept out", "imports only: pyarrow", "imports only: pandas")


def default_buffer_bound() -> int:
    """The agent's default bound on buffered events (ranksight.agent.Config)."""
    from ranksight.agent import Config

    return Config.max_buffered_events


def buffer_bound_mb(max_events: int | None = None) -> float:
    """Memory held by the agent's event deque when full of step events (the default bound)."""
    import time
    import tracemalloc
    from collections import deque

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    max_events = max_events or default_buffer_bound()
    events: deque = deque(maxlen=max_events)
    t = time.perf_counter_ns()
    for step in range(max_events):
        # A step event as in agent/_monitor.py: (tag, step, begin, end, fetch begin/end, fwd, opt begin/end).
        events.append(("S", step, t + step, t + step + 1, t + step + 2, t + step + 3, t + 4, t + 5, t + 6))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / 2**20


def main() -> int:
    args = cli(__doc__).parse_args()
    rows = []
    for variant in VARIANTS:
        rows.append(fresh_process(_PROBE, variant))
        print(f"{variant:24s} +{rows[-1]['rss_added_mb']:6.1f} MB RSS (pandas imported: {rows[-1]['pandas_imported']})")
    bound = buffer_bound_mb()
    print(f"event deque when full ({default_buffer_bound():,} step events): {bound:.1f} MB")
    if args.json:
        write_results(args.json, {"variants": rows, "event_buffer_full_mb": bound}, arms=list(VARIANTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
