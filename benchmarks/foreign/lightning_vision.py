"""A Lightning image classifier as most Lightning code is written: a torchvision ResNet held as
``self.net``, ``training_step`` calling ``self.net(x)`` (``--style submodule``) or ``self(x)``
(``--style self``), bf16-mixed, one device, a DataLoader with workers and pinned memory.

Faults: ``input`` (per-item augmentation in the main process: ``num_workers=0``), ``pageable``
(``pin_memory=False``: the batch copy blocks the host).
"""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--style", default="submodule", choices=["submodule", "self"])
p.add_argument("--fault", default="none", choices=["none", "input", "pageable"])
p.add_argument("--steps", type=int, default=None)
args = p.parse_args()
args.steps = args.steps or (40 if args.fault == "input" else 100)


class Images(Dataset):
    def __init__(self, n=2048, augment=False):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(64, 3, 224, 224, generator=g)
        self.y = torch.randint(0, 1000, (n,), generator=g)
        self.n, self.augment = n, augment

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = self.x[i % 64]
        if self.augment:  # a heavy per-item pipeline
            for _ in range(6):
                img = torchvision.transforms.functional.gaussian_blur(img, [9, 9])
            img = torchvision.transforms.functional.rotate(img, 10.0)
        return img, self.y[i]


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torchvision.models.resnet50(weights=None)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x) if args.style == "self" else self.net(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


workers = 0 if args.fault == "input" else 6
loader = DataLoader(
    Images(augment=args.fault == "input"),
    batch_size=64,
    shuffle=True,
    num_workers=workers,
    pin_memory=args.fault != "pageable",
    persistent_workers=workers > 0,
    drop_last=True,
)
callbacks = []
if args.tool == "ranksight":
    import ranksight.integrations.lightning

    callbacks.append(ranksight.integrations.lightning.RanksightCallback())
trainer = L.Trainer(
    accelerator="gpu",
    devices=1,
    precision="bf16-mixed",
    max_steps=args.steps,
    callbacks=callbacks,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Classifier(), loader)
