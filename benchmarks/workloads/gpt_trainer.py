"""A nanoGPT-style trainer (train.py + model.py in one file) with the ranksight agent attached.

Written the way nanoGPT and its many forks are: no DataLoader, batches sliced at random offsets from a
uint16 token file through ``np.memmap`` by ``get_batch(split)``, gradient accumulation with
``model.require_backward_grad_sync`` on the last micro-step, the next batch prefetched right after
forward, AdamW with decayed/non-decayed groups, warmup + cosine lr, gradient clipping, and
``estimate_loss()`` on the master process every ``eval_interval`` iterations. Tiny random model,
synthetic tokens, nothing downloaded.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 gpt_trainer.py --fault none
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 gpt_trainer.py --fault input
    torchrun --standalone --nproc-per-node 2 gpt_trainer.py --device cuda --fault none   # 2 GPUs, NCCL

On ``--device cuda`` it runs as nanoGPT does on GPUs: ``torch.cuda.set_device(local_rank)``, NCCL,
``DDP(model, device_ids=[local_rank])``, bf16 autocast, fused AdamW, TF32 on, and batches pinned and
copied with ``non_blocking=True``. ``--size gpu`` (implied by cuda) is a 4-layer, 1536-wide GPT (191M
parameters, vocabulary 50304) at 6 x 512 tokens a micro-batch, 2 micro-batches a rank: GPU compute, not
kernel launches (the sizes' reasons: ``benchmarks/results/diagnosis_history.md``, "The GPU sizes").

Faults (``--fault``), each the way people really make the mistake:

- ``input``: the token file sits on a slow network filesystem and every row of ``get_batch`` is a
  random read (emulated: ``sleep`` per row read; 2.5 ms a read on CPU, 1 ms at the GPU size).
- ``straggler``: uneven per-rank micro-batches (the remainder of the global batch lands on the last
  rank): rank 1 does ~1/3 more forward/backward work (8 rows against 6 at the GPU size, +33 % GPU work).
- ``metric-collectives``: values averaged over ranks for the log on every iteration: each
  micro-batch's loss, then grad norm (total and per block), lr and tokens/s, each with ``barrier``
  + ``all_reduce`` + ``.item()`` (18 collectives per step).
- ``exposed-allreduce``: the GPT-2 vocabulary (50304) on a 2-layer model, one 32-token sequence per
  rank and no accumulation: a 26 MB embedding gradient, all-reduced after backward each step. At the
  GPU size: the 191M model at one 512-token sequence per GPU and no accumulation (765 MB of gradients).
- ``unused-params``: ``DDP(model, find_unused_parameters=True)`` though every parameter is used.
- ``graph-breaks``: ``torch.compile`` of a model whose forward checks its logits with a Python
  ``if`` on a tensor (a data-dependent branch).

GPU faults (``--device cuda`` only: on a CPU job they are not faults):

- ``cpu-ops``: NEFTune-style noise on the embeddings, drawn without ``device=`` (``torch.rand(x.shape)``,
  as many snippets write it): every micro-step draws an activation-sized tensor on the CPU and copies it
  over (6 x 512 x 1536 floats at the GPU size).
- ``host-sync``: per-micro-step logging that reads the GPU back: the loss with ``.item()`` right after
  forward, the valid tokens counted with ``nonzero()``, the grad norm kept with ``.cpu()`` for a
  spike check.
- ``fragmentation``: variable-length micro-batches (128-512 tokens, as with unpadded documents, packed
  to the same token count: 24 rows of 128 or 6 of 512) on a GPU that is nearly full: after warm-up a
  second model's worth of memory (a frozen teacher, an EMA copy) takes all but half the job's own peak.
- ``launch-bound``: the CPU size's tiny model (4 x 128, 8 x 64 tokens) on the GPU: hundreds of kernels
  a micro-step, each shorter than its launch.

``--fix`` applies what the finding's fix says: batches prefetched by background threads (input),
``find_unused_parameters=False``, ``torch.where`` instead of the branch (graph-breaks), the noise drawn on
the GPU (cpu-ops), losses and counts kept on the GPU and read every ``log_interval`` steps (host-sync),
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (fragmentation), a 16x larger batch (launch-bound;
compared per sample).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from _corpus_options import CORE_FAULTS, add_corpus_options, gpu_sampling
from _truth import Truth
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ranksight

FAULTS = (*CORE_FAULTS, "cpu-ops", "host-sync", "fragmentation", "launch-bound")


# ----------------------------------------------------------------------------- model.py
@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 512
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    check_logits: bool = False  # "debug" check in forward (the graph-breaks fault)
    sanitize_logits: bool = False  # the same check without a Python branch (its fix)
    neftune_alpha: float = 0.0  # noise on the embeddings while training (NEFTune), 0: none
    noise_on_cpu: bool = False  # drawn without device= (the cpu-ops fault)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's doesn't support simply bias=False)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fault_timer = contextlib.nullcontext  # the corpus's truth clock around planted code
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        if self.training and self.config.neftune_alpha:
            # NEFTune: uniform noise on the embeddings, scaled by alpha / sqrt(T * C)
            mag = self.config.neftune_alpha / math.sqrt(t * x.size(-1))
            if self.config.noise_on_cpu:
                with self.fault_timer():
                    noise = (torch.rand(x.shape) * 2 - 1) * mag  # no device=: drawn on the CPU
                    noise = noise.to(x.device)
            else:
                noise = (torch.rand(x.shape, device=x.device) * 2 - 1) * mag
            x = x + noise
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        if self.config.check_logits and not torch.isfinite(logits).all():  # Python branch on a tensor
            raise FloatingPointError("non-finite logits")
        if self.config.sanitize_logits:  # the fix: no branch, non-finite logits zeroed on the device
            logits = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        use_fused = device_type == "cuda"
        extra_args = dict(fused=True) if use_fused else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


# ----------------------------------------------------------------------------- train.py
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (slow to start on CPU)")
    add_corpus_options(parser, "gpt-trainer", FAULTS, steps_help="optimizer steps (max_iters)")
    args = parser.parse_args()
    fault, fix = args.fault, args.fix
    if fault == "fragmentation" and fix and args.device == "cuda":
        # the fix, before the first CUDA allocation: segments that grow instead of splitting
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

    # -------------------------------------------------------------- config (nanoGPT's globals)
    eval_interval = 20
    eval_iters = 4
    log_interval = 10
    gradient_accumulation_steps = 4  # global, divided by world size below
    batch_size = 8
    block_size = 64
    n_layer, n_head, n_embd, vocab_size = 4, 4, 128, 512
    learning_rate, min_lr, warmup_iters = 6e-4, 6e-5, 10
    weight_decay, beta1, beta2, grad_clip = 1e-1, 0.9, 0.95, 1.0
    max_iters = lr_decay_iters = args.steps
    compile_model = args.compile or fault == "graph-breaks"
    size = args.size or ("gpu" if args.device == "cuda" else "cpu")
    device = args.device  # 'cpu' or 'cuda' (the rank's GPU is picked below)
    backend = args.dist_backend or ("nccl" if device == "cuda" else "gloo")
    dtype = "bfloat16" if device == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    find_unused_parameters = fault == "unused-params" and not fix
    straggler_rows = 3  # global micro-batch of 8 * world + 3 split "evenly", the remainder to one rank
    read_latency_s = 0.0
    if size == "gpu":  # 191M parameters at 3072 tokens a micro-batch: ~1.8 TFLOP forward + backward
        batch_size, block_size, gradient_accumulation_steps = 6, 512, 4
        n_layer, n_head, n_embd, vocab_size = 4, 12, 1536, 50304
        straggler_rows = 2
    if fault == "launch-bound":  # the CPU size's tiny model, on the GPU
        batch_size, block_size, gradient_accumulation_steps = 8, 64, 4
        n_layer, n_head, n_embd, vocab_size = 4, 4, 128, 512
        if fix:  # raise the batch size: 16x the rows a micro-step (compared per sample)
            batch_size *= 16
    if fault == "input":
        # per row read, both x and y: a network filesystem's random-read latency
        read_latency_s = 0.0025 if size == "cpu" else 0.001
    if fault == "exposed-allreduce":
        vocab_size = 50304  # GPT-2's, padded to a multiple of 64
        if size == "cpu":
            batch_size, block_size, gradient_accumulation_steps = 1, 32, 2
            n_layer = 2
        else:  # the same 191M model at one sequence per GPU: the all-reduce outweighs the compute
            batch_size, gradient_accumulation_steps = 1, 2

    # -------------------------------------------------------------- DDP
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        dist.init_process_group(backend=backend)
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        if device == "cuda":
            # more ranks than GPUs only in the one-GPU smoke test (gloo); otherwise GPU = local rank
            device = f"cuda:{ddp_local_rank % torch.cuda.device_count()}"
            torch.cuda.set_device(device)
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        master_process = ddp_rank == 0
        seed_offset = ddp_rank
        assert gradient_accumulation_steps % ddp_world_size == 0
        gradient_accumulation_steps //= ddp_world_size
    else:
        ddp_rank, master_process, seed_offset, ddp_world_size = 0, True, 0, 1
    if fault == "straggler" and ddp_rank == args.straggler_rank:
        batch_size += straggler_rows
    device_type = "cuda" if "cuda" in device else "cpu"
    if device_type == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(1337 + seed_offset)
    torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul
    torch.backends.cudnn.allow_tf32 = True  # allow tf32 on cudnn
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    ctx = contextlib.nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, dtype=ptdtype)
    truth = Truth(ddp_rank, fault, fix)
    truth.samples_per_step = batch_size * gradient_accumulation_steps

    # -------------------------------------------------------------- data (prepare.py's output)
    data_dir = tempfile.mkdtemp(prefix=f"gpt-data-r{ddp_rank}-")
    rng = np.random.default_rng(0)
    for split, n in (("train", 200_000), ("val", 20_000)):
        rng.integers(0, vocab_size, size=n, dtype=np.uint16).tofile(os.path.join(data_dir, f"{split}.bin"))

    length_rng = random.Random(1337 + seed_offset)  # the same lengths with and without the fix
    split_tokens = {"train": 200_000, "val": 20_000}

    def draw(split):
        length, rows = block_size, batch_size
        if fault == "fragmentation":
            # unpadded documents: every micro-batch its own length, packed to the same token count (as
            # token-budget batching does): shapes vary, the kernels' work does not
            length = length_rng.choice(range(block_size // 4, block_size + 1, 64))
            rows = batch_size * block_size // length
        return torch.randint(split_tokens[split] - block_size, (rows,)), length

    def read_batch(split, ix, length):
        # recreate np.memmap every batch to avoid a memory leak, as per nanoGPT
        data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
        rows_x, rows_y = [], []
        for i in ix:
            if read_latency_s:
                t_read = time.perf_counter()
                time.sleep(2 * read_latency_s)  # two random reads on the slow filesystem
                if pool is None:  # read ahead by the fix's threads, only the wait for them counts
                    truth.add_fault(time.perf_counter() - t_read)
            rows_x.append(torch.from_numpy((data[i : i + length]).astype(np.int64)))
            rows_y.append(torch.from_numpy((data[i + 1 : i + 1 + length]).astype(np.int64)))
        return torch.stack(rows_x), torch.stack(rows_y)

    # the input fault's fix: batches read ahead by background threads (the reads block in I/O, not Python)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8) if fault == "input" and fix else None
    ahead: dict = {"train": collections.deque(), "val": collections.deque()}

    def get_batch(split):
        if pool is not None:
            queue = ahead[split]
            while len(queue) < 8:
                queue.append(pool.submit(read_batch, split, *draw(split)))
            t_wait = time.perf_counter()
            x, y = queue.popleft().result()
            truth.add_fault(time.perf_counter() - t_wait)
        else:
            x, y = read_batch(split, *draw(split))
        if device_type == "cuda":
            # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    # -------------------------------------------------------------- model init
    # nanoGPT's own line, then what the planted faults add
    model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=False, dropout=0.0)
    model_args.update(vocab_size=vocab_size, check_logits=fault == "graph-breaks" and not fix,
                      sanitize_logits=fault == "graph-breaks" and fix, neftune_alpha=5.0 if fault == "cpu-ops" else 0.0,
                      noise_on_cpu=fault == "cpu-ops" and not fix)  # fmt: skip
    model = GPT(GPTConfig(**model_args)).to(device)
    model.fault_timer = truth.fault
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    if compile_model:
        if master_process:
            print("compiling the model... (takes a ~minute)")
        model = torch.compile(model, backend=args.compile_backend)
    if ddp:
        device_ids = [torch.cuda.current_device()] if device_type == "cuda" else None
        model = DDP(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)

    mon = ranksight.init(run_dir=args.run_dir, job=args.job, run_id=args.run_id, gpu=gpu_sampling(device_type))
    mon.watch(model, optimizer)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                with ctx:
                    logits, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    # -------------------------------------------------------------- training loop
    with mon.data():
        X, Y = get_batch("train")  # fetch the very first batch
    t0 = time.time()
    iter_num = 0
    best_val_loss = 1e9
    raw_model = model.module if ddp else model
    sync_metrics = fault == "metric-collectives" and ddp
    tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size

    def all_reduce_mean(value):
        # wait for every rank, then average (what Lightning's sync_dist does for each logged value)
        t = torch.as_tensor(value, dtype=torch.float32, device=device).detach().clone()
        dist.barrier()
        dist.all_reduce(t)
        return t.item() / ddp_world_size

    micro_losses, grad_norm = [], 0.0
    # host-sync: per-micro-step logging read back from the GPU; its fix keeps the sums there until logged
    read_back = fault == "host-sync" and device_type == "cuda"
    running_loss, valid_tokens, spike_norms = 0.0, 0, []
    teacher = None
    while True:
        if fault == "fragmentation" and device_type == "cuda" and iter_num == 3 and teacher is None:
            # a second model's memory (a frozen teacher, an EMA copy) takes the GPU after warm-up, all but half
            # of what the job itself reserved at its peak so far
            free, _ = torch.cuda.mem_get_info()
            taken = max(0, free - int(torch.cuda.max_memory_reserved() * 0.5))
            teacher = torch.empty(taken, dtype=torch.uint8, device=device)
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        if iter_num % eval_interval == 0 and master_process and iter_num > 0:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            best_val_loss = min(best_val_loss, float(losses["val"]))

        with mon.step():
            for micro_step in range(gradient_accumulation_steps):
                if ddp:
                    # only sync gradients at the last micro step
                    model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
                with ctx:
                    logits, loss = model(X, Y)
                    loss = loss / gradient_accumulation_steps
                if read_back and not fix:
                    with truth.fault():
                        running_loss += loss.item()  # .item(): the host waits for forward
                        valid_tokens += (Y != -1).nonzero().size(0)  # nonzero: a data-dependent shape, waits
                elif read_back:
                    running_loss = running_loss + loss.detach()  # on the GPU, read every log_interval
                    valid_tokens = valid_tokens + (Y != -1).sum()
                if sync_metrics:
                    with truth.fault():
                        # the global loss of every micro-batch, for the loss curve
                        micro_losses.append(all_reduce_mean(loss.detach() * gradient_accumulation_steps))
                # immediately async prefetch next batch while model is doing the forward pass
                with mon.data():
                    X, Y = get_batch("train")
                loss.backward()
            if grad_clip != 0.0:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                if read_back and not fix:
                    with truth.fault():
                        spike_norms.append(norm.cpu())  # kept for a loss-spike check: .cpu() waits
                elif read_back:
                    spike_norms.append(norm.detach())
            if sync_metrics:
                with truth.fault():  # per-block gradient norms for the dashboard
                    block_norms = [
                        (f"grad_norm/h{i}", torch.stack([p.grad.norm() for p in block.parameters()]).norm())
                        for i, block in enumerate(raw_model.transformer.h)
                    ]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if sync_metrics:
                with truth.fault():
                    tokens_per_s = tokens_per_iter / max(time.time() - t0, 1e-9)
                    step_log = {
                        k: all_reduce_mean(v)
                        for k, v in (("grad_norm", norm), ("lr", lr), ("tokens_per_s", tokens_per_s), *block_norms)
                    }
                    grad_norm = step_log["grad_norm"]
                    dist.barrier()  # keep the ranks in step for the logs
        truth.step_end()

        t1 = time.time()
        dt = t1 - t0
        t0 = t1
        if iter_num % log_interval == 0 and master_process:
            lossf = loss.item() * gradient_accumulation_steps
            extra = f", global loss {micro_losses[-1]:.4f}, grad norm {grad_norm:.3f}" if sync_metrics else ""
            if read_back:
                extra += f", mean loss {float(running_loss) / log_interval:.4f}, tokens {int(valid_tokens)}, "
                extra += f"max grad norm {max(float(n) for n in spike_norms):.3f}"
                running_loss, valid_tokens, spike_norms = 0.0, 0, []
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms{extra}")
        iter_num += 1
        if iter_num >= max_iters:
            break

    if fault == "fragmentation" and device_type == "cuda":
        stats = torch.cuda.memory_stats()
        keys = ("num_alloc_retries", "num_device_alloc", "num_device_free", "reserved_bytes.all.peak")
        names = ("alloc_retries", "device_allocs", "device_frees", "reserved_bytes")
        truth.facts.update({name: stats.get(key, 0) for name, key in zip(names, keys)})
        print(f"allocator: {truth.facts}")
    del raw_model, teacher
    if pool is not None:
        pool.shutdown(cancel_futures=True)
    mon.close()
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    shutil.rmtree(data_dir, ignore_errors=True)
    truth.write()


if __name__ == "__main__":
    main()
