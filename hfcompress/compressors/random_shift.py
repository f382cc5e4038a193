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

import torch

from ..kernels import random_shift as _twin
from .bucketed import BucketQuantizer
from .registry import register_compressor


@register_compressor("random_shift")
class RandomShift(BucketQuantizer):
    """Random-shift lattice quantization per bucket (QSDP's weight quantizer)."""

    unbiased = True
    twin, triton_module = _twin, "triton_random_shift"
    bucket_params = ("base", "step")
    edge_padded = decodes_rows_into = True

    def _quantize(self, flat: torch.Tensor, rows: int | None) -> tuple[torch.Tensor, ...]:
        """One shift per bucket from the counter hash (``rng.py``): the same numbers on every
        device and backend; ``rows`` rows draw what ``rows`` successive calls would (row
        keys). A ``torch.Generator`` per device drew other shifts on a GPU than on the CPU."""
        shift = self.rng.uniform_like(torch.empty(flat.numel() // self.bucket_size,
                                                  device=flat.device), rows)
        return self._impl(flat).quantize(flat, self.bits, self.bucket_size, shift)
