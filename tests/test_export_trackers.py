"""ranksight export and the live follower against the real trackers' local back ends, on a real 2-rank gloo job:
W&B offline (its .wandb file read back with W&B's own protobuf records), an MLflow file store (read back with
MlflowClient), TensorBoard event files (read back with TensorBoard's EventAccumulator). A tracker that raises
costs no data: the run folder is untouched, the verdict still computable, the other trackers complete."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import struct

import pytest

from ranksight.cli import main

from ._jobs import Job, run

wandb = pytest.importorskip("wandb", reason="install the extra: pip install 'ranksight[wandb]'")
mlflow = pytest.importorskip("mlflow", reason="install the extra: pip install 'ranksight[mlflow]'")
pytest.importorskip("tensorboard", reason="install the extra: pip install 'ranksight[tensorboard]'")
pytestmark = pytest.mark.slow

STEPS = 24


def offline_env(monkeypatch, root) -> None:
    """W&B offline with every file under ``root`` (never the network, never $HOME); MLflow's file store allowed."""
    for key, value in {
        "WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_CACHE_DIR": str(root / "cache"),
        "WANDB_CONFIG_DIR": str(root / "config"), "WANDB_DATA_DIR": str(root / "data"), "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)


def wandb_records(run_dir: str) -> list:
    """The records of an offline run's ``.wandb`` file (a LevelDB-style log of W&B's own protobuf ``Record``s)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def wandb_run_data(run_dir: str) -> dict:
    """History rows, the summary and the artifacts' files of an offline run."""
    rows, summary, artifacts = [], {}, {}
    for r in wandb_records(run_dir):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "artifact":
            artifacts[r.artifact.type] = sorted(m.path for m in r.artifact.manifest.contents)
    return {"rows": rows, "summary": summary, "artifacts": artifacts}


def wandb_table(run_dir: str, summary: dict, key: str) -> list[dict]:
    """A logged ``wandb.Table`` read back from the run's files, as dicts."""
    with open(os.path.join(run_dir, "files", summary[f"{key}/path"])) as f:
        table = json.load(f)
    return [dict(zip(table["columns"], row)) for row in table["data"]]


def tb_read(log_dir: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tb_text(acc, tag: str) -> str:
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(acc.Tensors(tag)[-1].tensor_proto).item().decode()


def first_serious_rule(run_path: str) -> str:
    from ranksight.rules import diagnose

    serious = [f for f in diagnose(run_path)["findings"] if f["severity"] != "info"]
    return serious[0]["rule"] if serious else "none"


def folder_digest(path: str) -> dict:
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def job_run(tmp_path_factory) -> str:
    """A finished 2-rank gloo job with an input-bound loader (so the verdict is a real finding)."""
    tmp = tmp_path_factory.mktemp("export-job")
    return run(
        Job(run_dir=str(tmp / "runs"), out_dir=str(tmp / "out"), run_id="export-job", steps=STEPS, slow_item_s=0.03)
    )


def test_export_logs_per_rank_scalars_and_the_verdict_to_all_three(job_run, tmp_path, monkeypatch, capsys):
    offline_env(monkeypatch, tmp_path)
    uri = "file:" + str(tmp_path / "mlruns")
    trackers = ["--to", "wandb", "--to", "mlflow", "--to", "tensorboard"]
    where = ["--wandb-dir", str(tmp_path / "wb"), "--tracking-uri", uri, "--log-dir", str(tmp_path / "tb")]
    rc = main(["export", job_run, *trackers, *where])
    out = capsys.readouterr().out
    assert rc == 0, out
    rule = first_serious_rule(job_run)
    assert rule != "none" and f"] {rule}:" in out

    # W&B: a row per step with both ranks' shares on ranksight's own step axis; the verdict in the summary.
    (wb_dir,) = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*"))
    wb = wandb_run_data(wb_dir)
    rows = [r for r in wb["rows"] if "ranksight/rank0/compute_share" in r]
    assert len(rows) == STEPS and all("ranksight/rank1/compute_share" in r for r in rows)
    assert sorted(r["ranksight/step"] for r in rows) == list(range(STEPS))
    assert all(0 < r["ranksight/rank1/data_wait_share"] < 1 for r in rows[5:])
    assert wb["summary"]["ranksight/verdict/rule"] == rule
    assert wb["summary"]["ranksight/verdict/ranks"] and wb["summary"]["ranksight/verdict/fix"]
    assert wb["artifacts"]["ranksight-report"] == ["report.json", "report.txt"]
    findings = wandb_table(wb_dir, wb["summary"], "ranksight/findings")
    assert findings[0]["rule"] == rule or findings[0]["severity"] == "info"
    assert {r["rank"] for r in wandb_table(wb_dir, wb["summary"], "ranksight/breakdown")} == {0, 1}

    # MLflow: one metric per rank and phase, one point per step; the verdict as tags, the report as artifacts.
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (ml_run,) = client.search_runs([client.get_experiment_by_name("ranksight").experiment_id])
    for rank in (0, 1):
        history = client.get_metric_history(ml_run.info.run_id, f"ranksight/rank{rank}/step_time_s")
        assert sorted(m.step for m in history) == list(range(STEPS))
    assert ml_run.data.tags["ranksight.verdict.rule"] == rule
    assert ml_run.info.status == "FINISHED"
    arts = {a.path for a in client.list_artifacts(ml_run.info.run_id, "ranksight")}
    assert {"ranksight/report.json", "ranksight/report.txt", "ranksight/findings.json"} <= arts

    # TensorBoard: scalars per rank read back by TensorBoard's own reader; the verdict in the Text tab.
    acc = tb_read(str(tmp_path / "tb"))
    for rank in (0, 1):
        assert [e.step for e in acc.Scalars(f"ranksight/rank{rank}/data_wait_share")] == list(range(STEPS))
    assert f"| rule | {rule} |" in tb_text(acc, "ranksight/verdict")
    report = json.loads((tmp_path / "tb" / "ranksight-report.json").read_text())
    assert report["run"] == "export-job"


def test_follower_logs_into_the_users_active_runs(job_run, tmp_path, monkeypatch):
    """A wandb run, an MLflow run and a SummaryWriter the user started get the scalars and verdict; ranksight
    leaves them open (the user ends them)."""
    from torch.utils.tensorboard import SummaryWriter

    from ranksight.exporters import Follower, MlflowSink, TensorBoardSink, WandbSink

    offline_env(monkeypatch, tmp_path)
    mlflow.set_tracking_uri("file:" + str(tmp_path / "mlruns"))
    user_wb = wandb.init(project="mine", dir=str(tmp_path))
    writer = SummaryWriter(str(tmp_path / "tb" / "mine"))
    writer.add_scalar("loss", 1.0, 0)
    with mlflow.start_run() as user_ml:
        follower = Follower(
            job_run,
            [WandbSink(), MlflowSink(), TensorBoardSink(os.path.join(writer.log_dir, "ranksight"))],
            interval_s=60,
        ).start()
        assert follower.poll() == 2  # the finished job's steps, one point per rank
        assert follower.finish(timeout_s=60)
        assert mlflow.active_run().info.run_id == user_ml.info.run_id  # still the user's, still open
        assert wandb.run is user_wb
        user_wb.log({"loss": 0.5})  # the user's next row carries ranksight's sample
    user_wb.finish()
    writer.close()

    wb = wandb_run_data(os.path.dirname(user_wb.dir))
    assert any("ranksight/rank1/compute_share" in r and r.get("loss") == 0.5 for r in wb["rows"])
    assert wb["summary"]["ranksight/verdict/rule"] == follower.result["findings"][0]["rule"]
    scalars = wandb_table(os.path.dirname(user_wb.dir), wb["summary"], "ranksight/scalars")
    assert {r["rank"] for r in scalars} == {0, 1}
    client = mlflow.tracking.MlflowClient()
    assert client.get_metric_history(user_ml.info.run_id, "ranksight/rank1/compute_share")
    assert "ranksight.verdict.rule" in client.get_run(user_ml.info.run_id).data.tags
    assert tb_read(os.path.join(writer.log_dir, "ranksight")).Scalars("ranksight/rank0/step_time_s")


def test_a_tracker_that_raises_costs_no_data(job_run, tmp_path, monkeypatch, caplog):
    """MLflow's client raising on every scalar batch: one warning line, the other tracker and the verdict
    complete, the run folder is byte for byte what it was and still diagnoses the same; exit code 1."""
    offline_env(monkeypatch, tmp_path)
    before = folder_digest(job_run)
    rule = first_serious_rule(job_run)

    def down(*args, **kwargs):
        raise ConnectionError("tracking server unreachable\nsecond line")

    monkeypatch.setattr(mlflow.tracking.MlflowClient, "log_batch", down)
    uri = "file:" + str(tmp_path / "mlruns")
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        rc = main(["export", job_run, "--to", "mlflow", "--to", "tensorboard", "--tracking-uri", uri,
                   "--log-dir", str(tmp_path / "tb")])  # fmt: skip
    assert rc == 1
    lines = [r.getMessage() for r in caplog.records if "not logged" in r.getMessage()]
    assert lines == ["ranksight: mlflow: 48 scalar points not logged (ConnectionError: tracking server unreachable); "
                     "the run folder keeps it"]  # fmt: skip
    assert folder_digest(job_run) == before and first_serious_rule(job_run) == rule
    assert [e.step for e in tb_read(str(tmp_path / "tb")).Scalars("ranksight/rank1/step_time_s")] == list(range(STEPS))
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (ml_run,) = client.search_runs([client.get_experiment_by_name("ranksight").experiment_id])
    assert ml_run.data.tags["ranksight.verdict.rule"] == rule  # the verdict went through all the same


def test_a_tracker_that_cannot_start_is_one_line(job_run, tmp_path, monkeypatch, caplog):
    offline_env(monkeypatch, tmp_path)

    def refuse(*args, **kwargs):
        raise RuntimeError("wandb.init refused")

    monkeypatch.setattr(wandb, "init", refuse)
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        rc = main(["export", job_run, "--to", "wandb", "--to", "tensorboard", "--log-dir", str(tmp_path / "tb")])
    assert rc == 1
    assert [r.getMessage() for r in caplog.records if " logged" in r.getMessage()] == [
        "ranksight: wandb: nothing logged, its run could not be started (RuntimeError: wandb.init refused); "
        "the run folder keeps it"
    ]
    assert tb_read(str(tmp_path / "tb")).Scalars("ranksight/rank0/compute_share")


def test_the_reader_process_reads_and_the_thread_logs(job_run, tmp_path, caplog):
    """``process=True`` (what the callbacks use): the folder is read in a child process of the job's process group,
    the points and the verdict come back to this process's sinks, and the child is gone after ``finish``. A child
    that dies costs nothing but one line: the thread reads the folder itself."""
    from ranksight.exporters import Follower, TensorBoardSink

    follower = Follower(job_run, [TensorBoardSink(str(tmp_path / "tb"))], interval_s=60, process=True).start()
    proc = follower._proc
    assert proc is not None and os.getpgid(proc.pid) == os.getpgid(0)
    assert follower.poll() == 2  # one point per rank, read by the child
    assert follower.finish(timeout_s=60)
    assert proc.poll() is not None and follower._proc is None
    assert follower.result["findings"][0]["rule"] == first_serious_rule(job_run)
    acc = tb_read(str(tmp_path / "tb"))
    assert [e.step for e in acc.Scalars("ranksight/rank1/step_time_s")] == [STEPS - 1]
    assert f"| rule | {first_serious_rule(job_run)} |" in tb_text(acc, "ranksight/verdict")

    dying = Follower(job_run, [TensorBoardSink(str(tmp_path / "tb2"))], interval_s=60, process=True).start()
    dying._proc.kill()
    dying._proc.wait()
    with caplog.at_level(logging.WARNING, logger="ranksight"):
        assert dying.poll() == 2  # read here instead
    (line,) = [r.getMessage() for r in caplog.records if "reader process" in r.getMessage()]
    assert line.startswith("ranksight: trackers: reader process ended (") and line.endswith("reading from a thread")
    assert dying.finish(timeout_s=60) and dying.result is not None
