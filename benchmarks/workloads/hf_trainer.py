"""A Hugging Face ``Trainer`` script (causal LM fine-tuning) with the ranksight callback.

The usual shape of a ``run_clm.py``-style script: a model from a config, a torch ``Dataset`` that
tokenizes each example in ``__getitem__``, ``TrainingArguments`` + ``Trainer``, launched with torchrun.
A 2-layer GPT-2 is built from a ``GPT2Config`` (random weights, nothing downloaded) and the text is
synthetic.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 hf_trainer.py --fault none
    HF_HUB_OFFLINE=1 torchrun --standalone --nproc-per-node 2 hf_trainer.py --device cuda --fault none  # 2 GPUs

On ``--device cuda`` the Trainer runs on the GPUs as ``run_clm.py --bf16`` does: its own device
placement (``LOCAL_RANK``), NCCL, bf16 autocast, pinned DataLoader memory. ``--size gpu`` (implied by
cuda) is GPT-2 small (12 layers, 768 wide, vocabulary 50257) at 8 x 512 tokens a GPU: GPU compute, not
kernel launches (``benchmarks/results/diagnosis_history.md``, "The GPU sizes").

Faults (``--fault``):

- ``input``: a pure-Python character tokenizer run on each example in ``__getitem__`` (the
  ``.map(tokenize)`` step skipped), ``dataloader_num_workers=0``.
- ``straggler``: rank 1's shard holds longer documents (sequence length 84 against 64; 672 against
  512 at the GPU size): ~1/3 more work per step on that rank.
- ``metric-collectives``: ``compute_loss`` overridden to average loss, perplexity, token accuracy
  and batch facts over ranks for logging every step (``barrier`` + ``all_reduce`` + ``.item()`` each).
- ``exposed-allreduce``: GPT-2's full 50257-token vocabulary on the tiny model at one 32-token
  sequence per device: a 26 MB embedding gradient every step. At the GPU size: a 2048-wide, 12-layer
  GPT-2 (707M parameters) at one 512-token sequence per GPU: 2.8 GB of fp32 gradients.
- ``unused-params``: ``ddp_find_unused_parameters`` left at its default, which the Trainer turns into
  ``find_unused_parameters=True`` for any ``PreTrainedModel`` without gradient checkpointing (the
  healthy runs set it to False).
- ``graph-breaks``: ``torch_compile=True`` on a model whose forward checks its loss with a Python
  ``if`` (a data-dependent branch).
"""

from __future__ import annotations

import argparse
import os
import shutil
import string
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import torch.distributed as dist
from _corpus_options import CORE_FAULTS, add_corpus_options
from _truth import Truth
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import ranksight.integrations.transformers

FAULTS = CORE_FAULTS
ALPHABET = string.ascii_lowercase + " .,"


class CharTokenizer:
    """A character-level tokenizer, written the simple way: one dict lookup per character."""

    def __init__(self, vocab_size):
        self.stoi = {c: i + 1 for i, c in enumerate(ALPHABET)}
        self.vocab_size = vocab_size

    def __call__(self, text, max_length):
        ids = []
        for word in text.split(" "):
            for c in word.lower().strip():
                ids.append(self.stoi.get(c, 0) % self.vocab_size)
            ids.append(self.stoi[" "])
        ids = (ids + [0] * max_length)[:max_length]
        return torch.tensor(ids, dtype=torch.long)


class TextDataset(Dataset):
    """Synthetic documents; with ``tokenize_on_the_fly`` each example is tokenized when it is fetched."""

    def __init__(self, n, seq_len, vocab_size, tokenize_on_the_fly, truth, doc_chars=0):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab_size, (n, seq_len), generator=g)
        self.seq_len = seq_len
        self.tokenize_on_the_fly = tokenize_on_the_fly
        self.truth = truth
        if tokenize_on_the_fly:
            self.tokenizer = CharTokenizer(vocab_size)
            letters = torch.randint(0, len(ALPHABET), (doc_chars,), generator=g).tolist()
            self.doc = "".join(ALPHABET[i] for i in letters)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        if self.tokenize_on_the_fly:
            with self.truth.fault():
                # the whole document is tokenized, then cut to the model's length
                ids = self.tokenizer(self.doc, max_length=len(self.doc))[: self.seq_len]
                ids = (ids + self.ids[i]) % self.tokenizer.vocab_size
        else:
            ids = self.ids[i]
        return {"input_ids": ids, "labels": ids}


