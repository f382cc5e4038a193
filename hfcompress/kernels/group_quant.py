"""Symmetric absmax group quantization, torch twin of ``triton_group_quant.py``.

SDP4Bit 2.2 / ZeRO++ 3.2: per group of ``group_size`` values, ``scale = absmax / qmax`` with
``qmax = 2**(bits-1) - 1``; ``q = round(x * inv)`` with ``inv = (1 / absmax) * qmax``, clamped
to ``[-qmax, qmax]`` (nearest: ``floor(y + 0.5)``; stochastic: ``floor(y + u)``, u ~ U[0, 1)
given as ``noise``: values or the hash keys, see ``noise.py``), stored as the unsigned code ``q + 2**(bits-1)`` packed densely
(``packing.py``). Every step is one IEEE float32 operation, never contracted into an FMA.

Numbers every backend reproduces bit for bit:
- all-zero group: scale 0, codes all ``2**(bits-1)``, decodes to exact zeros;
- a group holding Inf or NaN: scale NaN and every code ``2**(bits-1)`` (level 0), so the
  whole group decodes to NaN (a non-finite value is never turned into finite garbage).
Inputs are 1-D with ``numel % group_size == 0`` (the compressors pad); math is float32.
On CPU, ``dispatch.pick`` runs these functions through ``torch.compile`` (same numbers).
"""

from __future__ import annotations

import torch

from .noise import noise_values
from .packing import pack_codes, tail_bytes, take_tail, unpack_codes, wire_fields
from .post_op import sum_riders, written

#: the kernels ``dispatch.pick`` runs through ``torch.compile`` on CPU
COMPILE_ON_CPU = ("quantize", "decode", "decode_sum", "decode_sum_quantize", "difference",
                  "add_to", "add_rows")
#: Inductor stores a pointwise expression of more than a few dozen ops (here ``y + u`` with
#: the noise hash of keys inlined) instead of fusing it into its consumer: a float32 pass
#: through memory. A higher limit keeps the hash in the rounding loop (int4 stochastic
#: quantize ~2.4x faster on one core, same numbers)
COMPILE_OPTIONS = {"realize_opcount_threshold": 200}


