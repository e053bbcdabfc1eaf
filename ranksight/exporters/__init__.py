"""The verdict and the step breakdown in the experiment tracker the user already watches: W&B, MLflow,
TensorBoard.

Read from the run folder through ``ranksight.collectors`` and ``ranksight.rules``, never on the training
thread: after a run (``export_run``, ``ranksight export``) or live (``Follower``, which the framework callbacks
start on global rank 0 for the trackers the framework already logs to: a reader process polls the folder and
a thread hands its points to the trackers' runs in the training process).
"""

from ranksight.format.warmup import WARMUP_STEPS

from ._follow import Follower, Guarded, export_run
from ._points import METRICS, Point, SpoolCursor, run_points
from ._sinks import PREFIX, STEP_KEY, MlflowSink, TensorBoardSink, TrackerSink, WandbSink, scalar_key
from ._verdict import BREAKDOWN_COLUMNS, FINDING_COLUMNS, verdict_summary

TRACKERS = ("wandb", "mlflow", "tensorboard")
"""The trackers ``ranksight export --to`` and the callbacks' ``trackers=`` know."""

__all__ = [
    "BREAKDOWN_COLUMNS",
    "FINDING_COLUMNS",
    "METRICS",
    "PREFIX",
    "STEP_KEY",
    "TRACKERS",
    "Follower",
    "Guarded",
    "MlflowSink",
    "Point",
    "SpoolCursor",
    "TensorBoardSink",
    "TrackerSink",
    "WandbSink",
    "export_run",
    "follow",
    "run_points",
    "scalar_key",
    "verdict_summary",
]


def follow(run_path: str, sinks: list, *, interval_s: float = 10.0, warmup_steps: int = WARMUP_STEPS,
           process: bool = True) -> Follower:  # fmt: skip
    """Start a :class:`Follower` on ``run_path`` (e.g. ``mon.run_path`` on global rank 0); call its
    ``finish()`` after ``mon.close()`` to log the verdict (it also runs at exit). ``process=True``: the folder
    is read by a child process, not in the training process (see :class:`Follower`)."""
    return Follower(run_path, sinks, interval_s=interval_s, warmup_steps=warmup_steps, process=process).start()
