"""Triton group quantization kernels (kernels/triton_group_quant.py) == the torch twin, bit
for bit, under the Triton interpreter (TRITON_INTERPRET=1, set in conftest.py)."""


import pytest
import torch

from gpu_compile import run_compile_script
from hfcompress import get_compressor
from hfcompress.kernels import dispatch
from hfcompress.kernels import group_quant as twin

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not dispatch.triton_available(), reason="Triton not installed"),
    # inf * 0 and NaN compares inside the interpreter's numpy are expected
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


@pytest.fixture(scope="module")
def tt():
    from hfcompress.kernels import triton_group_quant
    return triton_group_quant


def same(a, b):
    """Same dtype, shape, NaN positions and values (NaN payload bits may differ)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(torch.isnan(a), torch.isnan(b))
            and torch.equal(a.nan_to_num(), b.nan_to_num()))


def make_input(n, gs, seed, dtype=torch.float32):
    """Mixed magnitudes with an Inf group, a NaN group, a -Inf group and an all-zero group."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(3) * 10
    x[3] = float("inf")
    x[gs + 1] = float("nan")
    x[3 * gs + 5] = float("-inf")
    x[2 * gs: 3 * gs] = 0
    return x.to(dtype)


def peers(n, bits, gs, p, seed):
    g = torch.Generator().manual_seed(seed)
    qs = [twin.quantize(torch.randn(n, generator=g) * (i + 1), bits, gs) for i in range(p)]
    return torch.stack([q[0] for q in qs]), torch.stack([q[1] for q in qs])


@pytest.mark.parametrize("bits", [2, 4, 6, 8])
@pytest.mark.parametrize("gs", [32, 96, 128])
def test_quantize_equals_twin(tt, bits, gs):
    n = gs * 150  # several programs, the last one partial
    g = torch.Generator().manual_seed(bits + gs)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = make_input(n, gs, seed=bits * gs, dtype=dtype)
        for noise in (None, torch.rand(n, generator=g)):
            codes, scales = tt.quantize(x, bits, gs, noise)
            ref_codes, ref_scales = twin.quantize(x, bits, gs, noise)
            assert torch.equal(codes, ref_codes), (dtype, noise is None)
            assert same(scales, ref_scales), (dtype, noise is None)


def test_quantize_large_group_one_per_program(tt):
    """group_size 4096 + 2048: tiles of one group (BLOCK_G = 1)."""
    for gs in (2048, 4096):
        x = make_input(gs * 4, gs, seed=gs)
        for a, b in zip(tt.quantize(x, 4, gs), twin.quantize(x, 4, gs)):
            assert same(a, b)


@pytest.mark.parametrize("bits", [2, 4, 6, 8])
@pytest.mark.parametrize("gs", [32, 96, 128])
def test_dequantize_equals_twin(tt, bits, gs):
    x = make_input(gs * 150, gs, seed=bits)
    codes, scales = twin.quantize(x, bits, gs)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = tt.dequantize(codes, scales, bits, gs, dtype)
        assert same(out, twin.dequantize(codes, scales, bits, gs, dtype)), dtype
        assert torch.isnan(out[:gs]).all() and torch.isnan(out[gs:2 * gs]).all()
        assert (out[2 * gs:3 * gs] == 0).all()


