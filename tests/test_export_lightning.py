"""The Lightning callback feeds the trainer's own loggers with no tracker configuration: a real 2-process
DDP fit (gloo) with WandbLogger (offline), MLFlowLogger (file store) and TensorBoardLogger at once. Live
samples land while the fit runs (several per rank), the verdict at its end, in the loggers' own runs."""

from __future__ import annotations

import glob
import os
import sys

import pytest

from .test_export_trackers import first_serious_rule, tb_read, tb_text, wandb_run_data, wandb_table
from .test_integration_support import example, run_job

pytest.importorskip("lightning", reason="install the extra: pip install 'ranksight[lightning]'")
mlflow = pytest.importorskip("mlflow", reason="install the extra: pip install 'ranksight[mlflow]'")
pytest.importorskip("wandb", reason="install the extra: pip install 'ranksight[wandb]'")
pytest.importorskip("tensorboard", reason="install the extra: pip install 'ranksight[tensorboard]'")
pytestmark = pytest.mark.slow

STEPS = 200


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning-trackers")
    env = {
        "WANDB_MODE": "offline", "WANDB_DIR": str(tmp), "WANDB_CACHE_DIR": str(tmp / "cache"),
        "WANDB_CONFIG_DIR": str(tmp / "config"), "WANDB_DATA_DIR": str(tmp / "data"), "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off",
        "MLFLOW_ALLOW_FILE_STORE": "true", "RANKSIGHT_FLUSH_INTERVAL_S": "0.5",
    }  # fmt: skip
    loggers = ["--logger", "wandb", "--logger", "mlflow", "--logger", "tensorboard"]
    cmd = [sys.executable, example("lightning_trackers.py"), "--run-dir", str(tmp / "runs"), "--out", str(tmp),
           "--steps", str(STEPS), "--interval", "0.5", *loggers]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        # a wandb.init earlier in this pytest process (test_export_trackers) leaves WANDB_SERVICE set: the job
        # would log through that process's wandb-core, and its run's summary was lost at the job's exit
        mp.delenv("WANDB_SERVICE", raising=False)
        run_job(cmd, cwd=str(tmp), run_id=None, env=env)
    (run,) = glob.glob(str(tmp / "runs" / "*"))
    return {"tmp": tmp, "run": run, "rule": first_serious_rule(run)}


def test_tensorboard_logger_gets_live_per_rank_scalars_and_the_verdict(fit):
    (log_dir,) = glob.glob(str(fit["tmp"] / "tb" / "fit" / "version_*"))
    acc = tb_read(os.path.join(log_dir, "ranksight"))  # a run of its own beside Lightning's events
    for rank in (0, 1):
        steps = [e.step for e in acc.Scalars(f"ranksight/rank{rank}/compute_share")]
        assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == STEPS - 1, steps  # sampled while it ran
    assert f"| rule | {fit['rule']} |" in tb_text(acc, "ranksight/verdict")
    assert os.path.exists(os.path.join(log_dir, "ranksight", "ranksight-report.txt"))


def test_mlflow_logger_run_gets_them(fit, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(tracking_uri="file:" + str(fit["tmp"] / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("ranksight-example").experiment_id])
    for rank in (0, 1):
        history = client.get_metric_history(run.info.run_id, f"ranksight/rank{rank}/step_time_s")
        assert len(history) >= 2 and max(m.step for m in history) == STEPS - 1
    assert run.data.tags["ranksight.verdict.rule"] == fit["rule"]
    assert "ranksight/report.json" in {a.path for a in client.list_artifacts(run.info.run_id, "ranksight")}


def test_wandb_logger_run_gets_them(fit):
    (run_dir,) = glob.glob(str(fit["tmp"] / "wandb" / "wandb" / "offline-run-*"))
    wb = wandb_run_data(run_dir)
    assert wb["summary"]["ranksight/verdict/rule"] == fit["rule"]
    scalars = wandb_table(run_dir, wb["summary"], "ranksight/scalars")
    for rank in (0, 1):
        steps = [r["step"] for r in scalars if r["rank"] == rank]
        assert len(steps) >= 2 and steps[-1] == STEPS - 1
    assert any("ranksight/rank1/compute_share" in row for row in wb["rows"])
    assert wb["artifacts"]["ranksight-report"] == ["report.json", "report.txt"]
