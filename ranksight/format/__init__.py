"""What a run folder holds, as text every reader and writer shares: the bottom of the house.

The agent writes records by ``schema``, the node spool's publisher folds them into ``digest`` (with the
verdict's parts of ``verdict_digest``; ``digest_file`` writes and reads them as files), and the collectors,
the rules and the dashboard read them back with the step phases' SQL of ``phases``; the readers that write the
verdict out as text lay its tables out with ``markdown``. One definition each, so a figure means the same on
both sides of the file. This package imports nothing else of ranksight
(``tests/test_architecture.py`` keeps it so) and neither torch nor pyarrow at import time, so every part of
the project can stand on it.
"""

__all__ = ["digest", "digest_file", "markdown", "phases", "schema", "verdict_digest"]
