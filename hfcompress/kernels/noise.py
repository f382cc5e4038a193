"""Counter-based U[0, 1) noise for stochastic rounding (SDP4Bit 2.2, QSDP 3.2, Global-QSGD
Alg. 1), torch twin of ``triton_noise.py``.

Element ``i`` (flat index within one call) of a call keyed by the 32-bit ``(k1, k2)`` is

    h = fmix(fmix((i & 0xFFFFFFFF) ^ k1) ^ ((i >> 32) ^ k2)),   u = (h >> 8) * 2**-24

with ``fmix`` a 32-bit xorshift-multiply finalizer (murmur3 / lowbias32 shape: shifts
16, 15, 16; odd multipliers 0x7FEB352D, 0x5BD1E995). A pure function of ``(i, k1, k2)``:
no generator state, so the numbers are the same on every device and backend (eager,
``torch.compile``, Triton), and one call is a few element-wise integer ops that compile to
vectorized code. For ``i < 2**32`` the map ``i -> h`` is a bijection (each ``fmix`` is); the
high word of larger indices (tensors past 4G values) enters through ``(i >> 32) ^ k2``, so
the sequence does not repeat with period 2**32.

The lanes are int32 holding the 32 bits of each value (two's complement): a product wraps
modulo 2**32, which is the finalizer's own arithmetic, and every right shift is masked to
the bits a logical shift keeps (``(x >> 16) & 0xFFFF``). 32-bit lanes are what every vector
unit multiplies natively (AVX2 has no 64-bit multiply: int64 lanes made the compiled CPU
quantize ~5x slower there; a GPU's int64 multiply is several instructions too). A flat
index past 2**31 (a tensor of more than 2G values per row) takes the same hash on int64
lanes holding 32-bit values (``hash_index``; products ``< 2**63``): the same numbers.
``u`` keeps the top 24 bits of ``h``, exact in float32, in ``[0, 1 - 2**-24]``:
stochastic rounding ``floor(y + u)`` (in exact arithmetic) rounds up with probability
``frac(y)`` rounded down to a multiple of 2**-24, a bias in ``(-2**-24, 0]`` of a level
(-2**-25 on average over ``frac(y)``), far below the rounding noise itself.

``SeededRNG`` (``compressors/rng.py``) draws fresh ``(k1, k2)`` per call.

Row keys: an int64 ``(rows, 2)`` keys tensor splits the flat values into ``rows`` equal rows,
and value ``j`` of row ``r`` gets the noise of index ``j`` under keys ``r``: one call over the
``[rows, n]`` values a collective sends to ``rows`` peers draws exactly the noise of ``rows``
separate calls, one per row, keyed by successive calls' keys (``SeededRNG.next_keys(device,
rows)``).

Every quantize kernel taking a ``noise`` argument accepts either the float32 values, one per
value it rounds, or just the int64 keys ``(k1, k2)``: element ``i`` then gets the noise of
flat index ``i``. The torch twins expand the keys with :func:`uniform_like`
(:func:`noise_values`); the Triton kernels hash the index inside the kernel
(``triton_noise.noise_at``), so no noise tensor goes through memory; same numbers.
"""

from __future__ import annotations

import torch

#: the kernels ``dispatch.pick`` runs through ``torch.compile`` on CPU
COMPILE_ON_CPU = ("uniform_like",)

M32 = 0xFFFFFFFF
MUL1, MUL2 = 0x7FEB352D, 0x5BD1E995
#: noise bits kept from the 32-bit hash (exact in float32's 24-bit significand)
BITS = 24


#: flat indices below this hash on int32 lanes (``hash_index32``)
INT32_INDICES = 1 << 31


def fmix(x: torch.Tensor) -> torch.Tensor:
    """32-bit finalizer on int64 lanes holding values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = (x * MUL1) & M32
    x = x ^ (x >> 15)
    x = (x * MUL2) & M32
    return x ^ (x >> 16)


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """``fmix`` on int32 lanes (the same 32 bits: products wrap, shifts masked to logical)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * MUL1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * MUL2
    return x ^ ((x >> 16) & 0xFFFF)


def hash_index(i: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
    """int64 indices ``i >= 0`` and 32-bit keys -> 32-bit hashes (int64)."""
    return fmix(fmix((i & M32) ^ k1) ^ ((i >> 32) ^ k2))


def hash_index32(i: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
    """``hash_index`` of int32 indices ``0 <= i < 2**31`` (their high word is 0) on int32
    lanes; keys int32 (the 32 bits of each key) -> the hashes' 32 bits as int32."""
    return fmix32(fmix32(i ^ k1) ^ k2)


def is_keys(noise: torch.Tensor | None) -> bool:
    """Whether a kernel's ``noise`` argument is the hash keys (int64) rather than values."""
    return noise is not None and noise.dtype == torch.int64


def noise_values(noise: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A kernel's ``noise`` argument as float32 values of ``like``'s shape: the keys expanded
    over ``like``'s flat indices, or the given values reshaped."""
    return uniform_like(like, noise) if is_keys(noise) else noise.reshape(like.shape)


def uniform_like(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) of ``x``'s shape on ``x``'s device (``x`` itself is never read);
    ``keys`` int64 ``(k1, k2)`` on ``x``'s device, each in ``[0, 2**32)``, or ``(rows, 2)``
    row keys (``x.numel()`` a multiple of ``rows``; see the module docstring)."""
    keys = keys.reshape(-1, 2)
    rows = keys.shape[0]
    narrow = x.numel() // rows < INT32_INDICES
    dtype, hash_fn = (torch.int32, hash_index32) if narrow else (torch.int64, hash_index)
    keys = keys.to(dtype)  # int32: the keys' 32 bits (wrapping conversion)
    if x.dim() == 2 and x.shape[0] % rows == 0:
        # (groups, width) rows of whole groups: the index within a row as (group, column),
        # so compiled code finds a row per group, not a division per value (vectorizes)
        per, width = x.shape[0] // rows, x.shape[1]
        i = (torch.arange(per, dtype=dtype, device=x.device)[:, None] * width
             + torch.arange(width, dtype=dtype, device=x.device))
        h = hash_fn(i, keys[:, 0, None, None], keys[:, 1, None, None])
    else:
        i = torch.arange(x.numel() // rows, dtype=dtype, device=x.device)
        h = hash_fn(i, keys[:, 0:1], keys[:, 1:2])
    kept = (h >> (32 - BITS)) & ((1 << BITS) - 1)  # logical shift of the 32 bits
    return (kept.to(torch.float32) * (1.0 / (1 << BITS))).reshape(x.shape)
