"""The one error type the subcommands raise for a problem the user can fix."""


class UserError(Exception):
    """A problem the user can fix; ``ranksight.cli.main`` prints it as one line and exits with 2."""
