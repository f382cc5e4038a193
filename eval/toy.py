"""A tiny LLaMA and byte-level BPE tokenizer trained on the test items' arithmetic, restated
with other people and things (``make_data.reworded_test_problems``): a model that knows the
sums, to check offline that the harness scores it above chance. It has memorized these
facts; it is no measure of generalization.

    python eval/toy.py OUT_DIR [--steps 300]
    hfcompress eval OUT_DIR --num-fewshot 0
"""

from __future__ import annotations

import argparse
import random

import torch

import make_data

EOS = "<|endoftext|>"


def training_pairs(count: int, seed: int = 0, gsm8k_share: float = 0.5
                   ) -> list[tuple[str, str]]:
    """(prompt, answer) pairs in the lm-eval prompts of ``arith_mmlu_cont`` (answer = the
    number) and, a ``gsm8k_share`` of them, ``arith_gsm8k`` (worked steps, ``#### n``)."""
    rng, out = random.Random(seed), []
    for p in make_data.reworded_test_problems(count, seed):
        prompt = f"Question: {p['question']}\nAnswer:"
        if rng.random() < gsm8k_share:
            out.append((prompt, f" {make_data.gsm8k_row(p)['answer']}{EOS}"))
        else:
            out.append((prompt, f" {p['target']}{EOS}"))
    return out


def train_tokenizer(texts: list[str], vocab_size: int = 512):
    """Byte-level BPE with one token per digit, wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def tiny_model(tokenizer, hidden_size: int = 128, layers: int = 2):
    """From the current random state (the caller seeds)."""
    from hfcompress.testing import llama

    return llama(None, vocab_size=len(tokenizer), hidden_size=hidden_size,
                 intermediate_size=hidden_size * 8 // 3, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id)


def encode(pairs: list[tuple[str, str]], tokenizer) -> list[dict[str, list[int]]]:
    """Token ids with labels on the answer only (-100 on the prompt)."""
    out = []
    for prompt, answer in pairs:
        p = tokenizer(prompt).input_ids
        ids = tokenizer(prompt + answer).input_ids
        out.append({"input_ids": ids, "labels": [-100] * len(p) + ids[len(p):]})
    return out


def collate(examples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch (usable as a Trainer ``data_collator`` via functools.partial)."""
    n = max(len(e["input_ids"]) for e in examples)
    pad = lambda x, v: x + [v] * (n - len(x))
    return {"input_ids": torch.tensor([pad(e["input_ids"], pad_id) for e in examples]),
            "labels": torch.tensor([pad(e["labels"], -100) for e in examples]),
            "attention_mask": torch.tensor([pad([1] * len(e["input_ids"]), 0)
                                            for e in examples])}


def train(steps: int = 300, batch_size: int = 32, lr: float = 5e-3, seed: int = 0,
          gsm8k_share: float = 0.5):
    """(model, tokenizer) after ``steps`` AdamW steps (one-cycle LR) on the answer tokens of
    ``steps * batch_size`` fresh pairs; the model is returned in eval mode."""
    torch.manual_seed(seed)
    pairs = training_pairs(steps * batch_size, seed, gsm8k_share)
    tokenizer = train_tokenizer([p + a for p, a in pairs])
    data = encode(pairs, tokenizer)
    model = tiny_model(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
    model.train()
    for i in range(steps):
        batch = collate(data[i * batch_size:(i + 1) * batch_size], tokenizer.pad_token_id)
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return model, tokenizer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model, tokenizer = train(args.steps, seed=args.seed)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
