"""Every ``HASH`` mode of the in-kernel noise (triton_noise.py) hashes the torch twin's numbers
(TRITON_INTERPRET=1), including the paths only tensors past 2G / 4G values take on a GPU:
row keys found by a 64-bit division (``ROW_KEYS_WIDE``) and flat indices past 2**32 (high
word of the index), run here on small inputs."""

import pytest
import torch

from hfcompress.kernels import dispatch, noise

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not dispatch.triton_available(), reason="Triton not installed")]

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
tn = pytest.importorskip("hfcompress.kernels.triton_noise")

KEYS = torch.tensor([[0, 0], [0xFFFFFFFF, 0xFFFFFFFF], [0x12345678, 0x9ABCDEF0], [1, 0]])


@triton.jit
def _noise_from_kernel(keys_ptr, out_ptr, base, numel, row_len, HASH: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Noise of the flat indices ``base + [0, numel)``."""
    j = tl.arange(0, BLOCK)
    mask = j < numel
    tl.store(out_ptr + j, tn.noise_at(keys_ptr, base + j.to(tl.int64), mask, HASH, row_len),
             mask=mask)


def _twin(base: int, numel: int, keys: torch.Tensor) -> torch.Tensor:
    h = noise.hash_index(torch.arange(base, base + numel), keys[0], keys[1])
    return (h >> (32 - noise.BITS)).float() * (1.0 / (1 << noise.BITS))


@pytest.mark.parametrize("base", [0, 2**31 - 40, 2**32 - 40, 3 * 2**32 + 5])
def test_one_key_past_2_pow_32(base):
    out = torch.empty(100)
    for keys in KEYS:
        _noise_from_kernel[(1,)](keys, out, base, 100, 1, HASH=tn.ONE_KEY, BLOCK=128)
        assert torch.equal(out, _twin(base, 100, keys))


@pytest.mark.parametrize("mode", ["ROW_KEYS", "ROW_KEYS_WIDE"])
def test_row_key_divisions_same_numbers(mode):
    """A row per value by a 32-bit or a 64-bit division: the twin's row-key numbers."""
    rows, row_len = KEYS.shape[0], 30
    out = torch.empty(rows * row_len)
    _noise_from_kernel[(1,)](KEYS, out, 0, out.numel(), row_len, HASH=getattr(tn, mode),
                             BLOCK=128)
    assert torch.equal(out, noise.uniform_like(out, KEYS))


def test_host_picks_the_mode():
    """Row keys: once per group when rows are whole groups, else a 32-bit division while every
    flat index fits in int32, a 64-bit one past that."""
    unused = torch.empty(0)
    assert tn.noise_operand(KEYS, 4 * 256, unused, 128)[1:] == (tn.ROW_GROUPS, 256)
    assert tn.noise_operand(KEYS, 4 * 96, unused, 64)[1:] == (tn.ROW_KEYS, 96)
    assert tn.noise_operand(KEYS, 4 * 96, unused)[1] == tn.ROW_KEYS
    assert tn.noise_operand(KEYS, 2**31, unused)[1] == tn.ROW_KEYS
    assert tn.noise_operand(KEYS, 2**31 + 4, unused)[1] == tn.ROW_KEYS_WIDE
    assert tn.noise_operand(KEYS[0], 2**33, unused)[1] == tn.ONE_KEY
