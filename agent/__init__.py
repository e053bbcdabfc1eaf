"""The per-rank agent: measures each training step where it runs, and writes the records from its own thread."""

from ._config import FRAMEWORKS, Config, GpuOptions
from ._identity import Identity, derive_run_id, live_process_group
from ._monitor import LoaderWrapper, Monitor
from ._node_spool import PublishResult, publish_node_spool
from ._noop import NoopMonitor
from ._protocol import MonitorLike

__all__ = [
    "FRAMEWORKS",
    "Config",
    "GpuOptions",
    "Identity",
    "LoaderWrapper",
    "Monitor",
    "MonitorLike",
    "NoopMonitor",
    "PublishResult",
    "derive_run_id",
    "live_process_group",
    "publish_node_spool",
]
