"""A Lightning image classifier (LightningModule + LightningDataModule) with the ranksight callback.

The shape of Lightning's CIFAR-style examples: a small CNN, a ``LightningDataModule`` whose dataset
normalises and augments each image in ``__getitem__``, ``self.log`` of loss and accuracy, and
``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` (Lightning starts the second rank itself).
Synthetic 32x32 images, nothing downloaded.

    OMP_NUM_THREADS=1 python lightning_trainer.py --fault none
    python lightning_trainer.py --device cuda --fault none    # Trainer(accelerator="gpu", devices=2): NCCL

``--size gpu`` (implied by ``--device cuda``): the same three convolutions 256/512/512 channels wide at
256 images a GPU (TF32 convolutions, cuDNN's default), with 4 loader workers as a GPU script has them
(``benchmarks/results/diagnosis_history.md``, "The GPU sizes").

Faults (``--fault``):

- ``input``: per-image random crop + flip + colour jitter + normalisation in numpy in
  ``__getitem__`` (9 rounds on CPU, 1 at the GPU size), with ``num_workers=0``.
- ``straggler``: rank 1 also runs a second "consistency" pass of the convolutional trunk on a
  flipped copy of the batch (``if self.global_rank == 1``, a debug leftover): ~1/3 more work.
- ``metric-collectives``: ``self.log_dict(..., on_step=True, sync_dist=True)`` of loss, accuracy,
  top-5 and lr (a barrier and an all-reduce each, every step) and ``self.trainer.strategy.barrier()``.
- ``exposed-allreduce``: a 4096-wide fully connected classifier head on 8 images per rank (~84 MB
  of gradients); 12288 wide at the GPU size (1.0 GB).
- ``unused-params``: ``strategy="ddp_find_unused_parameters_true"`` though every parameter is used.
- ``graph-breaks``: ``torch.compile`` of the network inside the module (not the whole LightningModule:
  dynamo failed on ``training_step`` and ``self.log``), whose ``forward`` has a data-dependent ``if``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from _corpus_options import CORE_FAULTS, add_corpus_options
from _truth import Truth
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ranksight.integrations.lightning import RanksightCallback

FAULTS = CORE_FAULTS
MEAN = np.array([0.49, 0.48, 0.45], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.25, 0.24, 0.26], dtype=np.float32).reshape(3, 1, 1)


class SyntheticImages(Dataset):
    def __init__(self, n, augment=False, truth=None, augment_rounds=9):
        rng = np.random.default_rng(0)
        self.augment_rounds = augment_rounds
        self.images = rng.integers(0, 256, size=(n, 3, 36, 36), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=n)
        self.augment = augment
        self.truth = truth

    def __len__(self):
        return len(self.images)

    def _transform(self, img):
        rng = np.random.default_rng()
        x = img.astype(np.float32) / 255.0
        for _ in range(self.augment_rounds):  # rounds of random crop / flip / jitter, as a transform pipeline would
            i, j = rng.integers(0, 5, size=2)
            crop = x[:, i : i + 32, j : j + 32]
            if rng.random() < 0.5:
                crop = crop[:, :, ::-1]
            crop = crop * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)
            crop = np.clip(crop, 0.0, 1.0)
            x = np.pad(crop, ((0, 0), (2, 2), (2, 2)), mode="reflect")
        return ((x[:, 2:34, 2:34] - MEAN) / STD).astype(np.float32)

    def __getitem__(self, i):
        if self.augment:
            with self.truth.fault():
                x = self._transform(self.images[i])
        else:
            x = ((self.images[i, :, 2:34, 2:34].astype(np.float32) / 255.0) - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(x)), int(self.labels[i])


class ImageDataModule(LightningDataModule):
    def __init__(self, batch_size, n_items, augment, truth, augment_rounds=9, num_workers=0):
        super().__init__()
        self.batch_size, self.n_items, self.augment, self.truth = batch_size, n_items, augment, truth
        self.augment_rounds = augment_rounds
        self.num_workers = num_workers

    def setup(self, stage):
        self.train_set = SyntheticImages(self.n_items, self.augment, self.truth, self.augment_rounds)

    def train_dataloader(self):
        workers = {"num_workers": self.num_workers, "persistent_workers": True} if self.num_workers else {}
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, **workers)


class Net(nn.Module):
    def __init__(self, head_width=128, range_check=False, channels=(32, 64, 64)):
        super().__init__()
        self.range_check = range_check
        c1, c2, c3 = channels
        self.trunk = nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        )  # fmt: skip
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(c3 * 16, head_width), nn.ReLU(), nn.Linear(head_width, head_width), nn.ReLU(),
            nn.Linear(head_width, 10),
        )  # fmt: skip

    def forward(self, x):
        if self.range_check and x.abs().max() > 100:  # data-dependent branch: a graph break
            x = x.clamp(-100, 100)
        return self.head(self.trunk(x))


class LitClassifier(LightningModule):
    def __init__(self, head_width=128, consistency_rank=-1, range_check=False, sync_metrics=False,
                 compile_backend=None, truth=None, channels=(32, 64, 64)):  # fmt: skip
        super().__init__()
        self.save_hyperparameters(ignore=["truth"])
        self.net = Net(head_width, range_check, tuple(channels))
        if compile_backend:
            self.net = torch.compile(self.net, backend=compile_backend)
        self.truth = truth

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        if self.global_rank == self.hparams.consistency_rank:
            # consistency regulariser on a flipped view (meant to be switched on everywhere, or nowhere)
            flipped = self.net.trunk(torch.flip(x[: len(x) // 3], dims=[3]))
            loss = loss + 0.0 * flipped.mean()
        acc = (logits.argmax(dim=1) == y).float().mean()
        top5 = (logits.topk(5, dim=1).indices == y[:, None]).any(dim=1).float().mean()
        metrics = {"train_loss": loss, "train_acc": acc, "train_top5": top5}
        if self.hparams.sync_metrics:
            with self.truth.fault():
                metrics["lr"] = torch.tensor(self.trainer.optimizers[0].param_groups[0]["lr"], device=self.device)
                self.log_dict(metrics, on_step=True, prog_bar=True, sync_dist=True)
                self.trainer.strategy.barrier()
        else:
            self.log_dict(metrics, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


class TruthCallback(Callback):
    def __init__(self, truth):
        self.truth = truth

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.truth.step_end()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    add_corpus_options(parser, "lightning-trainer", FAULTS, dist_backend=False)
    args = parser.parse_args()
    fault = args.fault
    on_gpu = args.device == "cuda"
    size = args.size or ("gpu" if on_gpu else "cpu")

    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning's launcher in the child process
    truth = Truth(rank, fault)
    batch, head_width, channels, augment_rounds = 64, 128, (32, 64, 64), 9
    if size == "gpu":  # ~2.8 GFLOP an image forward + backward, 256 images: ~0.7 TFLOP a step
        batch, channels, augment_rounds = 256, (256, 512, 512), 1
    if fault == "exposed-allreduce":
        batch, head_width = 8, 4096 if size == "cpu" else 12288
    model = LitClassifier(head_width=head_width, channels=channels, truth=truth,
                          consistency_rank=args.straggler_rank if fault == "straggler" else -1,
                          range_check=fault == "graph-breaks", sync_metrics=fault == "metric-collectives",
                          compile_backend=args.compile_backend if fault == "graph-breaks" else None)  # fmt: skip
    data = ImageDataModule(batch, batch * args.devices * (args.steps + 2), fault == "input", truth,
                           augment_rounds=augment_rounds,
                           num_workers=4 if size == "gpu" and fault != "input" else 0)  # fmt: skip
    strategy = "ddp_find_unused_parameters_true" if fault == "unused-params" else "ddp"
    trainer = Trainer(
        accelerator="gpu" if on_gpu else "cpu", devices=args.devices,
        # on one GPU (calibration) still DDP over NCCL, so the DDP code paths are the ones timed
        strategy=strategy if args.devices > 1 or on_gpu else "auto",
        max_steps=args.steps, default_root_dir=tempfile.mkdtemp(prefix="lightning-trainer-"),
        callbacks=[RanksightCallback(run_dir=args.run_dir, job=args.job, run_id=args.run_id), TruthCallback(truth)],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    truth.write()


if __name__ == "__main__":
    main()
