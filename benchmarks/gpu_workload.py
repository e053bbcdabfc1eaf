"""A small GPT-like workload on synthetic data (bf16 autocast on a GPU).

The GPU cost benchmark's job (``benchmarks/gpu_cost.py``). The retired collective-timing script
(``gpu_collectives.py``) ran it too, at commit e40e411; the planted faults of the retired ``gpu_validate.py``
(pageable copies, a LayerNorm on the CPU, ``.item()``, fragmentation) are in this file at commit d0882b6.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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


def make_model(d: int, layers: int, device: str = "cuda") -> TinyGPT:
    """The model on the device, the same weights every time."""
    torch.manual_seed(0)
    return TinyGPT(d, layers).to(device)


def make_batches(n: int, b: int, t: int, d: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic (input, target) batches in pinned host memory."""
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(b, t, d, generator=g).pin_memory(), torch.randn(b, t, d, generator=g).pin_memory())
        for _ in range(n)
    ]


def train_step(model, opt, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One training step on a batch on the model's device: forward (bf16 autocast on a GPU), MSE backward,
    optimizer step."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
        out = model(x)
    loss = F.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss
