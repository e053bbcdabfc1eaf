"""``ranksight baseline save RUN FILE`` / ``ranksight baseline compare FILE RUN``: gate against a kept run.

Why: CI compares today's run with last week's, whose run folder is long gone. ``save`` keeps what the gate
needs of a run in one JSON file (``_baseline_file``); ``compare`` takes the same options as
``ranksight compare`` and gives the same output and exit codes, with the file as run A.
"""

from __future__ import annotations

from ranksight.format.warmup import WARMUP_STEPS

from ._errors import UserError


def add_parser(sub):
    import argparse

    from .compare import GATE_EPILOG, add_options

    p = sub.add_parser(
        "baseline",
        help="keep a run as a baseline file, and gate a run against it (CI)",
        description="Keep what the regression gate needs of a run (every step's time and phases after warm-up, "
        "the per-rank breakdown and the findings) in one JSON file, and compare a later run against it with "
        "the same output and exit codes as `ranksight compare`.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    save = actions.add_parser("save", help="write RUN's baseline to FILE")
    save.add_argument("run_dir", metavar="RUN", help="a run folder, run id, or folder of runs (its latest)")
    save.add_argument("file", metavar="FILE", help="the baseline file to write (JSON)")
    save.add_argument(
        "--warmup", type=int, default=WARMUP_STEPS, help=f"leading steps per rank to leave out (default {WARMUP_STEPS})"
    )
    save.add_argument("--rules", metavar="DIR", default=None, help="extra rule files (*.yaml); same id overrides")
    cmp = actions.add_parser(
        "compare",
        help="compare RUN (B) against the baseline FILE (A); --gate for CI",
        epilog=GATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmp.add_argument("file", metavar="FILE", help="a baseline file written by `ranksight baseline save`")
    cmp.add_argument("run_dir", metavar="RUN", help="the run to judge")
    add_options(cmp)
    return p


def run(args) -> int:
    from ._baseline_file import read_baseline, write_baseline
    from ._gate_samples import read_samples
    from .compare import compare_sides, gate_config, report
    from .diagnose import diagnose_or_fail

    if args.warmup < 0:
        raise UserError(f"--warmup must be >= 0, got {args.warmup}")
    if args.action == "save":
        samples = read_samples(args.run_dir, args.warmup)
        if not samples.ranks:
            raise UserError(f"{args.run_dir} has no steps after the first {args.warmup}: nothing to keep")
        doc = write_baseline(args.file, samples, diagnose_or_fail(args.run_dir, args.rules, args.warmup), args.warmup)
        steps = max(len(r["step"]) for r in doc["ranks"].values())
        print(f"baseline of {doc['run']} ({len(doc['ranks'])} ranks, up to {steps} steps each) -> {args.file}")
        return 0
    config = gate_config(args)
    try:
        samples_a, diag_a, _ = read_baseline(args.file)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    result = compare_sides(
        diag_a, samples_a, diagnose_or_fail(args.run_dir, args.rules, args.warmup),
        read_samples(args.run_dir, args.warmup), config, args.warmup,
    )  # fmt: skip
    return report(result, args)
