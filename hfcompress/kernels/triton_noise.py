"""Triton twin of ``noise.py``: counter-based U[0, 1) noise, bit-exact with the torch twin.

The same int64 hash per element (values kept in ``[0, 2**32)``, products ``< 2**63``, right
shifts of non-negative values only, so arithmetic shifts are logical ones); each program
owns ``BLOCK`` consecutive flat indices, computed in int64 (no int32 overflow past 2**31).

``noise_at`` is what the quantize kernels call where they round: the noise of their int64
flat indices, hashed from the keys in registers (8 bytes read per program instead of 4
bytes per value), or loaded from a noise tensor; ``noise_operand`` is its host side. Row keys
(``(rows, 2)``, noise.py): index ``i`` is hashed as ``i % row_len`` under the keys of row
``i // row_len`` (``HASH == ROW_KEYS``; a one-pair call skips the division).
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


#: ``HASH`` of a kernel: float32 noise values, one key pair, row keys
VALUES, ONE_KEY, ROW_KEYS = 0, 1, 2


@triton.jit
def _hash(i, k1, k2):
    h = _fmix(_fmix((i & M32) ^ k1) ^ ((i >> 32) ^ k2))
    return (h >> SHIFT).to(tl.float32) * ULP


@triton.jit
def hashed_uniform(i, keys_ptr):
    """U[0, 1) of int64 flat indices ``i >= 0`` under the keys at ``keys_ptr`` (noise.py)."""
    return _hash(i, tl.load(keys_ptr), tl.load(keys_ptr + 1))


@triton.jit
def row_hashed_uniform(i, keys_ptr, row_len, mask):
    """U[0, 1) of int64 flat indices ``i >= 0`` under row keys: ``i % row_len`` hashed with
    the pair of row ``i // row_len`` (noise.py; 0 where masked)."""
    r = i // row_len
    k1 = tl.load(keys_ptr + 2 * r, mask=mask, other=0)
    k2 = tl.load(keys_ptr + 2 * r + 1, mask=mask, other=0)
    return _hash(i - r * row_len, k1, k2)


@triton.jit
def noise_at(noise_ptr, i, mask, HASH: tl.constexpr, row_len):
    """The rounding noise of int64 flat indices ``i``: hashed from the keys at ``noise_ptr``
    (``HASH`` ONE_KEY, or ROW_KEYS with rows of ``row_len`` indices), else loaded from the
    float32 noise tensor at ``noise_ptr`` (0 where masked)."""
    if HASH == 2:
        u = row_hashed_uniform(i, noise_ptr, row_len, mask)
    elif HASH == 1:
        u = hashed_uniform(i, noise_ptr)
    else:
        u = tl.load(noise_ptr + i, mask=mask, other=0.0)
    return u


@triton.jit
def _uniform_kernel(keys_ptr, out_ptr, numel, row_len, HASH: tl.constexpr,
                    BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < numel
    tl.store(out_ptr + i, noise_at(keys_ptr, i, mask, HASH, row_len), mask=mask)


def noise_operand(noise: torch.Tensor | None, numel: int,
                  unused: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """A kernel's ``noise`` argument for ``numel`` roundings -> (the tensor its ``noise_ptr``
    points to, ``HASH``, ``row_len``): the keys (one pair, or ``(rows, 2)`` row keys, rows of
    ``numel // rows``), the float32 values (flat), or ``unused`` when None."""
    if noise is None:
        return unused, VALUES, 1
    if noise.dtype == torch.int64:
        if noise.dim() == 2 and noise.shape[1] == 2 and noise.shape[0] > 0 \
                and numel % noise.shape[0] == 0:
            return noise.contiguous(), ROW_KEYS, max(numel // noise.shape[0], 1)
        if noise.shape != (2,):
            raise ValueError(f"noise keys must be an int64 tensor (k1, k2), or (rows, 2) row "
                             f"keys with rows dividing {numel}, got shape {tuple(noise.shape)}")
        return noise.contiguous(), ONE_KEY, 1
    if noise.dtype != torch.float32 or noise.numel() != numel:
        raise ValueError(f"noise must be {numel} float32 values or int64 keys (k1, k2), got "
                         f"{noise.dtype} with {noise.numel()} elements")
    return noise.reshape(-1).contiguous(), VALUES, 1


def uniform_like(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) of ``x``'s shape on ``x``'s device (``x`` itself is never read);
    ``keys`` int64 ``(k1, k2)`` on ``x``'s device, each in ``[0, 2**32)``, or ``(rows, 2)``
    row keys."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = out.numel()
    if n:
        k, mode, row_len = noise_operand(keys, n, out)
        _uniform_kernel[(triton.cdiv(n, BLOCK),)](k, out, n, row_len, HASH=mode, BLOCK=BLOCK,
                                                  num_warps=NUM_WARPS)
    return out
