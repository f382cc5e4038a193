"""Quantization by random shift (QSDP 4.1, Definition 1), torch twin of ``triton_random_shift.py``.

Per bucket of ``bucket_size`` values with range [lo, hi] the lattice spacing is
``step = (hi - lo) / (2**bits - 2)``; one shift ``r = (u - 1/2) * step``, u ~ U[0, 1) (``noise``,
one per bucket), is shared by all the bucket's values, which round to the nearest point of the
shifted lattice ``base + k * step``, ``base = lo + r``:
``k = floor((x - base) / step + 1/2)``. Since ``(x - lo) / step`` lies in [0, 2**bits - 2] and
``r / step`` in [-1/2, 1/2), k fits in [0, 2**bits - 1]: the 2**bits codes. As r is uniform over
one period, the lattice ``lo + r + step Z`` is distributed as the paper's ``step Z + r``, so
Lemma 5's unbiasedness holds. The error is uniform on [-step/2, step/2): variance ``step**2 / 12``
for every value (Lemma 5's ``step**2 z (1 - z)`` is the variance of ``Q_{0,step}(x - r)``,
without adding r back) and never more than ``step / 2``.

Wire: the packed codes k and two float32 per bucket, ``base`` and ``step``. The paper sends the
lattice coordinates "together with the scalar r"; here r is folded into ``base``, which min-max
bucketing needs anyway, so the shift costs no extra bits and no shared RNG between ranks.
Decode ``base + k * step``, limited to the output dtype's finite range (for values at fp16's
limit). A bucket holding Inf or NaN, or whose range overflows float32, gets base and step NaN and
decodes to NaN; a constant bucket has step 0 and decodes exactly.
Inputs are 1-D with ``numel % bucket_size == 0`` (the compressors pad); math is float32.
"""

from __future__ import annotations

import torch

from .packing import pack_codes, unpack_codes

#: the kernels ``dispatch.pick`` runs through ``torch.compile`` on CPU (same numbers)
COMPILE_ON_CPU = ("quantize", "dequantize", "dequantize_sum")


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, noise (buckets,) -> (packed uint8 codes, float32 base, float32 step), per bucket."""
    g = x.reshape(-1, bucket_size).float()
    lo, hi = g.amin(dim=1), g.amax(dim=1)
    step = (hi - lo) / torch.full_like(lo, (1 << bits) - 2)  # tensor / tensor: IEEE, as div_rn
    ok = torch.isfinite(g).all(dim=1) & torch.isfinite(step)
    nan = torch.full_like(step, float("nan"))
    step = torch.where(ok, step, nan)
    base = torch.where(ok, lo + (noise.reshape(-1) - 0.5) * step, nan)
    t = torch.where((step > 0)[:, None], (g - base[:, None]) / step[:, None], torch.zeros_like(g))
    k = torch.floor(t + 0.5).clamp_(0, (1 << bits) - 1)
    return pack_codes(k.to(torch.uint8).reshape(-1), bits), base, step


def finite_range(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Clip finite values to dtype's largest finite value (NaN stays NaN)."""
    big = torch.finfo(dtype).max
    return torch.where(y > big, big, torch.where(y < -big, -big, y))


def dequantize(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
               bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``base.numel() * bucket_size`` values."""
    k = unpack_codes(packed, bits).reshape(-1, bucket_size).float()
    y = base[:, None] + k * step[:, None]
    return finite_range(y, dtype).reshape(-1).to(dtype)


def dequantize_sum(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), base and step (P, buckets) -> float32 (numel,).

    Every peer decoded in one :func:`dequantize`, then the peers added in order 0..P-1 in
    float32 (the Triton kernel adds in the same order).
    """
    values = dequantize(packed.reshape(-1), base.reshape(-1), step.reshape(-1), bits,
                        bucket_size).view(base.shape[0], -1)
    total = values[0]
    for p in range(1, values.shape[0]):
        total = total + values[p]
    return total


def dequantize_rows(packed: torch.Tensor, base: torch.Tensor, step: torch.Tensor, bits: int,
                    bucket_size: int, out: torch.Tensor) -> torch.Tensor:
    """Every row's payload (``[rows, ..]`` fields, each row padded to whole buckets) decoded
    into its row of ``out`` (``[rows, numel]``, in its dtype): the slots of a gathered wire
    (QSDP 5.1)."""
    rows, numel = out.shape
    values = dequantize(packed.reshape(-1), base.reshape(-1), step.reshape(-1), bits,
                        bucket_size, out.dtype)
    return out.copy_(values.view(rows, -1)[:, :numel])
