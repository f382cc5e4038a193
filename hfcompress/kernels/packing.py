"""Dense packing of unsigned b-bit codes into bytes (b in 2, 4, 6, 8), little-end first.

Layout (same in the Triton kernels): 8 bit one code per byte; 4 bit two codes per byte, the
first in the low nibble; 2 bit four codes per byte, the first in the lowest two bits; 6 bit
four codes in three bytes, as one little-endian 24-bit word c0 | c1<<6 | c2<<12 | c3<<18.

The bits move inside whole integer words (codes one per byte, or packed bytes) with shifts
and masks: element-wise integer ops that ``torch.compile`` vectorizes, no concatenation.
Byte order is little-endian.
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (2, 4, 6, 8)
#: codes per packing unit and bytes per unit
_UNIT = {8: (1, 1), 4: (2, 1), 2: (4, 1), 6: (4, 3)}
#: packing works on words of one byte per code: their type and width in bits
_WORD = {4: (torch.int64, 64), 2: (torch.int64, 64), 6: (torch.int32, 32)}
#: signed type as wide as the packed bytes of one word (where one exists)
_PACKED_INT = {4: torch.int32, 2: torch.int16}


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes holding ``numel`` codes of ``bits`` bits (``numel`` a multiple of the unit)."""
    codes, nbytes = _UNIT[bits]
    if numel % codes:
        raise ValueError(f"{numel} codes cannot be packed {codes} per unit at {bits} bits")
    return numel // codes * nbytes


