"""The ``ranksight`` command line. Each subcommand lives in ``ranksight.commands.<name>``.

A subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Errors a user can
fix (a bad path, a bad option) print one line and exit with 2; nothing prints a traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ranksight.commands._errors import UserError

__all__ = ["COMMANDS", "UserError", "build_parser", "main"]

# Subcommand name -> module under ranksight.commands. Keep alphabetical.
COMMANDS = {
    "dashboard": "dashboard",
    "demo": "demo",
    "diagnose": "diagnose",
    "ingest": "ingest",
    "rules": "rules_cmd",
    "run": "run",
    "runs": "runs",
    "summary": "summary",
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from ranksight.collectors import RunDirError

    try:
        return int(args._run(args) or 0)
    except (UserError, RunDirError) as exc:
        print(f"ranksight {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