def qmax_of(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def group_scales(g: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, inverse scale) of a float32 ``(groups, group_size)`` view:
    ``absmax / qmax`` and ``(1 / absmax) * qmax``, each IEEE float32 operation rounded on its
    own (the reciprocal form because Inductor rewrites ``qmax / absmax`` into it)."""
    qmax = qmax_of(bits)
    absmax = g.abs().amax(dim=1)
    finite = torch.isfinite(absmax)
    scale = torch.where(finite, absmax / qmax, float("nan"))
    inv = torch.where(finite & (absmax > 0), absmax.reciprocal() * qmax, 0.0)
    return scale, inv


def round_codes(y: torch.Tensor, bits: int, noise: torch.Tensor | None) -> torch.Tensor:
    """float32 values already in level units -> unsigned uint8 codes (NaN -> level 0)."""
    qmax = qmax_of(bits)
    q = torch.floor(y + (0.5 if noise is None else noise_values(noise, y)))
    q = torch.where(q == q, q.clamp(-qmax, qmax), 0.0)
    return (q + (qmax + 1)).to(torch.uint8)


def quantize(x: torch.Tensor, bits: int, group_size: int,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D x -> (packed uint8 codes, float32 scales of shape (numel // group_size,))."""
    g = x.reshape(-1, group_size).float()
    scale, inv = group_scales(g, bits)
    codes = round_codes(g * inv[:, None], bits, noise)
    return pack_codes(codes.reshape(-1), bits), scale


def join_rows(packed: torch.Tensor, scale: torch.Tensor, rows: int,
              tail: torch.Tensor | None = None) -> torch.Tensor:
    """Codes and scales of ``rows`` equal rows as the wire ``[rows, nbytes]``: row r its
    codes, then its scales' bytes (``Packed.flat()`` of row r), then the bytes of row r of
    ``tail`` (``[rows, E]``, if given: exact values riding along), in one ``cat``."""
    extra = tail_bytes(tail)
    return torch.cat([packed.view(rows, -1), scale.view(rows, -1).view(torch.uint8),
                      *(() if extra is None else (extra,))], dim=1)


def quantize_rows(x: torch.Tensor, rows: int, bits: int, group_size: int,
                  noise: torch.Tensor | None = None,
                  tail: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`quantize` of ``rows`` equal rows of whole groups (flat ``x``, or its ``[rows,
    n]`` rows, any row stride; ``noise``: one row of keys per row) as the wire ``[rows,
    nbytes]`` (:func:`join_rows`, ``tail`` after each row)."""
    return join_rows(*quantize(x.reshape(-1), bits, group_size, noise), rows, tail)


def as_words(packed: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """``packed`` as int32 words (a view, eight 4-bit codes per word, the first in the lowest
    nibble: flat, or ``[P, n / 4]`` for the row-strided ``[P, n]`` columns of a wire) when it
    holds 4-bit codes of whole 8-code groups starting at a multiple of 4 bytes; else
    ``packed`` itself. The decoders read either (:func:`decoded_groups`). Called by the
    public decoders before their compiled kernels (``decode*``), never inside one: a graph
    that reads ``storage_offset()`` breaks in two."""
    if not (bits == 4 and group_size % 8 == 0 and packed.dtype == torch.uint8
            and packed.storage_offset() % 4 == 0):
        return packed
    if packed.is_contiguous():
        return packed.reshape(-1).view(torch.int32)
    if (packed.dim() == 2 and packed.stride(1) == 1 and packed.stride(0) % 4 == 0
            and packed.shape[1] % 4 == 0):
        return packed.view(torch.int32)
    return packed


def decoded_groups(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   group_size: int) -> torch.Tensor:
    """float32 values of ``P`` payloads (``scale`` ``(P, groups)``), ``(P, groups, ..)``.

    ``packed`` is bytes, or int32 words (:func:`as_words`), split with per-lane shifts: then
    compiled CPU code loads whole vectors and reads each group's scale once per row. From
    one byte per code, its 8-of-32-byte loads took a slow path and the second peer's scales a
    division per value (decode ~7x slower on one AVX2 core). Same numbers either way."""
    peers = scale.shape[0]
    if packed.dtype == torch.int32:
        w = packed.reshape(peers, -1, group_size // 8, 1)
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
        q = ((w >> shifts) & 15).float() - (qmax_of(bits) + 1)
        return q * scale.view(peers, -1, 1, 1)
    q = unpack_codes(packed, bits).view(peers, -1, group_size).float() - (qmax_of(bits) + 1)
    return q * scale.view(peers, -1, 1)


def decode(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`dequantize` of bytes or words (the compiled kernel)."""
    return decoded_groups(packed, scale.reshape(1, -1), bits, group_size).reshape(-1).to(dtype)


def decode_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
               group_size: int) -> torch.Tensor:
    """:func:`dequantize_sum` of bytes or words (the compiled kernel): peers added in order
    0..P-1 in float32 (the Triton kernel adds in the same order)."""
    values = decoded_groups(packed, scale, bits, group_size)
    total = values[0]
    for p in range(1, values.shape[0]):
        total = total + values[p]
    return total.reshape(-1)


def decode_sum_quantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                        out_bits: int, out_group_size: int,
                        noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dequantize_sum_quantize` of bytes or words (the compiled kernel)."""
    return quantize(decode_sum(packed, scale, bits, group_size), out_bits, out_group_size, noise)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: 1-D tensor of ``scale.numel() * group_size`` values."""
    return decode(as_words(packed, bits, group_size), scale, bits, group_size, dtype)


def dequantize_sum(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                   group_size: int, out: torch.Tensor | None = None,
                   post: tuple[str, float] | None = None) -> torch.Tensor:
    """Sum over peers: ``packed`` (P, nbytes), ``scale`` (P, groups) -> float32 sum (numel,);
    every peer decoded (a group never spans two peers), added in order 0..P-1; ``out``:
    copied there (numel values, any float dtype; the Triton kernel writes it in place);
    ``post``: the sum divided or multiplied first (``post_op.py``)."""
    total = decode_sum(as_words(packed, bits, group_size), scale, bits, group_size)
    return written(total, out, post)


def dequantize_sum_quantize(packed: torch.Tensor, scale: torch.Tensor, bits: int,
                            group_size: int, out_bits: int, out_group_size: int,
                            noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of P peers' payloads requantized to ``out_bits`` (the hop between two all-to-alls)."""
    return decode_sum_quantize(as_words(packed, bits, group_size), scale, bits, group_size,
                               out_bits, out_group_size, noise)


def difference(x: torch.Tensor, ref: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 ``x - ref`` (same numel, any float dtypes), flat, zero-padded to whole groups."""
    d = x.reshape(-1).float() - ref.reshape(-1).float()
    pad = -d.numel() % group_size
    # not F.pad: compiled, it loads every value under a mask (a scalar path on AVX2, ~6x
    # slower); whole groups need no padding at all
    return torch.cat([d, d.new_zeros(pad)]) if pad else d


def dequantize_rows(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                    out: torch.Tensor,
                    riders: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Every row's payload (``packed`` ``[rows, nbytes]``, ``scale`` ``[rows, groups]``, each
    row padded to whole groups) decoded into its row of ``out`` (``[rows, numel]``, rounded
    to its dtype): the slots of a gathered wire (ZeRO++ 3.1, QSDP 5.1). ``riders``:
    ``(out [rows, E], values [rows, E])``, the exact values riding the wire's rows
    (``comm/riders.py``) copied there too."""
    rows, numel = out.shape
    if riders is not None:
        riders[0].copy_(riders[1])
    values = dequantize(packed.reshape(-1), scale.reshape(-1), bits, group_size, out.dtype)
    return out.copy_(values.view(rows, -1)[:, :numel])


def add_to(ref: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``ref + y[:ref.numel()]`` in float32, rounded to ref's dtype, in ref's shape."""
    return (ref.reshape(-1).float() + y[:ref.numel()]).to(ref.dtype).reshape(ref.shape)


def quantize_difference(x: torch.Tensor, ref: torch.Tensor, bits: int, group_size: int,
                        noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize` of ``difference(x, ref)``: qWD's sender step (SDP4Bit 3.1). Two
    kernels on CPU: fused, the group reduction and the rounding each recompute the difference
    from both bf16 inputs (measured ~1.5x slower than storing it once in float32)."""
    return quantize(difference(x, ref, group_size), bits, group_size, noise)


def quantize_difference_row(x: torch.Tensor, ref: torch.Tensor, bits: int, group_size: int,
                            noise: torch.Tensor | None = None,
                            tail: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`quantize_difference` as the uint8 wire row ``[1, nbytes + E]``: its codes, its
    scales, then the bytes of ``tail`` (``[1, E]``, exact values riding along)."""
    return join_rows(*quantize_difference(x, ref, bits, group_size, noise), 1, tail)


def dequantize_add(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                   ref: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """``add_to(ref, dequantize(...))``: qWD's update ``w~ + deq(C(w - w~))`` (SDP4Bit Alg. 2),
    two kernels on CPU: fused, the add read the float32 values flat, each value's code word
    and bf16 ``ref`` a partial vector away (~8x slower on one AVX2 core than storing the
    decoded values once). ``also``: the result copied there too (:func:`also_into`)."""
    return also_into(add_to(ref, dequantize(packed, scale, bits, group_size)), also)


def also_into(result: torch.Tensor, also: torch.Tensor | None) -> torch.Tensor:
    """``result``, copied into ``also`` (the same number of values, any shape and strides;
    the Triton kernel stores it there itself) when given."""
    if also is not None:
        also.copy_(result.view(also.shape) if result.is_contiguous() else
                   result.reshape(also.shape))
    return result


def add_rows(ref: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`add_to` of 2-D ``ref`` and ``y`` (its rows may be strided views)."""
    return (ref.float() + y).to(ref.dtype)


def dequantize_add_rows(packed: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int,
                        ref: torch.Tensor, also: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`dequantize_add` of every row of ``ref`` ``(rows, numel)`` at once (the payload
    rows each padded to whole groups, in order): qWD's update of all gathered slots
    (SDP4Bit Alg. 2). Rows of whole groups lie back to back: one fused kernel; otherwise the
    decode, then :func:`add_rows` over the padded rows' views (a fused kernel would index
    every value through a division by the row length, measured ~10x slower on CPU).
    ``also``: the result written there too (the all-gather's output beside the new w~)."""
    rows, numel = ref.shape
    if numel % group_size == 0:
        return dequantize_add(packed, scale, bits, group_size, ref.reshape(-1),
                              also).view(rows, numel)
    return also_into(add_rows(ref, dequantize(packed, scale, bits, group_size)
                              .view(rows, -1)[:, :numel]), also)


def dequantize_sum_wire(wire: torch.Tensor, code_bytes: int, n_groups: int, bits: int,
                        group_size: int, out: torch.Tensor | None = None,
                        post: tuple[str, float] | None = None,
                        riders: tuple | None = None) -> torch.Tensor:
    """:func:`dequantize_sum` of the payloads in the rows of the uint8 wire ``[P, width]``
    (row p: ``code_bytes`` of codes, then ``n_groups`` float32 scales; more bytes may
    follow); ``out`` and ``post`` as there. ``riders``: ``(out [E], dtype, post)``, the E
    values of ``dtype`` ending each row summed into ``out`` (``post_op.sum_riders``)."""
    if riders is not None:
        sum_riders(wire, riders)
    return dequantize_sum(*wire_fields(wire, code_bytes, n_groups), bits, group_size, out,
                          post)


def dequantize_add_wire(wire: torch.Tensor, code_bytes: int, bits: int, group_size: int,
                        ref: torch.Tensor, also: torch.Tensor | None = None,
                        riders: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`dequantize_add_rows` of the payloads in the rows of the uint8 wire ``[rows,
    width]`` (row r: ``code_bytes`` of codes, then the float32 scales; more bytes may
    follow) and ``ref``, their ``rows * numel`` flat references. Flat, as ``ref``.
    ``riders`` (``[rows, E]``): each row's last bytes (exact values) copied there."""
    if riders is not None:
        take_tail(wire, riders)
    ref = ref.view(wire.shape[0], -1)
    fields = wire_fields(wire, code_bytes, -(-ref.shape[1] // group_size))
    return dequantize_add_rows(*fields, bits, group_size, ref, also).reshape(-1)
