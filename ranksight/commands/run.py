"""``ranksight run [options] -- COMMAND ...``: run an unmodified training script with the agent attached.

The command (``python train.py``, ``torchrun --nproc-per-node 2 train.py``, ``srun python ...``) runs
as a child process with a private ``sitecustomize`` on ``PYTHONPATH`` that arms
``ranksight.integrations._autoattach`` in every Python process it starts. Without ``mon.step()`` marks a step
opens when a batch arrives from a ``DataLoader`` and closes at ``optimizer.step()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from ._errors import UserError


def add_parser(sub):
    p = sub.add_parser(
        "run",
        help="run an unmodified training command with the agent attached",
        description="Run a training command (python train.py, torchrun ...) with the ranksight agent "
        "attached to every Python process it starts, without editing the script.",
        epilog="example: ranksight run --run-dir runs -- torchrun --nproc-per-node 2 train.py --epochs 1",
    )
    p.add_argument("--run-dir", default="ranksight-runs", help="parent folder of runs (default ranksight-runs)")
    p.add_argument("--job", default="default", help="job name stamped on every record (default: default)")
    p.add_argument(
        "--run-id",
        default="",
        help="run id shared by all ranks (default: the SLURM job, else <job>-<time>-<random>); "
        "give the same one on every node of a multi-node job launched outside SLURM",
    )
    p.add_argument(
        "--comm-hook",
        action="store_true",
        help="on gloo, register a DDP communication hook for per-bucket all-reduce rows (a 2-rank CPU job's "
        "steps took 1.08x as long; without it the exposed all-reduce is still timed once per step)",
    )
    p.add_argument(
        "--no-comm-hook",
        action="store_true",
        help="leave DDP's communication hook alone (the default; kept for older command lines)",
    )
    p.add_argument("--quiet", action="store_true", help="print no summary at the end")
    p.add_argument("cmd", nargs="...", metavar="-- COMMAND", help="the command to run, after --")
    return p


def _run_id(args) -> str:
    """The run id for the child's environment; empty lets every rank derive the SLURM job's id."""
    if args.run_id:
        return args.run_id
    if os.environ.get("RANKSIGHT_RUN_ID"):
        return os.environ["RANKSIGHT_RUN_ID"]
    if os.environ.get("SLURM_JOB_ID"):
        return ""  # each node's `ranksight run` must agree: the agent derives <job>-[<start>-]slurm<id>[.<step>]
    return f"{args.job}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def _child_env(args, run_id: str, bootstrap_dir: str) -> dict:
    from ranksight.integrations import ATTACH_ENV, COMM_HOOK_ENV

    env = dict(os.environ)
    env[ATTACH_ENV] = "1"
    env["RANKSIGHT_RUN_DIR"] = os.path.abspath(args.run_dir)
    env["RANKSIGHT_JOB"] = args.job
    if run_id:
        env["RANKSIGHT_RUN_ID"] = run_id
    env[COMM_HOOK_ENV] = "1" if args.comm_hook and not args.no_comm_hook else "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_dir, env.get("PYTHONPATH", "")) if p)
    return env


def _wait(child: subprocess.Popen) -> int:
    """Wait for the child, passing SIGTERM on; Ctrl-C reaches it through the terminal's process group."""

    def forward(signum, frame):
        child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue  # the child got SIGINT too; let it shut down and flush
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("give the command to run after --, e.g. ranksight run -- python train.py")
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        raise UserError(f"{cmd[0]}: command not found")
    from ranksight.integrations import BOOTSTRAP_SOURCE

    run_id = _run_id(args)
    bootstrap_dir = tempfile.mkdtemp(prefix="ranksight-attach-")
    try:
        with open(os.path.join(bootstrap_dir, "sitecustomize.py"), "w") as f:
            f.write(BOOTSTRAP_SOURCE)
        try:
            child = subprocess.Popen(cmd, env=_child_env(args, run_id, bootstrap_dir))
        except OSError as exc:
            raise UserError(f"{cmd[0]}: {exc.strerror or exc}") from None
        code = _wait(child)
    finally:
        shutil.rmtree(bootstrap_dir, ignore_errors=True)
    if not args.quiet:
        _report(os.path.join(os.path.abspath(args.run_dir), run_id or _slurm_run_id(args.job)))
    return code if code >= 0 else 128 - code


def _slurm_run_id(job: str) -> str:
    from ranksight.agent import derive_run_id  # imports no torch

    return derive_run_id(1, job)


def _report(run_path: str) -> None:
    """Tell where the records went, then the breakdown, the verdict and how to open the dashboard (stderr:
    stdout is the training command's)."""
    if not os.path.isdir(os.path.join(run_path, "ranks")):
        print(f"ranksight run: no records in {run_path} (no loader iteration or optimizer step seen)", file=sys.stderr)
        return
    try:
        from .summary import render_breakdown

        print(render_breakdown(run_path), file=sys.stderr)
    except Exception as exc:  # the summary is a courtesy; the records are on disk either way
        print(f"ranksight run: could not summarise ({exc})", file=sys.stderr)
    print(f"ranksight run: records in {run_path}", file=sys.stderr)
    try:
        from ._report import verdict_line
        from .diagnose import diagnose_or_fail

        print(f"ranksight run: {verdict_line(diagnose_or_fail(run_path))}", file=sys.stderr)
    except Exception as exc:  # as above: a courtesy
        print(f"ranksight run: could not diagnose ({exc}); try: ranksight diagnose {run_path}", file=sys.stderr)
    print(f"ranksight run: dashboard: ranksight dashboard {run_path}", file=sys.stderr)
