"""The window reduction now lives in ``ranksight.trace_reduce`` (torch-free), shared with the trace
importer; this name stays for the agent's modules and the tests that import it from here."""

from ranksight.trace_reduce import (  # noqa: F401
    ACTIVITY_KIND,
    AFTER_MARK,
    LOADER_MARK,
    METADATA_OPS,
    SYNC_CALLS,
    WINDOW_MARK,
    Ev,
    WindowReduction,
    events_from_chrome,
    is_comm_kernel,
    reduce_window,
)
