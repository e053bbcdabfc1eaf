"""A Hugging Face causal-LM script the way ``run_clm.py`` users write it: a ~200M GPT-2 built from a config,
bf16, default ``TrainingArguments``, a pre-tokenized dataset (``--fault input``: tokenized per item in
``__getitem__`` by a pure-Python tokenizer, the ``.map`` step skipped).
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--tool", default="ranksight", choices=["ranksight", "traceml", "none"])
p.add_argument("--fault", default="none", choices=["none", "input"])
p.add_argument("--steps", type=int, default=None)
p.add_argument("--out", default="/tmp/hf_clm_out")
args = p.parse_args()
args.steps = args.steps or (40 if args.fault == "input" else 120)

SEQ, VOCAB = 512, 50257
TEXT = "the quick brown fox jumps over the lazy dog while the model learns to predict the next token " * 40


class Tokenized(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class RawText(Dataset):
    """Tokenizes in __getitem__: a word-piece-ish Python loop per example."""

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        ids = []
        for _ in range(12):
            for word in TEXT.split():
                h = 0
                for ch in word:
                    h = (h * 31 + ord(ch)) % VOCAB
                ids.append(h)
        ids = (ids + [0] * SEQ)[:SEQ]
        t = torch.tensor(ids)
        return {"input_ids": t, "labels": t}


config = GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=SEQ, vocab_size=VOCAB)
model = GPT2LMHeadModel(config)
train = Tokenized(4096) if args.fault == "none" else RawText()
targs = TrainingArguments(
    output_dir=args.out,
    per_device_train_batch_size=16,
    max_steps=args.steps,
    bf16=True,
    logging_steps=50,
    save_strategy="no",
    report_to="none",
    learning_rate=3e-4,
)
callbacks = []
if args.tool == "ranksight":
    import ranksight.integrations.transformers

    callbacks.append(ranksight.integrations.transformers.RanksightCallback())
trainer = Trainer(model=model, args=targs, train_dataset=train, callbacks=callbacks)
trainer.train()
