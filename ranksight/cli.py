"""The ``ranksight`` command line. Each subcommand lives in ``ranksight.commands.<name>``.

A subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Errors a user can
fix (a bad path, a bad option) print one line and exit with 2; nothing prints a traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ranksight.commands._errors import UserError

__all__ = ["COMMANDS", "RUN_ARGUMENTS", "UserError", "build_parser", "main", "resolve_run_arguments"]

# Subcommand name -> module under ranksight.commands. Keep alphabetical.
COMMANDS = {
    "baseline": "baseline",
    "compare": "compare",
    "dashboard": "dashboard",
    "demo": "demo",
    "diagnose": "diagnose",
    "digest": "digest",
    "export": "export",
    "import": "import_cmd",
    "ingest": "ingest",
    "publish": "publish",
    "rules": "rules_cmd",
    "run": "run",
    "runs": "runs",
    "summary": "summary",
}

# Arguments that name one run, per subcommand: resolved once, in ``main``, by ``commands._paths.resolve_run``
# (a run folder, a folder of runs -> its latest run, a bare run id under ./ranksight-runs), so every
# command accepts the same things and fails with the same one-line errors.
RUN_ARGUMENTS = {
    "baseline": ("run_dir",),
    "compare": ("run_a", "run_b"),
    "diagnose": ("run_dir",),
    "digest": ("run_dir",),
    "export": ("run_dir",),
    "ingest": ("run_dir",),
    "summary": ("run_dir",),
}


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="ranksight",
        description="Per-rank telemetry and diagnosis for distributed PyTorch training.",
    )
    from ranksight._version import __version__

    parser.add_argument("--version", action="version", version=f"ranksight {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        mod = importlib.import_module(f"ranksight.commands.{module}")
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def resolve_run_arguments(args: argparse.Namespace) -> None:
    """Replace each run argument of the subcommand (``RUN_ARGUMENTS``) with the run folder it names."""
    from ranksight.commands._paths import resolve_run

    for name in RUN_ARGUMENTS.get(args.command, ()):
        if hasattr(args, name):
            setattr(args, name, resolve_run(getattr(args, name)))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from ranksight.collectors import RunDirError

    try:
        resolve_run_arguments(args)
        return int(args._run(args) or 0)
    except (UserError, RunDirError) as exc:
        print(f"ranksight {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_stdout()


def _closed_stdout() -> int:
    """The reader of our output went away (``ranksight diagnose RUN | head``): stop quietly, like other
    command-line tools, instead of a traceback; point stdout at /dev/null so the interpreter's own final
    flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout has no descriptor (captured): nothing left to flush
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
