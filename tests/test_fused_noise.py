"""Rounding noise fused into the quantize kernels: a kernel given the hash keys ``(k1, k2)``
instead of a noise tensor rounds with exactly the numbers of ``noise.uniform_like`` (element i
of the rounded tensor gets the noise of flat index i). Triton (TRITON_INTERPRET=1) hashes in
the kernel; the torch twin expands the keys; both equal the twin fed the materialized noise,
bit for bit, and every stochastic compressor's payload is the one it made with materialized
noise. GPU: the fused kernels lower to PTX for sm_80 without FMA contraction."""

import pytest
import torch

from gpu_compile import run_compile_script
from hfcompress import get_compressor
from hfcompress.compressors.rng import SeededRNG, call_keys
from hfcompress.kernels import dispatch, noise
from hfcompress.kernels import global_qsgd as gqt
from hfcompress.kernels import group_quant as gq
from hfcompress.kernels import hadamard as hd
from hfcompress.kernels import qsgd as qs

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not dispatch.triton_available(), reason="Triton not installed"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # NaN compares in the interpreter
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: few large programs: 3 tiles of 4096 and a partial one (the interpreter costs per program)
SIZES = [128 * 8, 3 * 4096 + 384]


def keys_of(call: int) -> torch.Tensor:
    return torch.tensor(call_keys(12345, call), dtype=torch.int64)  # full 32-bit keys


def values(keys: torch.Tensor, numel: int) -> torch.Tensor:
    return noise.uniform_like(torch.empty(numel), keys)


