"""``comm/frozen.py`` in one process: the bytes qWD sends when only some values can change."""

from __future__ import annotations

import pytest
import torch

from hfcompress.comm.frozen import SentBytes, runs_of
from hfcompress.compressors import get_compressor


@pytest.mark.parametrize("bits", [4, 8])
def test_sent_bytes_rebuild_the_full_payload(bits):
    """Differences zero outside ``runs`` (groups of 128, runs crossing and inside groups, a
    last partial group): the selected bytes, expanded with the zero-difference payload, equal
    the full payload byte for byte, and fewer bytes are sent."""
    qwd = get_compressor("qwd", inner=get_compressor("int", bits=bits, group_size=128))
    numel = 1000
    runs = [(100, 140), (500, 510), (990, 1000)]
    ref = torch.randn(numel)
    x = ref.clone()
    for a, b in runs:
        x[a:b] += torch.randn(b - a)
    full = qwd.inner.compress_difference(x, ref).flat()
    sent = SentBytes(qwd, numel, runs)
    picked = sent.select(full)
    assert picked.numel() == sent.count == 4 * (128 * bits // 8 + 4)    # groups 0, 1, 3, 7
    assert torch.equal(sent.expand(picked.view(1, -1).expand(3, -1))[2], full)


def test_other_inner_sends_everything():
    qwd = get_compressor("qwd", inner=get_compressor("int", bits=4, group_size=128,
                                                     rounding="stochastic"))
    assert not SentBytes(qwd, 1000, [(0, 10)]).active


def test_runs_of_merges_adjacent_segments():
    assert runs_of([(3, True), (2, True), (4, False), (0, True), (1, True)]) == [(0, 5), (9, 10)]
