"""A small GPT-like workload on synthetic data (bf16 autocast) with faults that can be planted.

Shared by the GPU validation and cost scripts (``benchmarks/gpu_validate.py``,
``benchmarks/gpu_cost.py``). Faults: ``pageable`` (no pinned memory), ``cpu_layernorm`` (one
LayerNorm left on the CPU), ``item`` (``loss.item()`` every step), ``fragment`` (an allocation pattern
that leaves the caching allocator's free memory in small pieces).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, cpu_ln: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.cpu_ln = cpu_ln

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_ln:  # the planted fault: this LayerNorm's parameters stayed on the CPU
            h = self.ln1(x.float().cpu()).to(x.device, x.dtype)
        else:
            h = self.ln1(x)
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, d: int = 512, layers: int = 4, heads: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def make_model(d: int, layers: int, device: str = "cuda", cpu_layernorm: bool = False) -> TinyGPT:
    """Build the model on the device; with ``cpu_layernorm``, move block 0's first LayerNorm back."""
    torch.manual_seed(0)
    model = TinyGPT(d, layers).to(device)
    if cpu_layernorm:
        model.blocks[0].cpu_ln = True
        model.blocks[0].ln1.to("cpu")
    return model


def make_batches(n: int, b: int, t: int, d: int, pinned: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic (input, target) batches in host memory, pinned or pageable."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x, y = torch.randn(b, t, d, generator=g), torch.randn(b, t, d, generator=g)
        out.append((x.pin_memory(), y.pin_memory()) if pinned else (x, y))
    return out


class Fragmenter:
    """Keeps a changing set of odd-sized live tensors so freed cache blocks end up small and scattered."""

    def __init__(self, device: str = "cuda", keep: int = 96, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.device = device
        self.live: list[torch.Tensor] = []
        self.keep = keep

    def step(self) -> None:
        for _ in range(8):
            mb = self.rng.choice([3, 5, 7, 11, 13, 19, 23, 29])
            self.live.append(
                torch.empty(mb * (1 << 20) + self.rng.randrange(1 << 16), dtype=torch.uint8, device=self.device)
            )
        while len(self.live) > self.keep:
            self.live.pop(self.rng.randrange(len(self.live)))


def train_step(model, opt, batch, device: str, pinned: bool, fault: str = "", fragmenter=None) -> torch.Tensor:
    """One training step: copy the batch, forward/backward in bf16 autocast, optimizer step."""
    x, y = batch
    x = x.to(device, non_blocking=pinned)
    y = y.to(device, non_blocking=pinned)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    loss = F.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if fault == "item":
        loss.item()  # the planted fault: a host sync every step
    if fragmenter is not None:
        fragmenter.step()
    return loss
