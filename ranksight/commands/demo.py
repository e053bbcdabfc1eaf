"""``ranksight demo``: run a real multi-rank training job with the agent attached, then show what it saw."""

from __future__ import annotations

import os

from ._errors import UserError
from .dashboard import add_serve_for


def add_parser(sub):
    from ranksight.commands.demo_job import FAULTS

    p = sub.add_parser(
        "demo",
        help="run a small multi-rank training job with a planted fault",
        description="Run a real multi-rank training job (gloo on CPU, NCCL on GPUs) with "
        "ranksight attached and one planted fault, then print what it measured.",
    )
    p.add_argument("--fault", default="none", choices=FAULTS, help="the fault to plant (default none)")
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="number of ranks (default 2; 1 on a one-GPU machine unless the fault needs several ranks)",
    )
    p.add_argument("--steps", type=int, default=60, help="training steps per rank (default 60)")
    p.add_argument("--run-dir", default="ranksight-runs", help="parent folder of runs (default ranksight-runs)")
    p.add_argument("--run-id", default="", help="run id (default: demo-<fault>-<time>)")
    p.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard on the run afterwards")
    p.add_argument(
        "--port",
        type=int,
        default=8501,
        help="dashboard port (default 8501; a taken port ends the demo with exit 2, its run kept)",
    )
    add_serve_for(p)
    return p


def run(args) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("the demo trains a real model and needs torch: pip install torch") from None
    from ranksight.commands.demo_job import DemoConfig, NeedsGPUError, check_device, default_ranks, run_demo

    from ._report import render_applicable_checklist
    from .diagnose import diagnose_or_fail, render_findings
    from .summary import render_breakdown

    if args.serve_for is not None and args.serve_for <= 0:
        raise UserError(f"--serve-for must be > 0 seconds, got {args.serve_for:g}")
    try:
        ranks = args.ranks if args.ranks is not None else default_ranks(args.fault)
        cfg = DemoConfig(fault=args.fault, ranks=ranks, steps=args.steps, run_dir=args.run_dir, run_id=args.run_id)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        check_device(cfg)
    except NeedsGPUError as exc:
        raise UserError(str(exc)) from None
    print(f"ranksight demo: {cfg.ranks} ranks, {cfg.steps} steps, fault={cfg.fault} ...", flush=True)
    path = run_demo(cfg)
    print(f"\nrun: {path}\n")
    print(render_breakdown(path))
    result = diagnose_or_fail(path)
    print("\nDiagnosis:\n" + render_findings(result))
    print("\nChecklist (worst rank):\n" + render_applicable_checklist(result))
    print(f"\nrecords: {os.path.abspath(path)}")
    print(f"details: ranksight diagnose {path}")
    if getattr(args, "no_dashboard", False):
        print(f"dashboard: ranksight dashboard {path}")
        return 0
    from .dashboard import serve_run

    return serve_run(path, args.port, args.serve_for)
