"""Independent ground truth for the sampled window: analyse an exported Chrome trace on a time grid.

Deliberately a different algorithm from ``agent/_trace_reduce.py`` (which merges sorted intervals on
the profiler's raw events): here the trace file is parsed from JSON, kernels are linked to their
launches through the trace's flow arrows (``ac2g``), and busy time is counted by painting each
activity onto a boolean grid (100 ns cells) and summing the cells. Same definitions (HTA's):
shares of the GPU span of the marked steps, idle = span − |∪ activity|.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

_RES_NS = 100


def _ns(us: float) -> int:
    return int(round(float(us) * 1000))


def truth_from_trace(trace: dict) -> dict:
    """Compute kernel/compute/comm/memcpy/h2d/idle shares of the marked window of one trace."""
    evs = trace["traceEvents"]
    marks = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == "ranksight#window"]
    after = [_ns(e["ts"]) for e in evs if e.get("cat") == "user_annotation" and e["name"] == "ranksight#after"]
    cpu_lo = min(_ns(e["ts"]) for e in marks)
    cpu_hi = min(after, default=max(_ns(e["ts"]) + _ns(e["dur"]) for e in marks))
    # Launch time of each GPU activity, from the flow arrows: flow start (on the runtime call) -> flow end.
    flow_start = {e["id"]: _ns(e["ts"]) for e in evs if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    flow_end = {e["id"] for e in evs if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    launch_ts = {i: ts for i, ts in flow_start.items() if i in flow_end}
    gpu = []
    for e in evs:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = (e.get("args") or {}).get("correlation")
        s = _ns(e["ts"])
        gpu.append((e["cat"], e["name"], s, s + _ns(e.get("dur", 0)), launch_ts.get(corr, s)))
    inwin = [g for g in gpu if cpu_lo <= g[4] < cpu_hi]
    later = [g for g in gpu if g[4] >= cpu_hi]
    lo = min(g[2] for g in inwin)
    hi = min(g[2] for g in later) if later else max(g[3] for g in inwin)
    n = max(1, (hi - lo) // _RES_NS)

    def paint(pred) -> np.ndarray:
        grid = np.zeros(n, dtype=bool)
        for cat, name, s, e, _ in gpu:
            if pred(cat, name):
                a, b = max(0, (s - lo) // _RES_NS), min(n, (e - lo + _RES_NS - 1) // _RES_NS)
                if b > a:
                    grid[a:b] = True
        return grid

    def is_comm(cat, name):
        return cat == "kernel" and name.lower().startswith("nccl")

    comp = paint(lambda c, nm: c == "kernel" and not is_comm(c, nm))
    comm = paint(is_comm)
    mem = paint(lambda c, nm: c != "kernel")
    h2d = paint(lambda c, nm: c == "gpu_memcpy" and "HtoD" in nm)
    busy = comp | comm | mem
    out = {"span_s": (hi - lo) * 1e-9, "compute_kernel_ratio": comp.mean(), "comm_kernel_ratio": comm.mean(),
           "memcpy_ratio": mem.mean(), "h2d_copy_ratio": h2d.mean(), "idle_ratio": 1.0 - busy.mean(),
           "kernel_busy_ratio": (comp | comm).mean()}  # fmt: skip
    if comm.any():
        out["comm_overlap_ratio"] = (comp & comm).sum() / comm.sum()
    return {k: float(v) for k, v in out.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="Chrome traces (JSON) exported from a window ranksight marked")
    for path in parser.parse_args().traces:
        with open(path) as f:
            print(path, json.dumps(truth_from_trace(json.load(f)), indent=1))