def test_bf16_output_rounds_to_nearest_even(tt):
    """bf16 output is the float32 decode rounded to nearest even, on data where truncation
    (the interpreter's own cast) would give other values."""
    codes, scales = twin.quantize(make_input(128 * 8, 128, seed=2), 4, 128)
    out = tt.dequantize(codes, scales, 4, 128, torch.bfloat16)
    f32 = twin.dequantize(codes, scales, 4, 128)
    assert same(out, f32.to(torch.bfloat16))
    truncated = (f32.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    assert not same(out, truncated)


@pytest.mark.parametrize("bits, gs", [(4, 128), (8, 32), (2, 96), (6, 64)])
def test_dequantize_sum_equals_twin(tt, bits, gs):
    """P = 3 peers added in order 0, 1, 2 in float32; a non-finite group of one peer makes
    that group NaN in the sum."""
    n = gs * 40
    pk, sc = peers(n, bits, gs, 3, seed=bits)
    sc[1, 7] = float("nan")
    out = tt.dequantize_sum(pk, sc, bits, gs)
    assert same(out, twin.dequantize_sum(pk, sc, bits, gs))
    assert torch.isnan(out[7 * gs: 8 * gs]).all() and torch.isfinite(out[:7 * gs]).all()


@pytest.mark.parametrize("bits, gs, out_bits, out_gs", [
    (8, 128, 4, 128), (4, 32, 8, 128), (8, 96, 4, 32), (4, 128, 2, 384), (6, 64, 6, 32)])
def test_dequantize_sum_quantize_equals_twin(tt, bits, gs, out_bits, out_gs):
    n = 384 * 10
    pk, sc = peers(n, bits, gs, 3, seed=out_bits)
    sc[2, 3] = float("inf")  # a non-finite input group
    g = torch.Generator().manual_seed(1)
    for noise in (None, torch.rand(n, generator=g)):
        a = tt.dequantize_sum_quantize(pk, sc, bits, gs, out_bits, out_gs, noise)
        b = twin.dequantize_sum_quantize(pk, sc, bits, gs, out_bits, out_gs, noise)
        assert torch.equal(a[0], b[0]) and same(a[1], b[1])
        assert torch.isnan(a[1]).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_difference_kernels_equal_twin(tt, dtype):
    """qWD's fused sender / receiver steps: any numel (padded inside), w~ in w's dtype."""
    n, gs = 2048 * 3 + 77, 2048
    x = make_input(n, gs, seed=7, dtype=dtype)
    ref = (x.float() + 0.01 * torch.randn(n, generator=torch.Generator().manual_seed(8))).to(dtype)
    got, want = tt.quantize_difference(x, ref, 4, gs), twin.quantize_difference(x, ref, 4, gs)
    assert all(map(same, got, want))
    assert all(map(same, want, twin.quantize(twin.difference(x, ref, gs), 4, gs)))
    codes, scales = want
    out = tt.dequantize_add(codes, scales, 4, gs, ref)
    assert same(out, twin.dequantize_add(codes, scales, 4, gs, ref)) and out.dtype == dtype
    assert same(out, (ref.float() + twin.dequantize(codes, scales, 4, gs)[:n]).to(dtype))
    for width in (gs, gs - 77):   # qWD's rows of a gather: whole groups, then padded rows
        rows = ref[:3 * width].reshape(3, width)
        got = tt.dequantize_add_rows(codes[:3 * gs // 2], scales[:3], 4, gs, rows)
        want = twin.dequantize_add_rows(codes[:3 * gs // 2], scales[:3], 4, gs, rows)
        assert same(got, want) and got.dtype == dtype
        assert same(want, torch.stack([twin.dequantize_add(codes[r * gs // 2:(r + 1) * gs // 2],
                                                           scales[r:r + 1], 4, gs, rows[r])
                                       for r in range(3)]))


def test_quantize_tiny_group_equals_twin(tt):
    """A group of subnormals and zeros: ``1 / absmax`` overflows to Inf, so its zeros round
    NaN (0 * Inf) to level 0 and the rest clamp to +-qmax, as in the twin."""
    x = torch.randn(128 * 4, generator=torch.Generator().manual_seed(3))
    x[:128] = torch.tensor([0.0, -0.0, 1e-41, -3e-42] * 32)
    for bits in (2, 4, 8):
        for noise in (None, torch.rand(x.numel(), generator=torch.Generator().manual_seed(4))):
            got, want = tt.quantize(x, bits, 128, noise), twin.quantize(x, bits, 128, noise)
            assert torch.equal(got[0], want[0]) and same(got[1], want[1])


@pytest.mark.parametrize("bits, gs", [(4, 2048), (8, 128), (2, 128), (6, 96)])
def test_quantize_difference_equals_twin(tt, bits, gs):
    """qWD's fused sender step: any float dtypes (x and ref may differ), ragged tails padded
    with zeros in the kernel, non-finite groups, every noise mode."""
    g = torch.Generator().manual_seed(bits)
    pairs = ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
             (torch.float16, torch.float32))
    for i, (n, (xd, rd)) in enumerate((n, p) for n in (gs * 3 + 77, gs * 2, 5) for p in pairs):
        padded = -(-n // gs) * gs
        noise = (None, torch.rand(padded, generator=g), torch.tensor([7, 2**32 - 9]),
                 torch.tensor([[1, 2], [3, 4]]))[i % 4]  # none, values, keys, row keys
        x = make_input(max(n, 3 * gs + 6), gs, seed=n, dtype=xd)[:n]
        ref = (x.float() + 0.1 * torch.randn(n, generator=g)).to(rd)
        got = tt.quantize_difference(x, ref, bits, gs, noise)
        want = twin.quantize_difference(x, ref, bits, gs, noise)
        assert torch.equal(got[0], want[0]) and same(got[1], want[1]), (n, xd, rd, i)


@pytest.mark.parametrize("bits, gs", [(4, 2048), (8, 128), (2, 128), (6, 96)])
def test_dequantize_add_equals_twin(tt, bits, gs):
    """qWD's fused update: ``ref`` bf16 / fp16 / fp32, a payload padded past ``ref``, a NaN
    group, the payload read as words or (at an odd offset) as bytes; rows of whole groups
    through the same kernel."""
    g = torch.Generator().manual_seed(bits)
    n = gs * 3 + 77
    codes, scales = twin.quantize(make_input(gs * 4, gs, seed=bits), bits, gs)
    odd = torch.cat([codes[:1], codes])[1:]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        ref = (torch.randn(n, generator=g) * 4).to(dtype)
        want = twin.dequantize_add(codes, scales, bits, gs, ref)
        for packed in (codes, odd):
            out = tt.dequantize_add(packed, scales, bits, gs, ref)
            assert same(out, want) and out.dtype == dtype
        rows = (torch.randn(4, gs, generator=g) * 4).to(dtype)
        out = tt.dequantize_add_rows(codes, scales, bits, gs, rows)
        assert same(out, twin.dequantize_add_rows(codes, scales, bits, gs, rows))
        assert out.shape == rows.shape and out.dtype == dtype


@pytest.mark.parametrize("bits, gs", [(4, 128), (8, 128), (2, 128), (6, 96)])
def test_dequantize_add_reads_wire_rows(tt, bits, gs):
    """qWD's decode of the Y gathered slots reads each row's codes and scales in place in the
    ``[Y, row]`` wire (``Compressor.payload_rows``' column views; rider bytes after each
    payload), or, where the rows are not whole aligned words (odd rider bytes, 6-bit codes),
    copied flat first: the numbers of the twin and of one ``dequantize_add`` per row."""
    g = torch.Generator().manual_seed(bits)
    rows, numel = 3, 2 * gs
    values = make_input(rows * 2 * gs, gs, seed=bits).view(rows, -1)[:, :numel]  # NaN, Inf
    payloads = [twin.quantize(values[r], bits, gs) for r in range(rows)]
    ncodes = payloads[0][0].numel()
    ref = (torch.randn(rows, numel, generator=g) * 4).to(torch.bfloat16)
    for rider in (8, 3):
        wire = torch.stack([torch.cat([c, s.view(torch.uint8),
                                       torch.full((rider,), 7, dtype=torch.uint8)])
                            for c, s in payloads])
        codes = wire[:, :ncodes]
        scales = wire[:, ncodes:ncodes + 4 * (numel // gs)]
        scales = scales.view(torch.float32) if rider % 4 == 0 else scales.contiguous().view(
            torch.float32)
        assert not codes.is_contiguous()
        assert (tt._row_strides(codes, scales) is not None) == (rider % 4 == 0)  # 6-bit: bytes
        got = tt.dequantize_add_rows(codes, scales, bits, gs, ref)
        want = torch.stack([twin.dequantize_add(c, s, bits, gs, ref[r])
                            for r, (c, s) in enumerate(payloads)])
        assert same(got, want) and same(twin.dequantize_add_rows(codes, scales, bits, gs, ref),
                                        want), (rider, bits)


def test_dequantize_sum_quantize_one_peer(tt):
    pk, sc = peers(128 * 40, 8, 128, 1, seed=5)
    noise = torch.tensor([5, 6])
    for out_bits in (2, 4):
        a = tt.dequantize_sum_quantize(pk, sc, 8, 128, out_bits, 128, noise)
        b = twin.dequantize_sum_quantize(pk, sc, 8, 128, out_bits, 128, noise)
        assert torch.equal(a[0], b[0]) and same(a[1], b[1])


def test_empty_inputs(tt):
    codes, scales = tt.quantize(torch.zeros(0), 4, 128)
    assert codes.numel() == 0 and scales.numel() == 0
    assert tt.dequantize(codes, scales, 4, 128).numel() == 0


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_compressor_backends_agree(rounding):
    """``int`` with backend='triton' gives the payloads, decodes and reduce of 'torch'."""
    x = make_input(5000, 128, seed=9, dtype=torch.bfloat16).reshape(50, 100)
    tri = get_compressor("int", bits=4, rounding=rounding, seed=4, backend="triton")
    ref = get_compressor("int", bits=4, rounding=rounding, seed=4, backend="torch")
    pt, pr = tri.compress(x), ref.compress(x)
    assert torch.equal(pt.payload["codes"], pr.payload["codes"])
    assert same(pt.payload["scales"], pr.payload["scales"])
    assert same(tri.decompress(pt), ref.decompress(pr))
    assert same(tri.reduce([pt, pr, pt]), ref.reduce([pr, pt, pr]))


GPU_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hfcompress.kernels import triton_group_quant as T, triton_noise as N

def ptx(fn, sig, consts):
    sig = {**sig, **{k: "constexpr" for k in consts}}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 80, 32), options={"enable_fp_fusion": False})
    return k.asm["ptx"]

u8, f32, i32 = "*u8", "*fp32", "i32"
quant = dict(ref_ptr=f32, noise_row="i64", scale_ptr=f32, scale_off=i32, tail_ptr="*bf16",
             tail_row=i32, tail_n=i32, n_groups=i32, numel="i64", gpr=i32, row_words=i32,
             x_row=i32, run_tiles=i32, run_gap=i32)
q = ptx(T._quantize_kernel, dict(x_ptr="*bf16", noise_ptr=f32, packed_ptr=u8, **quant),
        dict(GS=96, BITS=6, STOCHASTIC=True, HASH=0, DIFF=False, RAGGED=False, ROWS=False,
             XROWS=False, TAIL=0, RUNS=False, **T._tile_consts(6, 96, 1024, itemsize=2)))
for hashed in (N.ONE_KEY, N.ROW_GROUPS):
    q += ptx(T._quantize_kernel, dict(x_ptr="*fp16", noise_ptr="*i64", packed_ptr="*i32",
                                      **quant),
             dict(GS=128, BITS=4, STOCHASTIC=True, HASH=hashed, DIFF=True, RAGGED=True,
                  ROWS=hashed == N.ROW_GROUPS, XROWS=hashed == N.ROW_GROUPS,
                  TAIL=N.TAIL_BLOCK, RUNS=hashed == N.ROW_GROUPS,
                  **T._tile_consts(4, 128, 1024, itemsize=2)))
k = dict(T._tile_consts(2, 32, 1024, per_thread=T.SUM_VALUES_PER_THREAD))
s = ptx(T._dequantize_sum_quantize_kernel, dict(packed_ptr=u8, scale_ptr=f32, noise_ptr="*i64",
        noise_row="i64", out_packed_ptr="*i32", out_scale_ptr=f32, n_groups=i32, n_peers=i32,
        peer_bytes=i32, peer_groups=i32),
        dict(GS=128, BITS=8, CPU=1, BPU=1, OGS=32, OBITS=2, STOCHASTIC=True, HASH=N.ONE_KEY,
             OCPU=k.pop("CPU"), OBPU=k.pop("BPU"), **k))
a = "".join(ptx(T._dequantize_add_kernel, dict(packed_ptr="*i32",
                scale_ptr="*i32" if rows else f32, scale_off=i32, ref_ptr="*bf16",
                out_ptr="*i16", also_ptr="*i16", tail_ptr="*bf16", tail_row=i32,
                tail_off=i32, tail_n=i32, numel="i64", gpr=i32,
                row_words=i32, scale_row=i32, also_row=i32, run_tiles=i32, run_gap=i32),
                dict(GS=128, BITS=4, OUT_BF16=True, RAGGED=not rows, ROWS=rows, ALSO=rows,
                     TAIL=N.TAIL_BLOCK if rows else 0, RUNS=rows,
                     **T._tile_consts(4, 128, 1024, itemsize=2)))
            for rows in (False, True))
print("div.rn.f32" in q, "div.full" in q + s, "fma.rn.f32" in q + s + a)
"""


def test_kernels_compile_for_a_gpu_without_fma():
    """The kernels compile to PTX for sm_80 (no GPU needed), with IEEE division and no
    fused multiply-add, the conditions of bit-exactness with the twin on a real GPU."""
    pytest.importorskip("triton.backends.nvidia")
    out = run_compile_script(GPU_COMPILE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False", "False"]
