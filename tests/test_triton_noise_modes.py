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


def test_row_launch_grid_and_mode():
    """A wire of rows is a 2-D grid (programs of a row x rows); its row keys are read once per
    program where they are one pair per wire row, else found per value (same numbers)."""
    n = 12 * 128
    assert tn.row_launch(n, 12, 12, 0, 128, 5, tn.ROW_GROUPS, n) == ((3,), tn.ROW_GROUPS)
    assert tn.row_launch(n, 12, 4, 10, 128, 3, tn.ROW_GROUPS, 512) == ((2, 3), tn.ROW_GROUPS)
    assert tn.row_launch(n, 12, 4, 10, 128, 3, tn.ROW_GROUPS, 256) == ((2, 3), tn.ROW_KEYS)
    assert tn.row_launch(n, 12, 4, 10, 128, 3, tn.ONE_KEY, 1) == ((2, 3), tn.ONE_KEY)
    for bad in ((n - 1, 12, 4), (n, 12, 5)):    # a ragged tail, a partial row: refused
        with pytest.raises(ValueError, match="whole rows of whole groups"):
            tn.row_launch(*bad, 10, 128, 3, tn.ONE_KEY, 1)


@pytest.mark.parametrize("kernel", ["group_quant", "hadamard"])
@pytest.mark.parametrize("strided", [False, True])
def test_rows_every_noise_form_as_the_twin(kernel, strided):
    """The quantize kernels' wire of rows (one program row per wire row, pointers offset by
    the row) rounds with the twin's noise for every form of it: none, one key pair (flat
    indices of all rows), one key pair per row (read once per program), row keys of other
    rows than the wire's (found per value), float32 values; several programs per row."""
    from hfcompress.kernels import group_quant, hadamard, triton_group_quant, triton_hadamard
    rows, gs = 3, 32
    n = 160 * gs     # more groups per row than a program holds under the interpreter
    big = torch.randn(rows, n + 64, generator=torch.Generator().manual_seed(0)) * 3
    x = big[:, :n] if strided else big[:, :n].contiguous()
    call = {"group_quant": (group_quant.quantize_rows, triton_group_quant.quantize_rows, ()),
            "hadamard": (hadamard.quantize_rows, triton_hadamard.quantize_rows, (32,))}[kernel]
    twin, fast, extra = call
    forms = [None, torch.tensor([5, 7]), torch.arange(2 * rows).view(rows, 2) * 977 + 3,
             torch.arange(4 * rows).view(2 * rows, 2) * 131 + 1,
             torch.rand(rows * n, generator=torch.Generator().manual_seed(1))]
    for form in forms:
        want = twin(x.contiguous(), rows, 4, gs, *extra, form)
        assert torch.equal(fast(x, rows, 4, gs, *extra, form), want), form
