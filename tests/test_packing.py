"""Dense b-bit code packing (kernels/packing.py): round trips and the documented layout."""

import pytest
import torch

from hfcompress.kernels.packing import (SUPPORTED_BITS, _UNIT, pack_codes, packed_nbytes,
                                        unpack_codes)


def reference_pack(codes: list[int], bits: int) -> list[int]:
    """The layout of packing.py's docstring, bit by bit: each unit of codes is the
    little-endian word c0 | c1 << bits | ..., written as its bytes."""
    per_unit, nbytes = _UNIT[bits]
    out = []
    for i in range(0, len(codes), per_unit):
        word = sum(c << (bits * j) for j, c in enumerate(codes[i:i + per_unit]))
        out += [(word >> (8 * m)) & 0xFF for m in range(nbytes)]
    return out


def random_codes(n: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << bits, (n,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("n", [0, 4, 8, 12, 36, 100, 4096, 4100])
def test_round_trip_and_layout(bits, n):
    codes = random_codes(n, bits, seed=bits * 10007 + n)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == packed_nbytes(n, bits) == n * bits // 8
    assert packed.tolist() == reference_pack(codes.tolist(), bits)
    assert torch.equal(unpack_codes(packed, bits), codes)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_extreme_codes(bits):
    """All-zero and all-ones codes (every bit of every byte used at 2/4/8 bits)."""
    for value in (0, (1 << bits) - 1):
        codes = torch.full((64,), value, dtype=torch.uint8)
        packed = pack_codes(codes, bits)
        assert packed.tolist() == reference_pack(codes.tolist(), bits)
        assert torch.equal(unpack_codes(packed, bits), codes)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("offset", [1, 3, 5, 6])
def test_unaligned_views(bits, offset):
    """Views starting at any byte offset of a larger buffer (as unflatten makes them) pack and
    unpack like contiguous tensors."""
    codes = random_codes(96, bits, seed=offset)
    buf = torch.zeros(offset + 96 + 7, dtype=torch.uint8)
    buf[offset:offset + 96] = codes
    packed = pack_codes(buf[offset:offset + 96], bits)
    assert torch.equal(packed, pack_codes(codes, bits))
    pbuf = torch.zeros(offset + packed.numel(), dtype=torch.uint8)
    pbuf[offset:] = packed
    assert torch.equal(unpack_codes(pbuf[offset:], bits), codes)


@pytest.mark.parametrize("bits, n", [(4, 3), (2, 6), (6, 10)])
def test_partial_unit_raises(bits, n):
    with pytest.raises(ValueError, match="cannot be packed"):
        pack_codes(torch.zeros(n, dtype=torch.uint8), bits)