def payload_buffers(nbytes: int, n_groups: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantizer's outputs, ``nbytes`` uint8 codes and ``n_groups`` float32 scales, as views
    of one allocation, codes first (``Packed.flat()`` then sends it without a copy) where the
    scales land 4-byte aligned; else two allocations."""
    if nbytes % 4:
        return (torch.empty(nbytes, dtype=torch.uint8, device=device),
                torch.empty(n_groups, dtype=torch.float32, device=device))
    buf = torch.empty(nbytes + 4 * n_groups, dtype=torch.uint8, device=device)
    return buf[:nbytes], buf[nbytes:].view(torch.float32)


def flat_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t.reshape(-1).contiguous()``, ``t`` itself where it already is that (what a kernel
    reads by pointer): each torch call costs the host ~2-4 us, a step makes hundreds."""
    return t if t.dim() == 1 and t.is_contiguous() else t.reshape(-1).contiguous()


def tail_bytes(tail: torch.Tensor | None) -> torch.Tensor | None:
    """``[rows, E]`` values (any dtype, any strides) as their ``[rows, E * itemsize]``
    bytes: what rides after each row's payload on a wire (``comm/riders.py``)."""
    if tail is None:
        return None
    return (tail if tail.stride(-1) == 1 else tail.contiguous()).view(torch.uint8)


def tail_nbytes(tail: torch.Tensor | None) -> int:
    """Bytes per row that ``tail`` (``[rows, E]`` values riding, or None) adds to a wire."""
    return 0 if tail is None else tail.shape[1] * tail.element_size()


def row_wire(rows: int, code_bytes: int, groups: int, device,
             tail: int = 0) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """The wire ``[rows, nbytes]`` of ``rows`` payloads, each ``code_bytes`` of codes (a
    multiple of 4) then ``groups`` float32 scales, then ``tail`` bytes (exact values riding,
    ``comm/riders.py``), for a kernel that writes it in place: ``(wire, words, first)``,
    ``words`` its int32 view ``[rows, nbytes / 4]`` and ``first`` the word of row 0's first
    scale (row r's at ``first + r * nbytes / 4``; the kernel stores the scales' bits there,
    and the riders after them: no view per field). None when the row is not whole int32
    words (the caller joins the fields and the tail instead)."""
    width = code_bytes + 4 * groups + tail
    if width % 4:
        return None
    wire = torch.empty(rows, width, dtype=torch.uint8, device=device)
    return wire, wire.view(torch.int32), code_bytes // 4


def put_tail(wire: torch.Tensor, tail: torch.Tensor | None) -> None:
    """Copy ``tail``'s rows (``[rows, E]``, any dtype and strides) into the last bytes of the
    wire's rows (a kernel that does not write the riders itself)."""
    extra = tail_bytes(tail)
    if extra is not None:
        wire[:, wire.shape[1] - extra.shape[1]:].copy_(extra)


def split_tail(wire: torch.Tensor, nbytes: int, dtype: torch.dtype | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The received ``[rows, nbytes]`` payloads and ``[rows, E]`` riders (exact values,
    ``comm/riders.py``) of the wire's rows (views, copied only where the riders' bytes are
    not aligned to ``dtype``); ``dtype`` None: no riders."""
    if dtype is None:
        return wire, None
    raw = wire[:, nbytes:]
    size = dtype.itemsize
    if raw.storage_offset() % size or (raw.shape[0] > 1 and raw.stride(0) % size):
        raw = raw.contiguous()
    return wire[:, :nbytes], raw.view(dtype)


def take_tail(wire: torch.Tensor, tail: torch.Tensor) -> None:
    """Inverse of :func:`put_tail`: the last bytes of the wire's rows into ``tail``
    (``[rows, E]``, any dtype and strides)."""
    tail.copy_(split_tail(wire, wire.shape[1] - tail_nbytes(tail), tail.dtype)[1])


def wire_words(wire: torch.Tensor) -> torch.Tensor | None:
    """The uint8 wire rows ``[rows, width]`` as int32 words ``[rows, width / 4]`` (a view),
    where its start, row stride and width are multiples of 4 bytes and its columns unit
    stride; else None."""
    if wire.stride(-1) != 1 or wire.shape[-1] % 4 or wire.storage_offset() % 4 \
            or (wire.shape[0] > 1 and wire.stride(0) % 4):
        return None
    if wire.stride(0) % 4:    # one row sliced from wider ones: its stride is never stepped
        wire = wire.as_strided(wire.shape, (wire.shape[1], 1))
    return wire.view(torch.int32)


def wire_fields(wire: torch.Tensor, code_bytes: int,
                groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fields of the payloads in the rows of the uint8 wire ``[rows, width]`` (row r:
    ``code_bytes`` of codes, then ``groups`` float32 scales, then maybe other bytes): the
    codes ``[rows, code_bytes]`` and the scales ``[rows, groups]``, column views of the wire
    (the scales copied where their start or the row stride is not a multiple of 4 bytes)."""
    scales = wire[:, code_bytes:code_bytes + 4 * groups]
    if (wire.storage_offset() + code_bytes) % 4 or wire.stride(-1) != 1 or wire.stride(0) % 4:
        scales = scales.clone(memory_format=torch.contiguous_format)   # also one row's stride
    return wire[:, :code_bytes], scales.view(torch.float32)


def _steps(bits: int) -> list[tuple[int, int, int]]:
    """Lane-merging steps ``(shift, low, high)`` from 16-bit lanes up to the word: a lane
    whose two halves each hold a ``v``-bit value at their bottom becomes one ``2v``-bit
    value; ``low``/``high`` select the low and high ``v`` bits of every merged lane."""
    steps, v, lane, width = [], bits, 16, _WORD[bits][1]
    while lane <= width:
        low = sum(((1 << v) - 1) << i for i in range(0, width, lane))
        steps.append((lane // 2 - v, low, low << v))
        v, lane = 2 * v, 2 * lane
    return steps


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (each < 2**bits), 1-D -> densely packed uint8 bytes."""
    codes = codes.reshape(-1)
    nbytes = packed_nbytes(codes.numel(), bits)
    if bits == 8:
        return codes
    word, width = _WORD[bits]
    per_word = width // 8
    pad = (-codes.numel()) % per_word
    if pad or (not torch.compiler.is_compiling() and codes.storage_offset() % per_word):
        codes = torch.nn.functional.pad(codes, (0, pad))  # Tensor.view needs an aligned start
    w = codes.view(word)
    for shift, low, high in _steps(bits):
        w = (w & low) | ((w >> shift) & high)
    if bits in _PACKED_INT:
        out = w.to(_PACKED_INT[bits]).view(torch.uint8)
    else:
        out = torch.stack([(w >> (8 * m)) & 0xFF for m in range(3)], dim=1).to(torch.uint8)
    return out.reshape(-1)[:nbytes]


def _spread(word: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """int32 holding ``k`` packed ``bits``-bit codes at its bottom -> code j in byte j."""
    mask = (1 << bits) - 1
    out = word & mask
    for j in range(1, k):
        out = out | ((word << ((8 - bits) * j)) & (mask << (8 * j)))
    return out


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: packed uint8 bytes -> one uint8 code per value."""
    packed = packed.reshape(-1)
    if bits == 8:
        return packed
    if bits == 2:  # a byte -> an int32 of four codes
        return _spread(packed.to(torch.int32), 2, 4).view(torch.uint8)
    if bits == 6:  # three bytes -> an int32 of four codes
        b = packed.reshape(-1, 3).to(torch.int32)
        return _spread(b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16), 6, 4).view(torch.uint8)
    n = packed.numel()  # 4 bits: four bytes -> an int64 of eight codes
    b = torch.nn.functional.pad(packed, (0, -n % 4)) if n % 4 else packed
    b = b.reshape(-1, 4).to(torch.int64)
    w = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
    for shift, low, high in reversed(_steps(4)):
        w = (w & low) | ((w << shift) & (high << shift))
    return w.view(torch.uint8)[:2 * n]
