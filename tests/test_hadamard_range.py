"""The Hadamard scheme near float32's range (``compressors/hadamard.py``, "Range"): values up
to ~6e37 round-trip within the 4-bit bound; an outlier of 1e38 decodes non-finite where it
was (visible) and nowhere else; blocks whose rotation overflows float32 decode non-finite,
not silently finite."""

import pytest
import torch

from hfcompress import get_compressor


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "0")


def rel_error(y, x):
    return ((y.double() - x.double()).norm() / x.double().norm()).item()


def test_large_values_round_trip():
    c = get_compressor("hadamard", bits=4, seed=0)
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0)) * 1e37
    y = c.decompress(c.compress(x))
    assert torch.isfinite(y).all() and rel_error(y, x) < 0.25


def test_an_outlier_past_the_range_stays_visible_in_place():
    c = get_compressor("hadamard", bits=4, seed=0)
    x = torch.randn(1024, generator=torch.Generator().manual_seed(1))
    x[5] = 1e38
    y = c.decompress(c.compress(x))
    assert (~torch.isfinite(y)).nonzero().flatten().tolist() == [5]
    assert rel_error(y[128:], x[128:]) < 0.25          # the other groups are unaffected


def test_blocks_that_overflow_decode_non_finite():
    c = get_compressor("hadamard", bits=4, seed=0)
    x = torch.randn(1024, generator=torch.Generator().manual_seed(2))
    x[:32] = 3e38                                     # one Hadamard block: 5.7 x 3e38
    y = c.decompress(c.compress(x))
    assert not torch.isfinite(y[:32]).any()
    assert torch.isfinite(y[128:]).all() and rel_error(y[128:], x[128:]) < 0.25
