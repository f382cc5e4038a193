"""Triton twin of ``noise.py``: counter-based U[0, 1) noise, bit-exact with the torch twin.

The same int64 hash per element (values kept in ``[0, 2**32)``, products ``< 2**63``, right
shifts of non-negative values only, so arithmetic shifts are logical ones); each program
owns ``BLOCK`` consecutive flat indices, computed in int64 (no int32 overflow past 2**31).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import noise

#: values per program (few large programs: cheap under TRITON_INTERPRET; on GPU 16 int64
#: lanes per thread with ``NUM_WARPS`` warps)
BLOCK, NUM_WARPS = 4096, 8
M32, MUL1, MUL2 = tl.constexpr(noise.M32), tl.constexpr(noise.MUL1), tl.constexpr(noise.MUL2)


@triton.jit
def _fmix(x):
    x = x ^ (x >> 16)
    x = (x * MUL1) & M32
    x = x ^ (x >> 15)
    x = (x * MUL2) & M32
    return x ^ (x >> 16)


@triton.jit
def _uniform_kernel(keys_ptr, out_ptr, numel, BLOCK: tl.constexpr, BITS: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    k1 = tl.load(keys_ptr)
    k2 = tl.load(keys_ptr + 1)
    h = _fmix(_fmix((i & M32) ^ k1) ^ ((i >> 32) ^ k2))
    u = (h >> (32 - BITS)).to(tl.float32) * (1.0 / (1 << BITS))
    tl.store(out_ptr + i, u, mask=i < numel)


def uniform_like(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) of ``x``'s shape on ``x``'s device (``x`` itself is never read);
    ``keys`` int64 ``(k1, k2)`` on ``x``'s device, each in ``[0, 2**32)``."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = out.numel()
    if n:
        _uniform_kernel[(triton.cdiv(n, BLOCK),)](keys.contiguous(), out, n,
                                                  BLOCK=BLOCK, BITS=noise.BITS,
                                                  num_warps=NUM_WARPS)
    return out
