"""Codebook quantization with learned levels (QSDP 5.2, Alg. 2), torch twin of
``triton_learned_levels.py``.

Per bucket of ``bucket_size`` values with range [lo, hi] (the min-max bucketing of QSDP 5.1), each
value is normalized to ``v = (x - lo) / (hi - lo)`` in [0, 1] and coded as its nearest level in
a sorted float32 codebook ``levels`` of 2**bits values in [0, 1] (Alg. 2 line 5,
``find_closest``): the code is the number of midpoints ``(levels[j] + levels[j+1]) / 2`` strictly
below v, so a tie goes to the lower level. Decode ``lo + levels[code] * (hi - lo)``.

Wire: the codes packed densely (``packing.py`` for 2/4/6/8 bits; 3, 5 and 7 bits, e.g. QSDP's
5-bit weights, here: eight codes in ``bits`` bytes as one little-endian word
c0 | c1<<b | ... | c7<<7b) and two float32 per bucket, ``lo`` and ``rng = hi - lo`` (the codebook
travels separately, see the compressor). A bucket holding Inf or NaN, or whose range overflows
float32, gets lo and rng NaN and code 0 and decodes to NaN; a constant bucket has rng 0 and decodes
exactly. Inputs are 1-D; ``quantize`` pads a partial last bucket with the last value (keeping its
min-max range), the decoders take whole buckets; math is float32.
"""

from __future__ import annotations

import torch

from . import packing

#: the kernels ``dispatch.pick`` runs through ``torch.compile`` on CPU (same numbers)
COMPILE_ON_CPU = ("quantize", "dequantize", "dequantize_sum")
ODD_BITS = (3, 5, 7)
ALL_BITS = (2, 3, 4, 5, 6, 7, 8)


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes holding ``numel`` codes of ``bits`` bits (``numel`` a multiple of 8)."""
    if bits not in ODD_BITS:
        return packing.packed_nbytes(numel, bits)
    if numel % 8:
        raise ValueError(f"{numel} codes cannot be packed 8 per unit at {bits} bits")
    return numel // 8 * bits


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (each < 2**bits), 1-D -> densely packed uint8 bytes."""
    if bits not in ODD_BITS:
        return packing.pack_codes(codes, bits)
    c = codes.reshape(-1, 8).to(torch.int64)
    word = sum(c[:, k] << (bits * k) for k in range(8))
    out = torch.stack([(word >> (8 * j)) & 0xFF for j in range(bits)], dim=1)
    return out.to(torch.uint8).reshape(-1)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: packed uint8 bytes -> one uint8 code per value."""
    if bits not in ODD_BITS:
        return packing.unpack_codes(packed, bits)
    p = packed.reshape(-1, bits).to(torch.int64)
    word = sum(p[:, j] << (8 * j) for j in range(bits))
    mask = (1 << bits) - 1
    out = torch.stack([(word >> (bits * k)) & mask for k in range(8)], dim=1)
    return out.to(torch.uint8).reshape(-1)


def midpoints(levels: torch.Tensor) -> torch.Tensor:
    """Decision boundaries of nearest rounding onto sorted ``levels``: (2**bits - 1,) float32."""
    lv = levels.float()
    return ((lv[1:] + lv[:-1]) * 0.5).contiguous()


def nearest(v: torch.Tensor, mids: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes of nearest rounding: the count of ``mids`` (sorted, 2**bits - 1) strictly below
    each v, by a ``bits``-step binary search (the Triton kernel's, as ``torch.bucketize``)."""
    code = torch.zeros(v.shape, dtype=torch.int32, device=v.device)
    for i in range(bits):
        cand = code + (1 << (bits - 1 - i))
        code = torch.where(mids[(cand - 1).long()] < v, cand, code)
    return code


def normalize(x: torch.Tensor, bucket_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x -> (v (buckets, bucket_size) in [0, 1], lo, rng) per bucket; lo and rng NaN (and v
    0) for a bucket holding Inf or NaN."""
    g = x.reshape(-1, bucket_size).float()
    lo = g.amin(dim=1)
    rng = g.amax(dim=1) - lo
    ok = torch.isfinite(g).all(dim=1) & torch.isfinite(rng)
    nan = torch.full_like(rng, float("nan"))
    lo, rng = torch.where(ok, lo, nan), torch.where(ok, rng, nan)
    v = torch.where((rng > 0)[:, None], (g - lo[:, None]) / rng[:, None], torch.zeros_like(g))
    return v, lo, rng


def quantize(x: torch.Tensor, levels: torch.Tensor, bits: int, bucket_size: int,
             mids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D x, sorted levels (2**bits,) -> (packed uint8 codes, float32 lo, float32 rng);
    a partial last bucket is padded with x's last value. ``mids``: ``midpoints(levels)`` if
    the caller has them."""
    pad = -x.numel() % bucket_size
    if pad:
        x = torch.cat([x, x[-1:].expand(pad)])
    v, lo, rng = normalize(x, bucket_size)
    code = nearest(v, (midpoints(levels) if mids is None else mids).to(v.device), bits)
    code = torch.where(torch.isnan(rng)[:, None], torch.zeros_like(code), code)
    return pack_codes(code.to(torch.uint8).reshape(-1), bits), lo, rng


def dequantize(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
               bits: int, bucket_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``lo.numel() * bucket_size`` values."""
    code = unpack_codes(packed, bits).reshape(-1, bucket_size).long()
    y = lo[:, None] + levels.float()[code] * rng[:, None]
    return y.reshape(-1).to(dtype)


def dequantize_rows(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor,
                    levels: torch.Tensor, bits: int, bucket_size: int,
                    out: torch.Tensor) -> None:
    """Row r of packed (R, nbytes), lo and rng (R, buckets), levels (R, 2**bits) decoded into
    ``out[r]`` (out (R, numel), its dtype; the first numel values of the row)."""
    rows, nb = lo.shape
    code = unpack_codes(packed.reshape(-1), bits).reshape(rows, -1).long()
    level = torch.gather(levels.float(), 1, code).view(rows, nb, bucket_size)
    y = lo[:, :, None] + level * rng[:, :, None]
    out.copy_(y.reshape(rows, -1)[:, :out.shape[1]].to(out.dtype))


def dequantize_sum(packed: torch.Tensor, lo: torch.Tensor, rng: torch.Tensor, levels: torch.Tensor,
                   bits: int, bucket_size: int) -> torch.Tensor:
    """Sum over peers: packed (P, nbytes), lo and rng (P, buckets), levels (P, 2**bits) ->
    float32 (numel,), peers added in order 0..P-1 (as in the Triton kernel)."""
    total = dequantize(packed[0], lo[0], rng[0], levels[0], bits, bucket_size)
    for p in range(1, packed.shape[0]):
        total = total + dequantize(packed[p], lo[p], rng[p], levels[p], bits, bucket_size)
    return total
