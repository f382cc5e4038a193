"""Triton twin of ``noise.py``: counter-based U[0, 1) noise, bit-exact with the torch twin.

The same int64 hash per element (values kept in ``[0, 2**32)``, products ``< 2**63``, right
shifts of non-negative values only, so arithmetic shifts are logical ones); each program
owns ``BLOCK`` consecutive flat indices, computed in int64 (no int32 overflow past 2**31).

``noise_at`` is what the quantize kernels call where they round: the noise of their int64
flat indices, hashed from the keys in registers (8 bytes read per program instead of 4
bytes per value), or loaded from a noise tensor; ``noise_operand`` is its host side.
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
#: the hash's low bits dropped, and the weight of the lowest kept one (noise.py's BITS)
SHIFT, ULP = tl.constexpr(32 - noise.BITS), tl.constexpr(1.0 / (1 << noise.BITS))


@triton.jit
def _fmix(x):
    x = x ^ (x >> 16)
    x = (x * MUL1) & M32
    x = x ^ (x >> 15)
    x = (x * MUL2) & M32
    return x ^ (x >> 16)


@triton.jit
def hashed_uniform(i, keys_ptr):
    """U[0, 1) of int64 flat indices ``i >= 0`` under the keys at ``keys_ptr`` (noise.py)."""
    k1 = tl.load(keys_ptr)
    k2 = tl.load(keys_ptr + 1)
    h = _fmix(_fmix((i & M32) ^ k1) ^ ((i >> 32) ^ k2))
    return (h >> SHIFT).to(tl.float32) * ULP


@triton.jit
def noise_at(noise_ptr, i, mask, HASH: tl.constexpr):
    """The rounding noise of int64 flat indices ``i``: hashed from the keys at ``noise_ptr``
    (``HASH``), else loaded from the float32 noise tensor at ``noise_ptr`` (0 where masked)."""
    if HASH:
        u = hashed_uniform(i, noise_ptr)
    else:
        u = tl.load(noise_ptr + i, mask=mask, other=0.0)
    return u


@triton.jit
def _uniform_kernel(keys_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    tl.store(out_ptr + i, hashed_uniform(i, keys_ptr), mask=i < numel)


def noise_operand(noise: torch.Tensor | None, numel: int,
                  unused: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A kernel's ``noise`` argument -> (the tensor its ``noise_ptr`` points to, ``HASH``):
    the keys, the float32 values of ``numel`` roundings (flat), or ``unused`` when None."""
    if noise is None:
        return unused, False
    if noise.dtype == torch.int64:
        if noise.shape != (2,):
            raise ValueError(f"noise keys must be an int64 tensor (k1, k2), got shape "
                             f"{tuple(noise.shape)}")
        return noise.contiguous(), True
    if noise.dtype != torch.float32 or noise.numel() != numel:
        raise ValueError(f"noise must be {numel} float32 values or int64 keys (k1, k2), got "
                         f"{noise.dtype} with {noise.numel()} elements")
    return noise.reshape(-1).contiguous(), False


def uniform_like(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) of ``x``'s shape on ``x``'s device (``x`` itself is never read);
    ``keys`` int64 ``(k1, k2)`` on ``x``'s device, each in ``[0, 2**32)``."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = out.numel()
    if n:
        _uniform_kernel[(triton.cdiv(n, BLOCK),)](keys.contiguous(), out, n, BLOCK=BLOCK,
                                                  num_warps=NUM_WARPS)
    return out
