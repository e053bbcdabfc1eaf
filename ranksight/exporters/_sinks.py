"""One sink per tracker: where the points, the verdict and the report go in W&B, MLflow and TensorBoard.

A sink logs into the run the user already has when it is given one (a ``wandb`` run, an MLflow run id, a
``SummaryWriter``'s log dir) and starts its own otherwise. Its target is settled by ``open()`` on the
caller's thread (MLflow's active run is thread-local), and everything else may run on a follower's thread.
Only these classes import a tracker, and only when used: ``ranksight[wandb]``, ``ranksight[mlflow]``,
``ranksight[tensorboard]``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Optional

from ranksight.format.markdown import markdown_table

from ._points import METRICS, Point
from ._verdict import BREAKDOWN_COLUMNS, FINDING_COLUMNS, breakdown_rows, finding_rows, verdict_summary

PREFIX = "ranksight"
STEP_KEY = f"{PREFIX}/step"


def scalar_key(rank: int, name: str) -> str:
    """``ranksight/rank<r>/<name>``: one series per rank, side by side in every tracker."""
    return f"{PREFIX}/rank{rank}/{name}"


def _by_step(points: Sequence[Point]) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for p in points:
        row = rows.setdefault(p.step, {})
        for name, value in p.values.items():
            row[scalar_key(p.rank, name)] = value
    return dict(sorted(rows.items()))


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} is not installed: pip install 'ranksight[{extra}]'") from None


class TrackerSink:
    """What the exporter calls; each tracker implements it."""

    name = "tracker"
    owned = False
    """Whether this sink started the tracker's run (and so ends it in ``close``)."""

    def open(self, run_id: str) -> None:
        """Settle the target run (the user's, or a new one named after ranksight's ``run_id``)."""

    def log_points(self, points: Sequence[Point]) -> None:
        """Log the per-rank scalars."""

    def log_verdict(self, result: dict, step: int) -> None:
        """Log the verdict (summary, findings and breakdown tables)."""

    def log_report(self, files: dict[str, str]) -> None:
        """Keep the report files (name -> text) with the run."""

    def close(self) -> None:
        """End the run if this sink started it; the user's run is left open."""

    def where(self) -> str:
        """Where the records went, for the command's last line."""
        return self.name


class WandbSink(TrackerSink):
    """Weights & Biases: ``wandb.run`` when one is active (or ``run=``), else a new run in ``project``.

    The scalars use their own x axis (``ranksight/step``, through ``define_metric``). In a run that is
    the user's, a sample is logged with ``commit=False``: it rides along in the user's next row, so ranksight
    never moves the run's step counter nor commits a row the user is still writing (so of the samples
    taken between two of the user's rows, the last is kept); in a run of its own, each sample is a row.
    Either way the whole series is also logged at the end as the ``ranksight/scalars`` table (step, rank,
    metrics). ``WANDB_MODE=offline`` works as for any run.
    """

    MAX_TABLE_ROWS = 20000

    name = "wandb"

    def __init__(self, run: Any = None, *, project: str = "ranksight", name: Optional[str] = None,
                 dir: Optional[str] = None, init_kwargs: Optional[dict] = None) -> None:  # fmt: skip
        self.run = run
        self.project, self.run_name, self.dir = project, name, dir
        self.init_kwargs = dict(init_kwargs or {})
        self._points: list[Point] = []

    def open(self, run_id: str) -> None:
        wandb = _need("wandb", "wandb")
        if self.run is None and getattr(wandb, "run", None) is not None:
            self.run = wandb.run
        if self.run is None:
            kwargs = {"project": self.project, "name": self.run_name or run_id, "job_type": "ranksight",
                      "config": {"ranksight_run": run_id}, **self.init_kwargs}  # fmt: skip
            if self.dir:
                os.makedirs(self.dir, exist_ok=True)
                kwargs["dir"] = self.dir
            self.run = wandb.init(**kwargs)
            self.owned = True
        self.run.define_metric(STEP_KEY)
        self.run.define_metric(f"{PREFIX}/*", step_metric=STEP_KEY)

    def log_points(self, points: Sequence[Point]) -> None:
        self._points.extend(points)
        if len(self._points) > self.MAX_TABLE_ROWS:
            self._points = self._points[::2]  # thinned evenly: a long run's table stays bounded
        for step, row in _by_step(points).items():
            self.run.log({STEP_KEY: step, **row}, commit=self.owned)

    def log_verdict(self, result: dict, step: int) -> None:
        import wandb

        self.run.summary.update({f"{PREFIX}/verdict/{k}": v for k, v in verdict_summary(result).items()})
        tables = {
            f"{PREFIX}/findings": wandb.Table(columns=list(FINDING_COLUMNS), data=finding_rows(result)),
            f"{PREFIX}/breakdown": wandb.Table(columns=list(BREAKDOWN_COLUMNS), data=breakdown_rows(result)),
        }
        if self._points:
            rows = [[p.step, p.rank] + [p.values.get(m) for m in METRICS] for p in self._points]
            tables[f"{PREFIX}/scalars"] = wandb.Table(columns=["step", "rank", *METRICS], data=rows)
        self.run.log({STEP_KEY: step, **tables}, commit=self.owned)

    def log_report(self, files: dict[str, str]) -> None:
        import wandb

        artifact = wandb.Artifact(f"ranksight-report-{self.run.id}", type="ranksight-report")
        for name, text in files.items():
            with artifact.new_file(name) as f:
                f.write(text)
        self.run.log_artifact(artifact)

    def close(self) -> None:
        if self.owned and self.run is not None:
            self.run.finish()

    def where(self) -> str:
        run = self.run
        return f"wandb run {getattr(run, 'id', '?')} ({getattr(run, 'dir', '') or getattr(run, 'url', '')})"