class CheckedGPT2(GPT2LMHeadModel):
    """GPT-2 with a sanity check on the loss, as people add while debugging."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if out.loss is not None and torch.isnan(out.loss):  # Python branch on a tensor: a graph break
            raise FloatingPointError("loss is NaN")
        return out


class MetricsTrainer(Trainer):
    """Logs loss, perplexity, token accuracy and batch facts averaged over all ranks on every step."""

    truth = None
    global_metrics: dict = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        with self.truth.fault():
            world = dist.get_world_size()
            with torch.no_grad():
                predicted = outputs.logits[:, :-1].argmax(-1)
                metrics = {"loss": loss.detach(), "perplexity": torch.exp(loss.detach()),
                           "token_accuracy": (predicted == inputs["labels"][:, 1:]).float().mean(),
                           "tokens": torch.tensor(float(inputs["input_ids"].numel())),
                           "seq_len": torch.tensor(float(inputs["input_ids"].shape[1]))}  # fmt: skip
            for name, value in metrics.items():
                value = value.to(loss.device).clone()  # NCCL reduces only GPU tensors
                dist.barrier()  # every rank at the same step before reducing, like Lightning's sync_dist
                dist.all_reduce(value)
                self.global_metrics[name] = value.item() / world
        return (loss, outputs) if return_outputs else loss


class TruthCallback(TrainerCallback):
    def __init__(self, truth):
        self.truth = truth

    def on_step_end(self, args, state, control, **kwargs):
        self.truth.step_end()


def main():
    parser = argparse.ArgumentParser()
    add_corpus_options(parser, "hf-trainer", FAULTS)
    args = parser.parse_args()
    fault = args.fault
    on_gpu = args.device == "cuda"
    size = args.size or ("gpu" if on_gpu else "cpu")

    rank = int(os.environ.get("RANK", "0"))
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if on_gpu and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > torch.cuda.device_count():
        # one-GPU smoke test only (with --dist-backend gloo): every rank on the GPUs there are
        os.environ["LOCAL_RANK"] = str(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    truth = Truth(rank, fault)
    n_layer, n_head, n_embd, n_positions, vocab_size, seq_len, batch = 2, 4, 128, 128, 1024, 64, 8
    straggler_seq_len = 84
    if size == "gpu":  # GPT-2 small at 4096 tokens a GPU: ~3 TFLOP forward + backward
        n_layer, n_head, n_embd, n_positions, vocab_size, seq_len, batch = 12, 12, 768, 1024, 50257, 512, 8
        straggler_seq_len = 672
    if fault == "straggler" and rank == args.straggler_rank:
        seq_len = straggler_seq_len
    if fault == "exposed-allreduce":
        vocab_size, batch = 50257, 1
        if size == "cpu":
            seq_len = 32
        else:  # the 124M model's 497 MB would be ~8 % of a launch-bound step: a wider model
            n_head, n_embd = 16, 2048
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions,
                        vocab_size=vocab_size, bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = (CheckedGPT2 if fault == "graph-breaks" else GPT2LMHeadModel)(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    train_dataset = TextDataset(batch * world * (args.steps + 2), seq_len, vocab_size,
                                tokenize_on_the_fly=fault == "input", truth=truth, doc_chars=12000)  # fmt: skip

    output_dir = tempfile.mkdtemp(prefix="hf-trainer-")
    training_args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=batch, max_steps=args.steps, learning_rate=5e-4,
        warmup_steps=5, weight_decay=0.01, use_cpu=not on_gpu, bf16=on_gpu and torch.cuda.is_bf16_supported(),
        ddp_backend=args.dist_backend or ("nccl" if on_gpu else "gloo"), report_to="none", save_strategy="no",
        disable_tqdm=True, seed=0,
        # the healthy runs switch off the unused-parameter scan; the fault leaves the Trainer's default
        ddp_find_unused_parameters=None if fault == "unused-params" else False,
        torch_compile=fault == "graph-breaks",
        torch_compile_backend=args.compile_backend if fault == "graph-breaks" else None,
    )  # fmt: skip
    trainer_cls = MetricsTrainer if fault == "metric-collectives" else Trainer
    MetricsTrainer.truth = truth
    monitor = ranksight.integrations.transformers.RanksightCallback(
        run_dir=args.run_dir, job=args.job, run_id=args.run_id
    )
    trainer = trainer_cls(model=model, args=training_args, train_dataset=train_dataset,
                          callbacks=[monitor, TruthCallback(truth)])  # fmt: skip
    try:
        trainer.train()
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    truth.write()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
