"""Command-line options the diagnosis corpus adds to every workload (not part of the public script it imitates).

The scripts keep their own options, as their originals have them; these are the corpus's: where the job
runs, at which size, over which backend, and which rank the straggler fault slows.
"""

from __future__ import annotations

import argparse


def add_corpus_options(parser: argparse.ArgumentParser, dist_backend: bool = True) -> None:
    """``--device``, ``--size``, ``--straggler-rank`` and (unless the framework picks it) ``--dist-backend``."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=("cpu", "gpu"), default=None, help="sizes preset (default: gpu on cuda)")
    if dist_backend:
        parser.add_argument(
            "--dist-backend",
            default=None,
            help="default: nccl on cuda, gloo on cpu (gloo on cuda only to smoke-test more ranks than GPUs)",
        )
    parser.add_argument("--straggler-rank", type=int, default=1, help="the rank the straggler fault slows")