class MlflowSink(TrackerSink):
    """MLflow: ``run_id=`` (or the thread's ``mlflow.active_run()`` at ``open``), else a new run in
    ``experiment``. Scalars are metrics with ranksight's step; the verdict is ``ranksight.verdict.*`` tags,
    two ``ranksight/verdict/*`` metrics and two tables; the report files are artifacts under ``ranksight/``."""

    name = "mlflow"

    def __init__(self, run_id: Optional[str] = None, *, tracking_uri: Optional[str] = None, client: Any = None,
                 experiment: str = "ranksight", run_name: Optional[str] = None) -> None:  # fmt: skip
        self.run_id, self.tracking_uri, self.client = run_id, tracking_uri, client
        self.experiment, self.run_name = experiment, run_name

    def open(self, run_id: str) -> None:
        mlflow = _need("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        if self.run_id is None:
            active = mlflow.active_run()  # thread-local: this runs on the caller's thread
            if active is not None:
                self.run_id = active.info.run_id
                self.tracking_uri = self.tracking_uri or mlflow.get_tracking_uri()
        if self.client is None:
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
            run = self.client.create_run(exp_id, run_name=self.run_name or run_id, tags={"ranksight.run": run_id})
            self.run_id = run.info.run_id
            self.owned = True

    def log_points(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, step) for step, row in _by_step(points).items() for key, value in row.items()
        ]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_verdict(self, result: dict, step: int) -> None:
        import pandas as pd

        summary = verdict_summary(result)
        for key, value in summary.items():
            if key in ("cost_share", "speedup", "confidence"):
                self.client.log_metric(self.run_id, f"{PREFIX}/verdict/{key}", float(value), step=step)
            self.client.set_tag(self.run_id, f"{PREFIX}.verdict.{key}", str(value)[:5000])
        self.client.log_table(self.run_id, pd.DataFrame(finding_rows(result), columns=list(FINDING_COLUMNS)),
                              f"{PREFIX}/findings.json")  # fmt: skip
        self.client.log_table(self.run_id, pd.DataFrame(breakdown_rows(result), columns=list(BREAKDOWN_COLUMNS)),
                              f"{PREFIX}/breakdown.json")  # fmt: skip

    def log_report(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            self.client.log_text(self.run_id, text, f"{PREFIX}/{name}")

    def close(self) -> None:
        if self.owned and self.run_id is not None:
            self.client.set_terminated(self.run_id)

    def where(self) -> str:
        return f"mlflow run {self.run_id} ({getattr(self.client, 'tracking_uri', '') or self.tracking_uri or ''})"


class TensorBoardSink(TrackerSink):
    """TensorBoard: event files in ``log_dir`` (next to a ``SummaryWriter``'s, the callbacks use its log dir's
    ``ranksight/`` sub-folder, which TensorBoard shows as a run of its own). Written with TensorBoard's own
    event writer, so neither torch nor TensorFlow is needed. The verdict and breakdown are Markdown tables in
    the Text tab; the report files are written into ``log_dir``."""

    name = "tensorboard"

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writer: Any = None

    def open(self, run_id: str) -> None:
        _need("tensorboard", "tensorboard")
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = EventFileWriter(self.log_dir, filename_suffix=".ranksight")
        self.owned = True

    def _add(self, step: int, summary: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def log_points(self, points: Sequence[Point]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        for step, row in _by_step(points).items():
            self._add(step, Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in row.items()]))
        self._writer.flush()

    def log_verdict(self, result: dict, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb

        summary = verdict_summary(result)
        self._add(step, text_pb(f"{PREFIX}/verdict", markdown_table(("field", "value"), list(summary.items()))))
        self._add(step, text_pb(f"{PREFIX}/findings", markdown_table(FINDING_COLUMNS, finding_rows(result))))
        self._add(step, text_pb(f"{PREFIX}/breakdown", markdown_table(BREAKDOWN_COLUMNS, breakdown_rows(result))))
        numbers = [(k, summary[k]) for k in ("cost_share", "speedup") if summary.get(k) is not None]
        if numbers:
            self._add(
                step,
                Summary(value=[Summary.Value(tag=f"{PREFIX}/verdict/{k}", simple_value=float(v)) for k, v in numbers]),
            )
        self._writer.flush()

    def log_report(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            with open(os.path.join(self.log_dir, f"ranksight-{name}"), "w") as f:
                f.write(text)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def where(self) -> str:
        return f"tensorboard log dir {self.log_dir}"
