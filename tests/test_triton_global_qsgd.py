"""Triton Global-QSGD kernels vs their torch twins: bit-exact for the same noise.

Runs under TRITON_INTERPRET=1 (tests/conftest.py) on CPU tensors; sizes are a few blocks.
"""

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from hfcompress.compressors import get_compressor  # noqa: E402
from hfcompress.kernels import global_qsgd as twin  # noqa: E402
from hfcompress.kernels import triton_global_qsgd as tri  # noqa: E402
from hfcompress.kernels.triton_noise import noise_at  # noqa: E402

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


# -- the local scale, the in-kernel inverse scale and the one-key noise (issue 35) ----------
def test_local_scale_one_pass():
    """max |x| per block (one pass, no |x| tensor) == the twin: one scale, blocks of 32 / 96
    (the last short), blocks spanning programs (atomic_max of their segments), rows with
    their own blocks (a short last block per row), Inf / NaN / -Inf blocks -> +Inf."""
    g = torch.Generator().manual_seed(7)
    for n in (1, 33, 5001, 2 * tri.TILE + 99):
        x = torch.randn(n, generator=g) * torch.exp2(-torch.randint(0, 30, (n,), generator=g))
        if n > 200:
            x[[40, 100, n - 1]] = torch.tensor([INF, NAN, -INF])
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for bs in (None, 32, 96, 2 * tri.TILE):
                same_bits(tri.local_scale(x.to(dtype), bs), twin.local_scale(x.to(dtype), bs))
    x = torch.randn(3, 1000, generator=g)
    x[1, 500] = NAN
    for bs in (None, 32, 96, 512, 2048):
        same_bits(tri.local_scale(x.reshape(-1), bs, 3), twin.local_scale(x.reshape(-1), bs, 3))
    for bs in (None, 32):                                    # empty rows: zeros / no blocks
        same_bits(tri.local_scale(torch.empty(0), bs, 2), twin.local_scale(torch.empty(0), bs, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_keys_whole_and_ragged_programs(dtype):
    """One key pair (the hash's per-program form) and row keys, whole programs (EVEN) and a
    ragged tail, one scale and block scales (one per program: BLOCK; per value: 96)."""
    keys = torch.tensor([0x9E3779B9, 0x7F4A7C15])
    for n in (4 * tri.BLOCK, 4 * tri.BLOCK + 38):
        x, _ = inputs(n, dtype, 8)
        for bs in (None, 96, tri.BLOCK):
            scale = torch.tensor([0.9]) if bs is None else block_scales(n, bs, 9)
            for noise in (keys, torch.stack([keys, keys + 1])):
                q = tri.linear_quantize(x, scale, 31, noise, torch.int8, bs)
                same_bits(q, twin.linear_quantize(x, scale, 31, noise, torch.int8, bs))
            for out in (torch.float32, torch.bfloat16):
                same_bits(tri.linear_dequantize(q.long() * 3, scale, 31, out, bs),
                          twin.linear_dequantize(q.long() * 3, scale, 31, out, bs))


@pytest.mark.parametrize("ragged", [tri.GPU_LINEAR_BLOCK, tri.GPU_LINEAR_BLOCK // 2])
def test_gpu_tile_of_a_ragged_launch(monkeypatch, ragged):
    """A GPU's wide tile: 32 values per thread (GPU_LINEAR_BLOCK), 16 where the last program
    is ragged on Triton < 3.9 (``GPU_LINEAR_RAGGED``: 145 registers at 32 there); whole
    programs keep 32, and the codes are the twin's at either tile (one key pair, a scale per
    tensor and per program)."""
    monkeypatch.setattr(tri, "per_program", lambda t, interpreted, gpu: gpu)
    monkeypatch.setattr(tri, "GPU_LINEAR_RAGGED", ragged)
    wide, keys = tri.GPU_LINEAR_BLOCK, torch.tensor([0x9E3779B9, 0x7F4A7C15])
    whole = torch.empty(2 * wide)
    assert tri._linear_tiles(whole, None, 2 * wide, True, ragged)[0] == wide
    assert tri._linear_tiles(whole, None, 2 * wide + 5, True, ragged)[0] == ragged
    x, _ = inputs(2 * wide + 5, torch.bfloat16, 14)
    for bs, scale in ((None, torch.tensor([0.9])), (wide, block_scales(x.numel(), wide, 15))):
        q = tri.linear_quantize(x, scale, 127, keys, torch.int8, bs)
        same_bits(q, twin.linear_quantize(x, scale, 127, keys, torch.int8, bs))


@pytest.mark.parametrize("bits", [8, 4])
def test_exp_scale_per_program(bits):
    """Exponential codes with one block scale per program (block_size 2 * BLOCK values) and
    one key pair; the in-kernel inverse (0 for the zero / Inf / NaN blocks)."""
    n = 8 * tri.BLOCK + 2
    x, _ = inputs(n, torch.bfloat16, 12)
    scale = block_scales(n, 2 * tri.BLOCK, 13)
    keys = torch.tensor([5, 6])
    c = tri.exp_quantize(x, scale, 5, 2, bits, keys, 2 * tri.BLOCK)
    same_bits(c, twin.exp_quantize(x, scale, 5, 2, bits, keys, 2 * tri.BLOCK))
    same_bits(tri.exp_dequantize(c, scale, 2, bits, torch.float32, 2 * tri.BLOCK),
              twin.exp_dequantize(c, scale, 2, bits, torch.float32, 2 * tri.BLOCK))


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_scale_index_modes(mode):
    """Every ``SCALES`` way of finding a value's scale gives ``scale[i // block_size]`` (mode 3,
    the 64-bit division for blocks past 2**31 values, forced on a short tensor)."""
    n, bs = 4 * tri.BLOCK + 5, 2 * tri.BLOCK if mode == 1 else 96
    x, u = inputs(n, torch.float32, 10)
    scale = block_scales(n, bs, 11)
    q = torch.empty(n, dtype=torch.int8)
    per = bs // tri.BLOCK if mode == 1 else bs
    tri._linear_quantize_kernel[(triton.cdiv(n, tri.BLOCK),)](
        x, scale, u, 1, q, n, per, 31.0, HASH=0, SCALES=mode, EVEN=False, BLOCK=tri.BLOCK)
    same_bits(q, twin.linear_quantize(x, scale, 31, u, torch.int8, bs))
    out = torch.empty(n)
    tri._linear_dequantize_kernel[(triton.cdiv(n, tri.BLOCK),)](
        q, scale, out, n, per, 31.0, SCALES=mode, BLOCK=tri.BLOCK)
    same_bits(out, twin.linear_dequantize(q, scale, 31, torch.float32, bs))


@triton.jit
def _noise_pair(keys_ptr, out_ptr, program, BLOCK: tl.constexpr):
    first = program.to(tl.int64) * BLOCK
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + lanes, tri._program_noise(keys_ptr, first, BLOCK))
    i = first + lanes
    tl.store(out_ptr + BLOCK + lanes, noise_at(keys_ptr, i, i >= 0, 1, 1))


def test_program_noise_is_noise_at():
    """The per-program hash == ``noise_at`` (one key pair), past 2**32 too (the high word)."""
    keys = torch.tensor([0xDEADBEEF, 0x01234567])
    for program in (0, 5, (1 << 22) - 1, (3 << 22) + 7):       # programs of 1024 values
        out = torch.empty(2 * 1024)
        _noise_pair[(1,)](keys, out, program, BLOCK=1024)
        same_bits(out[:1024], out[1024:])
