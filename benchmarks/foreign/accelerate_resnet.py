"""An Accelerate training script: ResNet-50, bf16, gradient accumulation over 2 micro-batches,
``accelerator.accumulate`` / ``accelerator.backward`` as Accelerate's examples write them.

Faults: ``input`` (a slow per-item decode and augmentation, 2 workers that cannot keep up).
"""

import argparse

import torch
import torch.nn.functional as F
import torchvision
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--fault", default="none", choices=["none", "input"])
p.add_argument("--steps", type=int, default=None)
args = p.parse_args()
args.steps = args.steps or (30 if args.fault == "input" else 70)


class Images(Dataset):
    def __init__(self, n=4096, slow=False):
        self.n, self.slow = n, slow
        self.base = torch.randint(0, 255, (32, 3, 256, 256), dtype=torch.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = self.base[i % 32].float() / 255
        if self.slow:
            for _ in range(4):
                img = torchvision.transforms.functional.gaussian_blur(img, [11, 11])
        img = torchvision.transforms.functional.center_crop(img, 224)
        return img, i % 1000


accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
model = torchvision.models.resnet50(weights=None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(
    Images(slow=args.fault == "input"),
    batch_size=64,
    shuffle=True,
    num_workers=2 if args.fault == "input" else 6,
    pin_memory=True,
    drop_last=True,
    persistent_workers=True,
)
model, opt, loader = accelerator.prepare(model, opt, loader)
tm = None
if args.tool == "ranksight":
    import ranksight.integrations.accelerate

    tracker = ranksight.integrations.accelerate.attach(accelerator, model, opt)
    loader = tracker.loader(loader)
elif args.tool == "traceml":
    import traceml_ai as tm

model.train()
micro = 0
while micro < 2 * args.steps:
    for x, y in loader:
        ctx = tm.trace_step(model) if tm else None
        if ctx:
            ctx.__enter__()
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if ctx:
            ctx.__exit__(None, None, None)
        micro += 1
        if micro >= 2 * args.steps:
            break
accelerator.end_training()
