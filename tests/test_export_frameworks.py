"""The Hugging Face and Accelerate integrations feed the tracker the framework already logs to (``report_to``,
``log_with``) with no second configuration: one CPU process each, TensorBoard's own reader reads it back."""

from __future__ import annotations

import glob
import os

import pytest

from .test_export_trackers import tb_read, tb_text

pytest.importorskip("tensorboard", reason="install the extra: pip install 'ranksight[tensorboard]'")
pytestmark = pytest.mark.slow


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def test_hf_trainer_report_to_tensorboard_gets_the_scalars_and_verdict(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import torch
    from transformers import Trainer, TrainingArguments

    from ranksight.integrations.transformers import RanksightCallback

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 16 * 30

        def __getitem__(self, i):
            return {"x": torch.randn(8), "labels": torch.randn(1)}

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, max_steps=30,
                             report_to=["tensorboard"], logging_steps=10, save_strategy="no", use_cpu=True)  # fmt: skip
    callback = RanksightCallback(run_dir=str(tmp_path / "runs"), flush_interval_s=0.3, tracker_interval_s=0.3)
    trainer = Trainer(model=Regression(), args=args, train_dataset=Data(), callbacks=[callback])
    callback.trainer = trainer
    trainer.train()

    acc = tb_read(str(tmp_path / "tb" / "ranksight"))
    assert [e.step for e in acc.Scalars("ranksight/rank0/compute_share")][-1] == 29
    assert "| rule |" in tb_text(acc, "ranksight/verdict")
    (run,) = glob.glob(str(tmp_path / "runs" / "*"))
    assert os.path.basename(run) in (tmp_path / "tb" / "ranksight" / "ranksight-report.json").read_text()


def test_accelerate_log_with_tensorboard_gets_them_after_init_trackers(tmp_path):
    pytest.importorskip("accelerate")
    import torch
    from accelerate import Accelerator

    from ranksight.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "tb"))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(320, 8), torch.randn(320, 1)), 16)
    model, opt, data = accelerator.prepare(model, opt, data)
    tracker = attach(accelerator, model, opt, run_dir=str(tmp_path / "runs"), flush_interval_s=0.3)
    assert tracker.follower is None  # no tracker yet: init_trackers comes after attach in this script
    accelerator.init_trackers("fit")
    for x, y in tracker.loader(data):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    tracker.close()
    accelerator.end_training()

    (log_dir,) = glob.glob(str(tmp_path / "tb" / "fit" / "ranksight"))
    acc = tb_read(log_dir)
    assert [e.step for e in acc.Scalars("ranksight/rank0/step_time_s")][-1] == 19
    assert "| rule |" in tb_text(acc, "ranksight/verdict")
