"""A plain user loop: a bf16 stack of wide MLP blocks over token embeddings, fed token ids by a
DataLoader with workers and pinned memory, the three-line ranksight API. GPU-bound when healthy.

Faults: ``cpu-ops`` (each block's norm computed on the CPU: ``.cpu()`` round trips per block, as code
ported from a CPU prototype does).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--fault", default="none", choices=["none", "cpu-ops"])
p.add_argument("--steps", type=int, default=150)
args = p.parse_args()
VOCAB, SEQ, WIDTH, DEPTH = 32000, 512, 2048, 8


class Tokens(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, VOCAB, (SEQ + 1,), generator=g)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        if args.fault == "cpu-ops":
            h = F.layer_norm(x.float().cpu(), (WIDTH,)).to(x.device, x.dtype)
        else:
            h = self.norm(x)
        return x + self.down(F.gelu(self.up(h)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


device = "cuda"
model = Net().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = DataLoader(Tokens(), batch_size=8, num_workers=4, pin_memory=True)
mon = tm = None
if args.tool == "ranksight":
    import ranksight

    mon = ranksight.init(job="mlp")
    mon.watch(model, optimizer=opt)
    loader = mon.loader(loader)
elif args.tool == "traceml":
    import traceml_ai as tm

for step, batch in enumerate(loader):
    if step >= args.steps:
        break
    ctx = mon.step() if mon else (tm.trace_step(model) if tm else None)
    if ctx:
        ctx.__enter__()
    batch = batch.to(device, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if ctx:
        ctx.__exit__(None, None, None)
if mon:
    mon.close()
