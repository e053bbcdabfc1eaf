"""A nanoGPT-style training loop: a small GPT written out by hand, ``get_batch`` slicing random windows
of a token array into pinned memory, ``non_blocking`` copies, bf16 autocast, AdamW (fused), the
loss printed every ``log_interval`` steps. The fetch is marked with ``mon.data()``.

Faults: ``host-sync`` (a per-step NaN check and loss log with ``.item()`` and a data-dependent
``nonzero`` for a token count: three host syncs a step); ``unmeasured`` (a slow fetch that is not
marked: the windows are rebuilt from a Python list each step, outside ``mon.data()``).
"""

import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--fault", default="none", choices=["none", "host-sync", "unmeasured"])
p.add_argument("--steps", type=int, default=150)
args = p.parse_args()

block_size, batch_size, n_layer, n_head, n_embd, vocab = 256, 32, 8, 8, 768, 50304
device = "cuda"
data = np.random.default_rng(0).integers(0, vocab, size=20_000_000, dtype=np.uint16)
data_list = data[:2_000_000].tolist() if args.fault == "unmeasured" else None


def get_batch():
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


def get_batch_slow():
    ix = torch.randint(len(data_list) - block_size - 1, (batch_size,)).tolist()
    x = torch.tensor([[data_list[i + k] for k in range(block_size)] for i in ix])
    y = torch.tensor([[data_list[i + 1 + k] for k in range(block_size)] for i in ix])
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=True)
mon = tm = None
if args.tool == "ranksight":
    import ranksight

    mon = ranksight.init(job="nanogpt")
    mon.watch(model, optimizer=optimizer)
elif args.tool == "traceml":
    import traceml_ai as tm

for it in range(args.steps):
    lr = 6e-4 * min(1.0, (it + 1) / 50) * 0.5 * (1 + math.cos(math.pi * it / args.steps))
    for g in optimizer.param_groups:
        g["lr"] = lr
    ctx = mon.step() if mon else (tm.trace_step(model) if tm else None)
    if ctx:
        ctx.__enter__()
    if args.fault == "unmeasured":
        X, Y = get_batch_slow()
    elif mon:
        with mon.data():
            X, Y = get_batch()
    else:
        X, Y = get_batch()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if args.fault == "host-sync":
        if torch.isnan(loss).item():
            raise RuntimeError("loss is NaN")
        tokens = int(torch.nonzero(X != 0).shape[0])
        print(f"iter {it}: loss {loss.item():.4f} tokens {tokens}") if it % 100 == 0 else None
    elif it % 100 == 0:
        print(f"iter {it}: loss {loss.item():.4f}")
    if ctx:
        ctx.__exit__(None, None, None)
if mon:
    mon.close()
