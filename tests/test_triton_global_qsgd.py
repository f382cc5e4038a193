"""Triton Global-QSGD kernels vs their torch twins: bit-exact for the same noise.

Runs under TRITON_INTERPRET=1 (tests/conftest.py) on CPU tensors; sizes are a few blocks.
"""

import pytest
import torch

pytest.importorskip("triton")

from hfcompress.compressors import get_compressor  # noqa: E402
from hfcompress.kernels import global_qsgd as twin  # noqa: E402
from hfcompress.kernels import triton_global_qsgd as tri  # noqa: E402

pytestmark = [pytest.mark.triton,  # inf * 0 in numpy (the interpreter) warns
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

INF, NAN = float("inf"), float("nan")


def same_bits(a, b):
    """Equal dtype, shape and bits (-0.0 != 0.0); NaNs in the same places (any payload)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        assert torch.equal(a.isnan(), b.isnan())
        a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
        a, b = a.view({2: torch.int16, 4: torch.int32}[a.element_size()]), \
            b.view({2: torch.int16, 4: torch.int32}[b.element_size()])
    assert torch.equal(a, b)


def inputs(numel, dtype, seed):
    """Values spanning 2**-30 .. 2 of both signs, exact levels, zeros, +-Inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.exp2(-torch.randint(0, 30, (numel,), generator=g))
    x[:8] = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 0.25, INF, NAN])
    x[8:10] = torch.tensor([-INF, 2.0])
    return x.to(dtype), torch.rand(numel, generator=g)


SCALES = [1.0, 0.0, INF, NAN, 3.7e-3]


@pytest.mark.parametrize("wire", [torch.int8, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_quantize_dequantize(wire, dtype):
    x, u = inputs(5001, dtype, 0)
    for s in SCALES:
        scale = torch.tensor([s])
        levels = 31 if wire == torch.int8 else 1 << 24
        q = tri.linear_quantize(x, scale, levels, u, wire)
        same_bits(q, twin.linear_quantize(x, scale, levels, u, wire))
        for codes in (q, q.long() * 3):                      # a wire payload and an int64 sum
            same_bits(tri.linear_dequantize(codes, scale, levels, dtype),
                      twin.linear_dequantize(codes, scale, levels, dtype))


@pytest.mark.parametrize("bits, levels, headroom", [(8, 127, 0), (8, 20, 3), (4, 5, 2), (4, 1, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exp_quantize_dequantize(bits, levels, headroom, dtype):
    x, u = inputs(4098, dtype, 1)
    for s in SCALES:
        scale = torch.tensor([s])
        c = tri.exp_quantize(x, scale, levels, headroom, bits, u)
        same_bits(c, twin.exp_quantize(x, scale, levels, headroom, bits, u))
        same_bits(tri.exp_dequantize(c, scale, headroom, bits, dtype),
                  twin.exp_dequantize(c, scale, headroom, bits, dtype))


def block_scales(numel, block_size, seed):
    """One scale per block (the last partial): random magnitudes over 2**-20 .. 2, with a
    zero, an Inf and a NaN block (the last)."""
    g = torch.Generator().manual_seed(seed)
    k = -(-numel // block_size)
    s = torch.rand(k, generator=g) * torch.exp2(-torch.randint(0, 20, (k,), generator=g)) * 2
    s[[1, 2, k - 1]] = torch.tensor([0.0, INF, NAN])
    return s


@pytest.mark.parametrize("wire", [torch.int8, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [32, 1024])
def test_linear_block_scales(wire, dtype, block_size):
    """Per-block scales (5001 values: 157 or 5 blocks, the last partial)."""
    x, u = inputs(5001, dtype, 3)
    scale = block_scales(5001, block_size, 4)
    levels = 31 if wire == torch.int8 else 1 << 24
    q = tri.linear_quantize(x, scale, levels, u, wire, block_size)
    same_bits(q, twin.linear_quantize(x, scale, levels, u, wire, block_size))
    for codes in (q, q.long() * 3):
        same_bits(tri.linear_dequantize(codes, scale, levels, dtype, block_size),
                  twin.linear_dequantize(codes, scale, levels, dtype, block_size))


@pytest.mark.parametrize("bits, levels, headroom", [(8, 127, 0), (8, 20, 3), (4, 5, 2)])
@pytest.mark.parametrize("block_size", [32, 1024])
def test_exp_block_scales(bits, levels, headroom, block_size):
    """Per-block scales (4098 values: 129 or 5 blocks, the last partial); 4-bit bytes hold
    two values of the same block (block_size is even)."""
    x, u = inputs(4098, torch.bfloat16, 5)
    scale = block_scales(4098, block_size, 6)
    c = tri.exp_quantize(x, scale, levels, headroom, bits, u, block_size)
    same_bits(c, twin.exp_quantize(x, scale, levels, headroom, bits, u, block_size))
    for dtype in (torch.float32, torch.bfloat16):
        same_bits(tri.exp_dequantize(c, scale, headroom, bits, dtype, block_size),
                  twin.exp_dequantize(c, scale, headroom, bits, dtype, block_size))


@pytest.mark.parametrize("bits", [4, 8])
def test_exp_combine_all_code_pairs(bits):
    """Every pair of codes (4 bit: 256 pairs x 16 repeats; 8 bit: 65536 pairs) with random
    noise plus noise values that hit every k of Alg. 2 (0, 2**-k, tiny)."""
    codes = torch.arange(1 << bits, dtype=torch.int32)
    ca, cb = (t.reshape(-1) for t in torch.meshgrid(codes, codes, indexing="ij"))
    if bits == 4:
        ca, cb = ca.repeat(16), cb.repeat(16)
    n = ca.numel()
    g = torch.Generator().manual_seed(2)
    noise = torch.rand(n, generator=g)
    special = torch.tensor([0.0, 2.0 ** -130] + [2.0 ** -k for k in range(1, 130)])
    noise[::7] = special[torch.arange(0, n, 7) % special.numel()]

    def pack(c):
        if bits == 8:
            return c.to(torch.uint8)
        c = c.reshape(-1, 2)
        return (c[:, 0] | (c[:, 1] << 4)).to(torch.uint8)

    same_bits(tri.exp_combine(pack(ca), pack(cb), bits, noise),
              twin.exp_combine(pack(ca), pack(cb), bits, noise))


@pytest.mark.parametrize("name, kw", [("global_qsgd", dict(num_peers=4)),
                                      ("global_qsgd_exp", dict(num_peers=3)),
                                      ("global_qsgd_exp", dict(num_peers=3, bits=4)),
                                      ("global_qsgd", dict(num_peers=4, block_size=256)),
                                      ("global_qsgd_exp", dict(num_peers=3, bits=4,
                                                               block_size=32))])
def test_compressor_backends_agree(name, kw):
    x = torch.randn(3, 1001, dtype=torch.bfloat16)
    peers = [torch.randn(3003) for _ in range(3)]
    out = {}
    for backend in ("torch", "triton"):
        c = get_compressor(name, seed=3, backend=backend, **kw)
        p = c.compress(x)
        scale = torch.stack([c.local_scale(y) for y in peers]).amax()
        ps = [c.compress(y, scale=scale) for y in peers]
        empty = c.compress(torch.empty(0))
        out[backend] = (p.payload["codes"], c.decompress(p), c.reduce(ps),
                        c.reduce_packed(ps).payload["codes"], c.decompress(empty))
    for a, b in zip(out["torch"], out["triton"]):
        same_bits(a, b)
