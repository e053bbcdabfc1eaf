"""Hugging Face Trainer + ranksight: a tiny GPT-2 built from a config (nothing is downloaded), synthetic
tokens, DDP over 2 CPU processes (gloo). The docs' example, run by the tests.

    torchrun --nproc-per-node 2 transformers_train.py              # healthy input pipeline
    torchrun --nproc-per-node 2 transformers_train.py --slow-data  # slow tokenisation in __getitem__
    ranksight summary ranksight-runs/<run>
"""

import argparse
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ranksight.integrations.transformers import RanksightCallback


class Tokens(Dataset):
    """Random token sequences; ``tokenize_s`` stands in for per-example tokenisation work."""

    def __init__(self, n: int, seq_len: int, vocab: int, tokenize_s: float) -> None:
        self.ids = torch.randint(0, vocab, (n, seq_len))
        self.tokenize_s = tokenize_s

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if self.tokenize_s:
            time.sleep(self.tokenize_s)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="ranksight-runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--slow-data", action="store_true", help="plant an input-bound loader")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=128, n_positions=64, vocab_size=1024, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    batch = 16
    data = Tokens(n=batch * 2 * (args.steps + 2), seq_len=64, vocab=1024, tokenize_s=0.02 if args.slow_data else 0.0)
    with tempfile.TemporaryDirectory(prefix="hf-example-") as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,  # nothing is saved there (save_strategy="no")
            per_device_train_batch_size=batch,
            max_steps=args.steps,
            learning_rate=1e-4,
            use_cpu=True,
            ddp_backend="gloo",
            dataloader_num_workers=0,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=data,
            callbacks=[RanksightCallback(run_dir=args.run_dir, job="transformers-example")],
        )
        trainer.train()


if __name__ == "__main__":
    main()
