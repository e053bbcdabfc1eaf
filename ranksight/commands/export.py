"""``ranksight export --to wandb|mlflow|tensorboard RUN``: a run's scalars, verdict and report in a tracker.

After the run (the default) or, with ``--follow``, while it runs: one point per rank per poll, then the
verdict once every rank has closed. A tracker that fails prints one line saying what it did not get (a warning
of ``ranksight.exporters``) and the command exits 1; the run folder is only read.
"""

from __future__ import annotations

import os
import time

from ranksight.format.warmup import WARMUP_STEPS

from ._errors import UserError

TRACKERS = ("wandb", "mlflow", "tensorboard")


def add_parser(sub):
    p = sub.add_parser(
        "export",
        help="log a run's per-rank scalars, verdict and report to W&B, MLflow or TensorBoard",
        description="Log a run's per-rank step time, phase shares and GPU utilization (ranksight/rank<r>/...), "
        "its verdict (axis, rule, cost, ranks, fix) and its report to experiment trackers. Without --follow "
        "the run is read once, at most --max-points points per rank.",
    )
    p.add_argument("run_dir", nargs="?", default=None, help="a run folder, a run id, or a folder of runs (its latest)")
    p.add_argument("--to", action="append", choices=TRACKERS, required=True, help="a tracker; repeat for several")
    p.add_argument("--follow", action="store_true", help="log while the run runs, the verdict once it ends")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between polls with --follow (default 10)")
    p.add_argument("--max-points", type=int, default=500, help="points per rank after the run (default 500)")
    p.add_argument(
        "--warmup",
        type=int,
        default=WARMUP_STEPS,
        help=f"leading steps per rank the verdict leaves out (default {WARMUP_STEPS})",
    )
    p.add_argument("--name", default=None, help="the tracker run's name (default: the ranksight run id)")
    p.add_argument("--project", default="ranksight", help="W&B project (default ranksight)")
    p.add_argument("--wandb-dir", default=None, help="W&B's local files (default: wandb's own, ./wandb)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, ./mlruns)")
    p.add_argument("--experiment", default="ranksight", help="MLflow experiment (default ranksight)")
    p.add_argument("--mlflow-run-id", default=None, help="log into this existing MLflow run instead of a new one")
    p.add_argument("--log-dir", default=None, help="TensorBoard log dir (default ./ranksight-tensorboard/<run id>)")
    return p


def make_sinks(args) -> list:
    """One sink per ``--to``, each a new tracker run unless told which existing one."""
    from ranksight.exporters import MlflowSink, TensorBoardSink, WandbSink

    run_id = os.path.basename(os.path.normpath(args.run_dir))
    sinks = []
    for name in dict.fromkeys(args.to):
        if name == "wandb":
            sinks.append(WandbSink(project=args.project, name=args.name, dir=args.wandb_dir))
        elif name == "mlflow":
            sinks.append(
                MlflowSink(
                    args.mlflow_run_id, tracking_uri=args.tracking_uri, experiment=args.experiment, run_name=args.name
                )
            )
        else:
            sinks.append(TensorBoardSink(args.log_dir or os.path.join("ranksight-tensorboard", run_id)))
    return sinks


def run(args) -> int:
    from ranksight.exporters import Follower, export_run

    if args.max_points < 1 or args.interval <= 0 or args.warmup < 0:
        raise UserError("--max-points and --interval must be positive and --warmup at least 0")
    sinks = make_sinks(args)
    if args.follow:
        follower = Follower(args.run_dir, sinks, interval_s=args.interval, warmup_steps=args.warmup).start()
        _wait_until_ended(args.run_dir, args.interval)
        follower.finish(timeout_s=120.0)
        failed, result = follower.failed, follower.result
        where = [g.sink.where() for g in follower.sinks]
    else:
        out = export_run(args.run_dir, sinks, max_points=args.max_points, warmup_steps=args.warmup)
        failed, result, where = out["failed"], out["result"], out["where"]
    if result is not None:
        from ._report import verdict_line

        print(verdict_line(result))
    for w in where:
        print(f"logged to {w}" if w.split(" ")[0] not in failed else f"partly logged to {w}")
    return 1 if failed or len(where) < len(sinks) else 0


def _wait_until_ended(run_dir: str, interval_s: float) -> None:
    """Until no rank of the run is live (see ``ranksight.collectors.rank_is_live``)."""
    from ranksight.collectors import rank_is_live, read_rank_meta

    while True:
        metas = read_rank_meta(run_dir)
        if metas and not any(rank_is_live(m) for m in metas):
            return
        time.sleep(min(interval_s, 2.0))
