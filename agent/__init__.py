"""The per-rank agent: measures each training step where it runs, and writes the records from its own thread."""

from ._config import Config
from ._identity import Identity
from ._monitor import LoaderWrapper, Monitor
from ._noop import NoopMonitor

__all__ = ["Config", "Identity", "LoaderWrapper", "Monitor", "NoopMonitor"]
