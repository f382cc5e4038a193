"""Quantization by random shift, QSDP's weight quantizer (QSDP 4.1 Definition 1, Lemma 5; 5.1).

``random_shift``: per bucket of ``bucket_size`` values (default 1024, QSDP 5.1; a multiple of
32) with range [lo, hi], the lattice ``lo + r + step Z`` with ``step = (hi - lo) / (2**bits - 2)``
and ONE shift r ~ U[-step/2, step/2) for the whole bucket; every value rounds to its nearest
lattice point (2**bits codes; bits 2/4/6/8, default 8: QSDP's W8). Unbiased over r (Lemma 5);
the error is uniform on [-step/2, step/2), so its variance is ``step**2 / 12`` for every value
(Lemma 5 states ``step**2 z (1 - z)``, z the fraction of x / step: that is the variance without
adding r back; both are <= ``step**2 / 4``), and no error exceeds ``step / 2``.

What goes on the wire: the paper sends the lattice coordinates together with r. Here r is
folded into each bucket's offset ``base = lo + r`` (which min-max bucketing sends anyway), so
the wire carries codes + two float32 per bucket (base, step): r costs no extra bits, and the
receiver needs no RNG in step with the sender. ``wire_bits`` counts exactly these tensors,
including the padding of the last bucket (padded with its last value, keeping its range).
Kernels: ``kernels/random_shift.py`` and ``kernels/triton_random_shift.py``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..kernels import dispatch
from ..kernels import random_shift as _twin
from ..kernels.packing import SUPPORTED_BITS, packed_nbytes
from .base import Compressor, Packed, check_choice, check_float_input, check_group_size
from .registry import register_compressor
from .rng import SeededRNG

BUCKET_MULTIPLE = 32


def pad_edge(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Flatten ``x`` and pad it to a multiple of ``multiple`` values by repeating its last
    value, so the last min-max bucket keeps its range."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % multiple
    return torch.cat([flat, flat[-1:].expand(pad)]) if pad else flat


@register_compressor("random_shift")
class RandomShift(Compressor):
    """Random-shift lattice quantization per bucket (QSDP's weight quantizer)."""

    unbiased = True

    def __init__(self, bits: int = 8, bucket_size: int = 1024, seed: int = 0,
                 backend: str = "auto") -> None:
        check_choice(self.name, "bits", bits, SUPPORTED_BITS)
        check_group_size(self.name, bucket_size, BUCKET_MULTIPLE, "bucket_size")
        check_choice(self.name, "backend", backend, dispatch.BACKENDS)
        super().__init__(bits=bits, bucket_size=bucket_size, seed=seed, backend=backend)
        self.bits, self.bucket_size, self.backend = bits, bucket_size, backend
        self.rng = SeededRNG(seed)

    def _impl(self, t: torch.Tensor):
        return dispatch.pick(t, self.backend, _twin, "triton_random_shift")

    def payload_spec(self, numel: int) -> dict[str, tuple[torch.dtype, int]]:
        n = -(-numel // self.bucket_size) * self.bucket_size
        nb = n // self.bucket_size
        return {"codes": (torch.uint8, packed_nbytes(n, self.bits)),
                "base": (torch.float32, nb), "step": (torch.float32, nb)}

    def compress(self, x: torch.Tensor) -> Packed:
        check_float_input(self.name, x)
        flat = pad_edge(x.detach(), self.bucket_size)
        nb = flat.numel() // self.bucket_size
        shift = torch.rand(nb, generator=self.rng.generator(flat.device), device=flat.device,
                           dtype=torch.float32)
        codes, base, step = self._impl(flat).quantize(flat, self.bits, self.bucket_size, shift)
        return Packed({"codes": codes, "base": base, "step": step}, x.shape, x.dtype)

    def decompress(self, packed: Packed) -> torch.Tensor:
        p = packed.payload
        out = self._impl(p["codes"]).dequantize(p["codes"], p["base"], p["step"], self.bits,
                                                self.bucket_size, packed.dtype)
        return out[:packed.numel].reshape(packed.shape)

    def reduce(self, packeds: Sequence[Packed]) -> torch.Tensor:
        if not packeds:
            raise ValueError("reduce() needs at least one payload")
        codes, base, step = (torch.stack([p.payload[k] for p in packeds])
                             for k in ("codes", "base", "step"))
        total = self._impl(codes).dequantize_sum(codes, base, step, self.bits, self.bucket_size)
        return total[:packeds[0].numel].reshape(packeds[0].shape)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.load_state_dict(state["rng"])