def data(numel: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.rand(numel, generator=g).pow(2) * 5
    x[7] = float("nan")  # a NaN group / bucket: its codes ignore the noise, the rest do not
    return x.to(dtype)


def triton(mod_twin, name: str, like: torch.Tensor):
    mod = {gq: "triton_group_quant", hd: "triton_hadamard", qs: "triton_qsgd",
           gqt: "triton_global_qsgd"}[mod_twin]
    impl = dispatch.pick(like, "triton", mod_twin, mod)
    assert impl is not mod_twin
    return getattr(impl, name)


def all_same(outs):
    """Every output (a tensor or tuple of tensors) bitwise equal to the first (NaN == NaN)."""
    def bits(t):
        return t.view(torch.int32) if t.dtype == torch.float32 else t
    first = outs[0] if isinstance(outs[0], tuple) else (outs[0],)
    for o in outs[1:]:
        o = o if isinstance(o, tuple) else (o,)
        assert len(o) == len(first)
        for a, b in zip(first, o):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(bits(a), bits(b))


def check(mod_twin, name: str, args_before, args_after, numel: int, like: torch.Tensor):
    """``fn(*args_before, noise, *args_after)``: Triton with keys, twin with keys, twin with
    the materialized values -> the same bits."""
    k = keys_of(numel)
    outs = [triton(mod_twin, name, like)(*args_before, k, *args_after),
            getattr(mod_twin, name)(*args_before, k, *args_after),
            getattr(mod_twin, name)(*args_before, values(k, numel), *args_after)]
    all_same(outs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
def test_group_quant(dtype, numel):
    x = data(numel, dtype)
    check(gq, "quantize", (x, 4, 128), (), numel, x)
    check(gq, "quantize", (x, 6, 96 if numel % 96 == 0 else 128), (), numel, x)
    ref = data(numel, dtype, seed=1)
    check(gq, "quantize_difference", (x, ref, 2, 128), (), numel, x)


def test_group_quant_dequantize_sum_quantize():
    n = 3 * 4096
    qs3 = [gq.quantize(data(n, torch.float32, seed=s), 8, 128) for s in range(3)]
    packed, scale = torch.stack([q[0] for q in qs3]), torch.stack([q[1] for q in qs3])
    check(gq, "dequantize_sum_quantize", (packed, scale, 8, 128, 4, 128), (), n, packed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hadamard_size", [32, 1])
def test_hadamard(dtype, hadamard_size):
    n = SIZES[1]
    x = data(n, dtype)
    check(hd, "quantize", (x, 4, 128, hadamard_size), (), n, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SIZES)
def test_qsgd(dtype, numel):
    x = data(numel, dtype)
    check(qs, "quantize", (x, 8, 1024 if numel % 1024 == 0 else 128), (), numel, x)
    check(qs, "quantize", (x, 4, 128), (), numel, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [None, 256])
def test_global_qsgd(dtype, block_size):
    n = SIZES[1]
    x = data(n, dtype)
    k = 1 if block_size is None else -(-n // block_size)
    scale = torch.rand(k, generator=torch.Generator().manual_seed(3)) * 8 + 1
    check(gqt, "linear_quantize", (x, scale, 31), (torch.int8, block_size), n, x)
    for bits in (8, 4):
        check(gqt, "exp_quantize", (x, scale, 5, 2, bits), (block_size,), n, x)
        a = gqt.exp_quantize(x, scale, 5, 2, bits, values(keys_of(1), n), block_size)
        b = gqt.exp_quantize(data(n, dtype, 9), scale, 5, 2, bits, values(keys_of(2), n),
                             block_size)
        check(gqt, "exp_combine", (a, b, bits), (), n, a)


def test_bad_noise_is_refused():
    x = torch.randn(256)
    q = triton(gq, "quantize", x)
    with pytest.raises(ValueError, match=r"int64 tensor \(k1, k2\)"):
        q(x, 4, 128, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="256 float32 values"):
        q(x, 4, 128, torch.rand(255))


#: name -> (parameters, the payload from the twin given materialized noise u)
STOCHASTIC = {
    "int": (dict(rounding="stochastic", bits=4, group_size=128),
            lambda c, x, u: gq.quantize(x, 4, 128, u)),
    "hadamard": (dict(bits=4, group_size=128, hadamard_size=32),
                 lambda c, x, u: hd.quantize(x, 4, 128, 32, u)),
    "qsgd": (dict(bits=8, bucket_size=128), lambda c, x, u: qs.quantize(x, 8, 128, u)),
    "global_qsgd": (dict(), lambda c, x, u: (c.local_scale(x), gqt.linear_quantize(
        x, c.local_scale(x), c.levels, u, torch.int8))),
    "global_qsgd_exp": (dict(), lambda c, x, u: (c.local_scale(x), gqt.exp_quantize(
        x, c.local_scale(x), c.levels, c.headroom, 8, u))),
}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_compressor_payloads_are_those_of_materialized_noise(name, backend, monkeypatch):
    """Two compress calls (two keys) of each stochastic compressor equal the twin rounding
    with ``SeededRNG(seed).uniform_like``; the Triton path never materializes the noise."""
    from hfcompress.kernels import triton_noise

    params, reference = STOCHASTIC[name]
    c = get_compressor(name, seed=21, backend=backend, **params)
    if backend == "triton":
        def boom(*_):
            raise AssertionError("noise materialized on the Triton path")
        monkeypatch.setattr(triton_noise, "uniform_like", boom)
        monkeypatch.setattr(noise, "uniform_like", boom)
    x = data(4096, torch.bfloat16)
    x[7] = 1.5  # finite: one global scale for the whole tensor
    got = [tuple(c.compress(x).payload.values()) for _ in range(2)]
    monkeypatch.undo()
    rng = SeededRNG(21)
    want = [tuple(reference(c, x, rng.uniform_like(x))) for _ in range(2)]
    for g, w in zip(got, want):
        all_same([w, g])


_COMPILE = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hfcompress.kernels import noise, triton_global_qsgd as G, triton_noise as N, triton_qsgd as Q
from hfcompress.kernels import triton_tiles

def ptx(fn, sig, consts):
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                    constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 80, 32),
                          options={"enable_fp_fusion": False}).asm["ptx"]

block, groups = triton_tiles.tile_shape(1024)
out = [ptx(Q._quantize_kernel, dict(x_ptr="*bf16", u_ptr="*i64", code_ptr="*u8",
           scale_ptr="*fp32", n_buckets="i32", bucket_size="i32", noise_row="i64"),
           dict(S=127, HASH=N.ROW_GROUPS, GROUPS=groups, BLOCK=block))]
out.append(ptx(G._linear_quantize_kernel, dict(x_ptr="*fp16", scale_ptr="*fp32",
               noise_ptr="*i64", noise_row="i32", out_ptr="*i8", n="i32", per="i32",
               levels="fp32"),
               dict(HASH=N.ROW_KEYS, SCALES=2, EVEN=False, BLOCK=G.BLOCK)))
for bits in (8, 4):
    out.append(ptx(G._exp_quantize_kernel, dict(x_ptr="*bf16", scale_ptr="*fp32",
                   noise_ptr="*i64", noise_row="i64", out_ptr="*u8", nbytes="i64", per="i64", levels="i32",
                   headroom="i32", sub_mult="fp32"),
                   dict(HASH=True, SCALES=2, BITS=bits, BLOCK=G.BLOCK)))
    out.append(ptx(G._exp_combine_kernel, dict(a_ptr="*u8", b_ptr="*u8", noise_ptr="*i64",
                   noise_row="i64", out_ptr="*u8", nbytes="i64"), dict(HASH=True, BITS=bits, BLOCK=G.BLOCK)))
ptx_all = "".join(out)
assert not re.search(r"\bfma\.", ptx_all), "contracted multiply-add"
# the in-kernel hash on uint32 lanes: 32-bit multiplies by the finalizer's constants
for mul in (noise.MUL1, noise.MUL2):
    assert re.search(rf"mul\.lo\.s32[^;]*, {mul};", ptx_all), "no 32-bit in-kernel hash"
    assert not re.search(rf"mul\.lo\.s64[^;]*, {mul};", ptx_all), "hash on 64-bit lanes"
print("ok")
"""


def test_fused_kernels_compile_for_a_gpu_without_fma():
    """The qsgd and Global-QSGD kernels with the in-kernel hash lower to PTX for sm_80 (no
    GPU needed; a clean subprocess, see gpu_compile.py) with no FMA contraction (group_quant
    and hadamard: their own compile tests)."""
    pytest.importorskip("triton.backends.nvidia")
    r = run_compile_script(_COMPILE)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
