"""The group decoders read 4-bit payloads as int32 words when aligned (``group_quant.as_words``)
and byte by byte otherwise: the same numbers either way (the compiled kernels equal the eager
twin: ``test_group_quant.py``)."""

import torch

from hfcompress.kernels import group_quant as gq


def _payload(peers: int, groups: int, group_size: int):
    x = torch.randn(peers, groups * group_size, generator=torch.Generator().manual_seed(0))
    x[0, :group_size] = 0.0                     # an all-zero group decodes to exact zeros
    x[-1, -1] = float("nan")                    # a NaN group stays NaN
    out = [gq.quantize(row, 4, group_size) for row in x]
    return torch.stack([c for c, _ in out]), torch.stack([s for _, s in out])


def _misaligned(packed: torch.Tensor) -> torch.Tensor:
    """The same bytes starting 2 bytes into their storage (not viewable as int32)."""
    buf = torch.empty(packed.numel() + 2, dtype=torch.uint8)[2:]
    return buf.copy_(packed.reshape(-1)).view(packed.shape)


def test_as_words_only_for_aligned_4_bit_whole_words():
    packed, _ = _payload(2, 3, 128)
    assert gq.as_words(packed, 4, 128).dtype == torch.int32
    assert gq.as_words(packed, 4, 128).numel() == packed.numel() // 4
    assert gq.as_words(_misaligned(packed), 4, 128).dtype == torch.uint8
    assert gq.as_words(packed, 8, 128).dtype == torch.uint8
    assert gq.as_words(packed, 4, 12).dtype == torch.uint8     # groups of 12 codes: not words
    wide = torch.cat([packed, torch.zeros(2, 8, dtype=torch.uint8)], 1)
    strided = wide[:, :packed.shape[1]]          # a wire's codes columns: rows strided
    words = gq.as_words(strided, 4, 128)
    assert words.dtype == torch.int32 and words.shape == (2, packed.shape[1] // 4)
    assert words.data_ptr() == wide.data_ptr()   # read in place, no copy
    assert gq.as_words(wide[:, :-2][:, :packed.shape[1] - 2], 4, 128).dtype == torch.uint8


def test_strided_rows_decode_as_contiguous_ones():
    """A receiver's codes and scales are column slices of the ``[peers, row]`` wire: the
    same sum as from contiguous copies (words read through the row stride)."""
    packed, scale = _payload(3, 5, 128)
    wire = torch.cat([packed, scale.view(torch.uint8), torch.zeros(3, 12, dtype=torch.uint8)],
                     1)
    n = packed.shape[1]
    codes, scales = wire[:, :n], wire[:, n:n + 4 * 5].view(torch.float32)
    got, want = gq.dequantize_sum(codes, scales, 4, 128), gq.dequantize_sum(packed, scale, 4, 128)
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


def test_words_and_bytes_decode_alike():
    packed, scale = _payload(3, 5, 128)
    odd = _misaligned(packed)
    same = lambda a, b: torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))  # noqa: E731
    assert same(gq.dequantize_sum(packed, scale, 4, 128),
                gq.dequantize_sum(odd, scale, 4, 128))
    assert same(gq.dequantize_sum(packed, scale, 4, 128),
                gq.decode_sum(packed, scale, 4, 128))              # the byte path itself
    for p in range(3):
        want = gq.decode(packed[p], scale[p], 4, 128, torch.bfloat16)
        assert same(gq.dequantize(packed[p], scale[p], 4, 128, torch.bfloat16), want)
        assert same(gq.dequantize(odd[p], scale[p], 4, 128, torch.bfloat16), want)
    ref = torch.randn(5 * 128 - 9).bfloat16()                     # qWD's update, any numel
    want = gq.add_to(ref, gq.decode(packed[1], scale[1], 4, 128))
    assert same(gq.dequantize_add(packed[1], scale[1], 4, 128, ref), want)
    assert same(gq.dequantize_add(odd[1], scale[1], 4, 128, ref), want)
