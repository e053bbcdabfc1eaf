"""The package version, in a module of its own: the agent stamps it on every rank's metadata without
importing ``ranksight`` itself, whose ``init()`` imports the agent."""

__version__ = "0.1.0"
