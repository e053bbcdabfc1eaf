"""``ranksight import``: torch.profiler (Kineto) traces written as a ranksight run.

A producer beside the agent, not part of the read side: it writes the spool segments and rank files the
collectors read, so ``diagnose``, ``summary``, ``compare`` and the dashboard read an imported run unchanged.
"""

from ._trace_import import ImportResult, Progress, find_trace_files, import_traces

__all__ = ["ImportResult", "Progress", "find_trace_files", "import_traces"]
