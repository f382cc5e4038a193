"""Dense packing of unsigned b-bit codes into bytes (b in 2, 4, 6, 8), little-end first.

Layout (same in the Triton kernels): 8 bit one code per byte; 4 bit two codes per byte, the
first in the low nibble; 2 bit four codes per byte, the first in the lowest two bits; 6 bit
four codes in three bytes, as one little-endian 24-bit word c0 | c1<<6 | c2<<12 | c3<<18.
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (2, 4, 6, 8)
#: codes per packing unit and bytes per unit
_UNIT = {8: (1, 1), 4: (2, 1), 2: (4, 1), 6: (4, 3)}


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes holding ``numel`` codes of ``bits`` bits (``numel`` a multiple of the unit)."""
    codes, nbytes = _UNIT[bits]
    if numel % codes:
        raise ValueError(f"{numel} codes cannot be packed {codes} per unit at {bits} bits")
    return numel // codes * nbytes


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (each < 2**bits), 1-D -> densely packed uint8 bytes."""
    if bits == 8:
        return codes.reshape(-1)
    n, _ = _UNIT[bits]
    c = codes.reshape(-1, n)
    if bits == 4:
        return (c[:, 0] | (c[:, 1] << 4)).reshape(-1)
    if bits == 2:
        return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).reshape(-1)
    b0 = c[:, 0] | (c[:, 1] << 6)
    b1 = (c[:, 1] >> 2) | (c[:, 2] << 4)
    b2 = (c[:, 2] >> 4) | (c[:, 3] << 2)
    return torch.stack([b0, b1, b2], dim=1).reshape(-1)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: packed uint8 bytes -> one uint8 code per value."""
    if bits == 8:
        return packed.reshape(-1)
    if bits == 4:
        p = packed.reshape(-1, 1)
        return torch.cat([p & 0xF, p >> 4], dim=1).reshape(-1)
    if bits == 2:
        p = packed.reshape(-1, 1)
        return torch.cat([p & 3, (p >> 2) & 3, (p >> 4) & 3, p >> 6], dim=1).reshape(-1)
    p = packed.reshape(-1, 3)
    b0, b1, b2 = p[:, 0], p[:, 1], p[:, 2]
    c0 = b0 & 0x3F
    c1 = (b0 >> 6) | ((b1 & 0xF) << 2)
    c2 = (b1 >> 4) | ((b2 & 0x3) << 4)
    c3 = b2 >> 2
    return torch.stack([c0, c1, c2, c3], dim=1).reshape(-1)
