"""QSGD bucketed stochastic quantization (QSDP 3.2 and D.3), torch twin of ``triton_qsgd.py``.

Norm: per bucket the max norm ``norm = max |x|``. QSDP 3.2 scales values "to the range [-1, 1]"
before rounding and 5.1 sends per-bucket scaling meta-data; QSGD's l2 norm (Alistarh et al.
2017) would leave a 1024-value bucket only a few levels per typical value.
With ``s = 2**(bits-1) - 1`` levels per sign and u ~ U[0, 1) (``noise``, one per value; or its hash keys, ``noise.py``), the
level is ``l = floor(|x| * s / norm + u)`` in [0, s] and ``q = sign(x) * l``: the stochastic
rounding of QSDP 3.2, unbiased, with per-value variance ``d**2 p (1 - p)``, ``d = norm / s`` and
p the fraction of ``|x| / d``, so at most ``d**2 / 4`` and ``d |x|`` (QSDP D.3).

Wire: code ``q + 2**(bits-1)`` packed densely (``packing.py``) and the float32 scale ``d`` per
bucket: the layout of ``group_quant.py``, whose decoders are reused. A bucket holding Inf or NaN
gets scale NaN and decodes to NaN; an all-zero bucket decodes to exact zeros.
Inputs are 1-D with ``numel % bucket_size == 0`` (the compressors pad); math is float32.
"""

from __future__ import annotations

import torch

from . import group_quant as _gq
from .group_quant import qmax_of
from .noise import noise_values
from .packing import pack_codes

#: the kernels ``dispatch.pick`` runs through ``torch.compile`` on CPU (same numbers; the
#: decoders are group_quant's, compiled there)
COMPILE_ON_CPU = ("quantize",)
#: keep the inlined noise hash in the rounding loop (see ``group_quant.COMPILE_OPTIONS``)
COMPILE_OPTIONS = {"realize_opcount_threshold": 200}


def quantize(x: torch.Tensor, bits: int, bucket_size: int,
             noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales ``norm / s`` of shape (buckets,))."""
    s = qmax_of(bits)
    g = x.reshape(-1, bucket_size).float()
    norm = g.abs().amax(dim=1)
    ok = torch.isfinite(norm)
    s_t = torch.full_like(norm, s)  # tensor / tensor: IEEE division, as div_rn in Triton
    scale = torch.where(ok, norm / s_t, torch.full_like(norm, float("nan")))
    inv = torch.where(ok & (norm > 0), s_t / norm, torch.zeros_like(norm))
    level = torch.floor(g.abs() * inv[:, None] + noise_values(noise, g))
    level = torch.nan_to_num(level, nan=0.0).clamp_(0, s)
    q = torch.where(g < 0, -level, level)
    return pack_codes((q + (s + 1)).to(torch.uint8).reshape(-1), bits), scale


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, bucket_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``group_quant.dequantize`` (the same wire layout)."""
    return _gq.dequantize(packed, scale, bits, bucket_size, dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   bucket_size: int) -> torch.Tensor:
    """``group_quant.dequantize_sum`` (the same wire layout)."""
    return _gq.dequantize_sum(packed, scale, bits, bucket_size)
