"""Lightning + ranksight + the trainer's own experiment trackers: a 2-process DDP job on CPU (gloo), run by the tests.

python lightning_trackers.py --logger tensorboard            # TensorBoardLogger in ./tb
python lightning_trackers.py --logger wandb --logger mlflow  # WandbLogger (WANDB_MODE=offline works), MLFlowLogger

The callback needs no tracker configuration: it finds the trainer's loggers and, on global rank 0, logs
ranksight's per-rank scalars into their runs while the fit runs and the verdict and report at its end.
"""

import argparse
import os
import sys

import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lightning_train import Regressor, Samples  # noqa: E402

from ranksight.integrations.lightning import RanksightCallback  # noqa: E402


def make_logger(name: str, out: str):
    if name == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=os.path.join(out, "tb"), name="fit")
    if name == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project="ranksight-example", save_dir=os.path.join(out, "wandb"))
    from lightning.pytorch.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name="ranksight-example", tracking_uri="file:" + os.path.join(out, "mlruns"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--out", default=".", help="where the trackers' local files go")
    parser.add_argument("--logger", action="append", choices=["tensorboard", "wandb", "mlflow"], required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between two ranksight samples")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch = 256
    data = Samples(n=batch * (args.steps + 2) * 2, decode_s=0.0)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        logger=[make_logger(name, args.out) for name in args.logger],
        callbacks=[RanksightCallback(run_dir=args.run_dir, job="lightning-trackers", tracker_interval_s=args.interval)],
        log_every_n_steps=5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(width=256, depth=2), DataLoader(data, batch_size=batch, num_workers=0))


if __name__ == "__main__":
    main()
