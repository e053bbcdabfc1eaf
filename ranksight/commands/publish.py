"""``ranksight publish NODE_RUN RUN_DIR``: publish what a node spool still holds to the run folder.

The ranks of a node publish their node spool themselves while they run and when they close; this is for
what a job killed as a whole left on the node's disk (run it in the SLURM epilog or a Kubernetes
``preStop`` hook). Safe while ranks still run: it takes the node's lock, and no row is published twice.
"""

from __future__ import annotations

import os

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "publish",
        help="publish a node spool's pending segments to the run folder (after a crash)",
        description="Publish what <node_spool_dir>/<run> still holds into the run folder, merged per kind.",
    )
    p.add_argument("node_run", help="the node-local folder of the run: <node_spool_dir>/<run id>")
    p.add_argument("run_dir", help="the run folder on the shared filesystem: <run_dir>/<run id>")
    p.add_argument("--node", default=None, help="node name in the file names (default: what its rank files say)")
    return p


def run(args) -> int:
    from ranksight.agent import publish_node_spool

    if not os.path.isdir(args.node_run):
        raise UserError(f"{args.node_run}: no such node spool folder")
    os.makedirs(os.path.join(args.run_dir, "ranks"), exist_ok=True)
    try:
        result = publish_node_spool(args.node_run, args.run_dir, args.node)
    except TimeoutError as exc:
        raise UserError(str(exc)) from None
    print(f"published {result.segments} segments ({result.rows:,} rows) as {result.files} files in {args.run_dir}")
    return 0
