"""Time candidate GPU sizes of the corpus's models in one process on one GPU (no DDP, no agent).

The realistic scripts are eager PyTorch: a step whose kernels are too small is bound by Python
launching them, and then a +30 % straggler's extra rows cost nothing. For each candidate this times a
step as the script takes it (micro-steps, bf16 autocast where the script uses it, optimizer) and the
straggler's version of it; a size is usable when the straggler's step is ~1.3x the healthy one.
It also prints the fp32 gradient bytes, for the exposed all-reduce at an assumed bus bandwidth.

    python benchmarks/gpu_corpus_sizes.py --json gpu_corpus_sizes.json    # ranksight installed

The figures of benchmarks/results/gpu_corpus_calibration_h200.json came from here and from
``diagnosis_corpus.py --device cuda --gpus 1 --straggler-rank 0 --no-diagnose`` (the scripts as run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import write_results  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads"))


def timed(step, steps: int = 6, warmup: int = 3) -> float:
    """Median seconds of ``step()`` with the GPU drained before and after each one."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def gpt_case(n_layer, n_embd, n_head, block, batch, micro, extra_rows):
    from gpt_trainer import GPT, GPTConfig

    cfg = GPTConfig(block_size=block, vocab_size=50304, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    model = GPT(cfg).cuda()
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")

    def step_with(rows):
        def step():
            for _ in range(micro):
                x = torch.randint(0, 50304, (rows, block), device="cuda")
                with torch.amp.autocast("cuda", dtype=torch.bfloat16):
                    _, loss = model(x, x)
                (loss / micro).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    params = sum(p.numel() for p in model.parameters())
    flops = 6 * params * batch * block * micro
    out = {"healthy_s": timed(step_with(batch)), "straggler_s": timed(step_with(batch + extra_rows))}
    out.update(params=params, grad_mb=params * 4 / 1e6, tflop_per_step=flops / 1e12)
    return out


def hf_case(n_layer, n_embd, n_head, seq, straggler_seq, batch):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, fused=True)

    def step_with(length):
        def step():
            x = torch.randint(0, 50257, (batch, length), device="cuda")
            with torch.amp.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    params = sum(p.numel() for p in model.parameters())
    out = {"healthy_s": timed(step_with(seq)), "straggler_s": timed(step_with(straggler_seq))}
    out.update(params=params, grad_mb=params * 4 / 1e6, tflop_per_step=6 * params * batch * seq / 1e12)
    return out


def lightning_case(channels, batch):
    from lightning_trainer import Net

    model = Net(128, False, channels).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def step_with(consistency):
        def step():
            x = torch.randn(batch, 3, 32, 32, device="cuda")
            y = torch.randint(0, 10, (batch,), device="cuda")
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            if consistency:
                loss = loss + 0.0 * model.trunk(torch.flip(x[: len(x) // 3], dims=[3])).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        return step

    params = sum(p.numel() for p in model.parameters())
    out = {"healthy_s": timed(step_with(False)), "straggler_s": timed(step_with(True))}
    out.update(params=params, grad_mb=params * 4 / 1e6)
    return out


CASES = {
    "gpt 4x1536 b3 T512 x2": lambda: gpt_case(4, 1536, 12, 512, 3, 2, 1),
    "gpt 4x1536 b1 T512 x1 (exposed)": lambda: gpt_case(4, 1536, 12, 512, 1, 1, 0),
    "gpt 12x768 b6 T512 x2": lambda: gpt_case(12, 768, 12, 512, 6, 2, 2),
    "hf 4x2048 b4 T512": lambda: hf_case(4, 2048, 16, 512, 672, 4),
    "hf 6x1536 b4 T512": lambda: hf_case(6, 1536, 12, 512, 672, 4),
    "hf 12x768 b8 T512": lambda: hf_case(12, 768, 12, 512, 672, 8),
    "hf 4x2048 b1 T512 (exposed)": lambda: hf_case(4, 2048, 16, 512, 512, 1),
    "lightning 256/512/512 b256": lambda: lightning_case((256, 512, 512), 256),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": {}}
    for name in args.cases:
        try:
            r = CASES[name]()
        except Exception as exc:  # one case failing (memory) must not lose the others
            r = {"error": repr(exc)[:300]}
        torch.cuda.empty_cache()
        if "healthy_s" in r:
            r["straggler_ratio"] = r["straggler_s"] / r["healthy_s"]
        results["cases"][name] = r
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    if args.json:
        write_results(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
