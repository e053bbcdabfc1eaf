"""Framework integrations (Lightning, Hugging Face, Accelerate) that drive the same agent.

Importing this package imports no framework; each integration module imports its own.
"""

from ._autoattach import ATTACH_ENV, BOOTSTRAP_SOURCE, COMM_HOOK_ENV

__all__ = ["ATTACH_ENV", "BOOTSTRAP_SOURCE", "COMM_HOOK_ENV"]
"""What ``ranksight run`` hands to the unmodified script it starts (see ``_autoattach``)."""
