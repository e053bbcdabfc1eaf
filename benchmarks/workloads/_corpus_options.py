"""Command-line options the diagnosis corpus adds to every workload (not part of the public script it imitates).

The scripts keep their own options, as their originals have them; these are the corpus's: where the job
runs, at which size, over which backend, which rank the straggler fault slows, and ``--fix`` (the planted
fault with the fix its finding names applied, for ``diagnosis_corpus.py --check-fix``).
"""

from __future__ import annotations

import argparse
import json
import os

GPU_SAMPLING = {"trace_first_step": 10, "trace_first_s": 0.0, "trace_every_steps": 10, "trace_every_s": 0.0,
                "trace_budget": None, "allocator_every_s": 0.25, "snapshot_every_s": 0.5}  # fmt: skip
"""The agent's GPU sampling in a corpus run (``ranksight.init(gpu=...)``): the sampled kernel window at step
10 and every 10 steps after (no cost budget spacing them), allocator statistics four times a second and its
snapshot (the largest free block, ~0.4 ms) twice a second, so a run of 1-3 s sees them. A real job samples
the same signals over hours (defaults: a window at step 50, then every 300 steps and 60 s, further apart
where a window costs more than 0.2 % of the time since); a 30-step run gets them this way, as ``ranksight
demo`` does on a GPU (``ranksight.commands.demo_job.GPU_SAMPLING``)."""


CORE_FAULTS = ("none", "input", "straggler", "metric-collectives", "exposed-allreduce", "unused-params", "graph-breaks")
"""The faults every workload plants (each script adds its own GPU faults)."""


def add_corpus_options(
    parser: argparse.ArgumentParser,
    job: str,
    faults: tuple,
    steps_help: str = "training steps",
    dist_backend: bool = True,
) -> None:
    """The corpus options: the fault, steps, where the agent writes, device, size, straggler rank, ``--fix``,
    and the backend unless the framework picks it."""
    parser.add_argument("--fault", choices=faults, default="none")
    parser.add_argument("--steps", type=int, default=30, help=steps_help)
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--job", default=job)
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=("cpu", "gpu"), default=None, help="sizes preset (default: gpu on cuda)")
    if dist_backend:
        backend = "default: nccl on cuda, gloo on cpu (gloo on cuda only to smoke-test more ranks than GPUs)"
        parser.add_argument("--dist-backend", default=None, help=backend)
    parser.add_argument("--straggler-rank", type=int, default=1, help="the rank the straggler fault slows")
    fix = "plant the fault with its fix applied, as the finding's fix text says (the corpus's --check-fix)"
    parser.add_argument("--fix", action="store_true", help=fix)


def gpu_sampling(device: str):
    """The ``gpu=`` options a corpus script passes to ``ranksight.init`` (None on CPU: the agent's own)."""
    if device != "cuda":
        return None
    # CORPUS_GPU_SAMPLING: a JSON object over these defaults, for a probe of the window's own settings
    return {**GPU_SAMPLING, **json.loads(os.environ.get("CORPUS_GPU_SAMPLING") or "{}")}
