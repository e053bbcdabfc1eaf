"""One module per ``ranksight`` subcommand: ``add_parser(subparsers)`` and ``run(args) -> int``."""
