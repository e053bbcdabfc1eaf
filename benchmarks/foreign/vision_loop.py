"""A torchvision reference-style classification loop: uint8 images through ``transforms.v2`` in
DataLoader workers, autocast bf16, channels-last ResNet-50, the three-line ranksight API.

Faults: ``input`` (the transforms in the main process, ``num_workers=0``), ``pageable``
(``pin_memory=False``, the batch sent as float32).
"""

import argparse

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--fault", default="none", choices=["none", "input", "pageable"])
p.add_argument("--steps", type=int, default=None)
args = p.parse_args()
args.steps = args.steps or (50 if args.fault == "input" else 120)

transform = v2.Compose(
    [
        v2.RandomResizedCrop(176, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]
)


class Images(Dataset):
    def __init__(self, n=50_000):
        self.n = n
        self.base = torch.randint(0, 255, (64, 3, 232, 232), dtype=torch.uint8)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return transform(self.base[i % 64]), i % 1000


device = torch.device("cuda")
model = torchvision.models.resnet50(num_classes=1000).to(device, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
loader = DataLoader(
    Images(),
    batch_size=128,
    shuffle=True,
    num_workers=0 if args.fault == "input" else 8,
    pin_memory=args.fault != "pageable",
    drop_last=True,
    persistent_workers=args.fault != "input",
)

mon = tm = None
if args.tool == "ranksight":
    import ranksight

    mon = ranksight.init(job="vision-loop")
    mon.watch(model, optimizer=opt)
    loader = mon.loader(loader)
elif args.tool == "traceml":
    import traceml_ai as tm

model.train()
for step, (image, target) in enumerate(loader):
    if step >= args.steps:
        break
    ctx = mon.step() if mon else (tm.trace_step(model) if tm else None)
    if ctx:
        ctx.__enter__()
    image = image.to(device, non_blocking=True, memory_format=torch.channels_last)
    target = target.to(device, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(image), target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if ctx:
        ctx.__exit__(None, None, None)
if mon:
    mon.close()
