"""Counter-based rounding noise (kernels/noise.py, triton_noise.py) and SeededRNG.

Exactness: the twin against the formula in plain Python ints (indices past 2**32
included), the Triton kernel (TRITON_INTERPRET=1) and the compiled twin against the twin,
bit for bit. Statistics: one seeded draw of n = 2**20 values per test; every tolerance is
5 standard deviations of the statistic for ideal i.i.d. U[0, 1) values (derivations inline).
"""

import copy
import functools
import math

import pytest
import torch

from gpu_compile import run_compile_script
from hfcompress.compressors.rng import SeededRNG, call_keys
from hfcompress.kernels import dispatch, noise

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1
N_LEVELS = 1 << 24  # distinct noise values
N = 1 << 20  # sample size of the statistical tests
SD_CORR = 1 / math.sqrt(N)  # sd of a sample correlation of independent values: 1/sqrt(n)


# -- the formula, in plain Python ints (constants written out, not imported) ---------------
def py_fmix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x5BD1E995) & M32
    return x ^ (x >> 16)


def py_hash(i: int, k1: int, k2: int) -> int:
    return py_fmix(py_fmix((i & M32) ^ k1) ^ ((i >> 32) ^ k2))


KEYS = [(0, 0), (M32, M32), (0x12345678, 0x9ABCDEF0), (1, 0)]


@pytest.mark.parametrize("k1,k2", KEYS)
def test_hash_matches_python_ints_past_2_pow_32(k1, k2):
    idx = [0, 1, 2, 255, 2**31 - 1, 2**31, M32, 2**32, 2**32 + 1, 2**32 + 12345, 3 * 2**32 + 7,
           2**40 + 99, 2**62 + 5]
    got = noise.hash_index(torch.tensor(idx, dtype=torch.int64), torch.tensor(k1),
                           torch.tensor(k2))
    assert got.tolist() == [py_hash(i, k1, k2) for i in idx]


@pytest.mark.parametrize("k1,k2", KEYS)
def test_int32_lanes_hash_the_same_32_bits(k1, k2):
    """``hash_index32`` (int32 lanes: wrapping products, masked shifts; what the CPU twin
    runs below 2**31 values per row) gives the 32 bits of the exact formula."""
    idx = [0, 1, 2, 255, 65535, 65536, 2**24 + 3, 2**30 + 17, 2**31 - 2, 2**31 - 1]
    i = torch.tensor(idx, dtype=torch.int64).to(torch.int32)
    keys = torch.tensor([k1, k2], dtype=torch.int64).to(torch.int32)
    got = noise.hash_index32(i, keys[0], keys[1]).to(torch.int64) & M32
    assert got.tolist() == [py_hash(i, k1, k2) for i in idx]


@pytest.mark.parametrize("k1,k2", KEYS)
def test_uniform_like_is_the_top_24_bits(k1, k2):
    x = torch.empty(3, 7, dtype=torch.bfloat16)
    u = noise.uniform_like(x, torch.tensor([k1, k2]))
    assert u.dtype == torch.float32 and u.shape == x.shape
    assert u.reshape(-1).tolist() == [(py_hash(i, k1, k2) >> 8) / 2**24 for i in range(21)]


def test_stream_is_pinned():
    """Seed 0's first values (as multiples of 2**-24): a change here changes every run's noise."""
    u = SeededRNG(0).uniform_like(torch.empty(4))
    assert (u * 2**24).long().tolist() == [660845, 13934814, 2394256, 3575057]


def test_call_keys_are_the_splitmix64_stream():
    """Call n is output n of splitmix64 (reference: state += gamma, then finalize) whose state
    starts at _mix(seed) = (first splitmix64 output of seed) >> 1; k1 low word, k2 high."""
    def next_out(state):
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return state, z ^ (z >> 31)

    for seed in (0, 7, -3, 2**70):
        state = next_out(seed % 2**64)[1] >> 1
        for call in range(4):
            state, z = next_out(state)
            assert call_keys(seed, call) == (z & M32, z >> 32)


# -- backends -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (4095,), (4096,), (4097,), (3 * 4096 + 5,),
                                   (33, 129)])
def test_triton_bit_exact_with_twin(shape):
    x = torch.empty(shape, dtype=torch.float16)
    for k1, k2 in KEYS:
        keys = torch.tensor([k1, k2])
        impl = dispatch.pick(x, "triton", noise, "triton_noise")
        assert impl is not noise
        got = impl.uniform_like(x, keys)
        assert got.dtype == torch.float32 and got.shape == x.shape
        assert torch.equal(got, noise.uniform_like(x, keys))


_NOISE_COMPILE = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hfcompress.kernels import noise, triton_noise as mod
sig = {"keys_ptr": "*i64", "out_ptr": "*fp32", "numel": "i32", "row_len": "i32",
       "HASH": "constexpr", "BLOCK": "constexpr"}
src = ASTSource(mod._uniform_kernel, sig, {"HASH": mod.ROW_KEYS, "BLOCK": mod.BLOCK})
k = triton.compile(src, target=GPUTarget("cuda", 80, 32), options={"num_warps": mod.NUM_WARPS,
                                                            "enable_fp_fusion": False})
ptx = k.asm["ptx"]
print(all(re.search(rf"mul\.lo\.s32[^;]*, {m};", ptx) for m in (noise.MUL1, noise.MUL2)),
      "div.s64" in ptx, bool(k.asm["cubin"]))
"""


def test_triton_kernel_compiles_for_a_gpu():
    """Lowered for sm_80 down to a cubin (no GPU needed), no host-only paths: the hash on
    32-bit lanes, row keys found by a 32-bit division (no 64-bit one). Compiled in a clean
    subprocess: the interpreter's patches in this one break a real compile whenever the
    Triton cache is cold (a fresh machine)."""
    pytest.importorskip("triton.backends.nvidia")
    out = run_compile_script(_NOISE_COMPILE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False", "True"]


def test_compiled_twin_same_numbers_one_graph():
    """The CPU path: one graph for every size (no recompilation), same numbers as eager. Its
    speed is a benchmark's claim, not a test's (``benchmarks/bench_kernels.py``, its
    stochastic rows)."""
    from torch._dynamo.utils import counters

    fn = dispatch.compiled(noise).uniform_like
    keys = torch.tensor([123, 456])
    fn(torch.empty(1000), keys)  # compiles (dynamic sizes)
    graphs, keyed = counters["stats"]["unique_graphs"], len(fn.graphs)
    for n in (1000, 4097, 77, 100_003, 1 << 20):
        x = torch.empty(n)
        k = torch.tensor(call_keys(0, n))
        assert torch.equal(fn(x, k), noise.uniform_like(x, k))
    assert counters["stats"]["unique_graphs"] == graphs, "recompiled for a new size or key"
    assert len(fn.graphs) == keyed and None not in fn.graphs.values()


# -- SeededRNG ------------------------------------------------------------------------------
def test_seeded_rng_resumes_the_same_noise():
    x = torch.empty(5000)
    a = SeededRNG(3)
    a.uniform_like(x)
    a.generator("cpu")
    state = copy.deepcopy(a.state_dict())
    assert state["calls"] == 1
    want, want_gen = a.uniform_like(x), torch.rand(4, generator=a.generator("cpu"))
    b = SeededRNG(99)
    b.uniform_like(x)
    b.uniform_like(x)
    b.load_state_dict(state)
    assert torch.equal(b.uniform_like(x), want)
    assert torch.equal(torch.rand(4, generator=b.generator("cpu")), want_gen)
    assert b.calls == 2


def test_state_without_a_call_counter_starts_at_call_zero():
    old = {"seed": 3, "states": {}}  # saved before the counter existed
    r = SeededRNG(5)
    r.uniform_like(torch.empty(3))
    r.load_state_dict(old)
    assert torch.equal(r.uniform_like(torch.empty(9)), SeededRNG(3).uniform_like(torch.empty(9)))


def test_noise_ignores_input_values_dtype_and_backend():
    """Same call number -> same numbers for any input of that shape (x is never read)."""
    outs = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.full((257,), float("nan"), dtype=dtype)
        outs.append(SeededRNG(1).uniform_like(x))
    keys = torch.tensor(call_keys(1, 0))
    outs.append(dispatch.pick(x, "triton", noise, "triton_noise").uniform_like(x, keys))
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert SeededRNG(1).uniform_like(torch.empty(0)).shape == (0,)


@functools.cache
def draw(seed: int, calls: int = 1) -> tuple[torch.Tensor, ...]:
    """The first ``calls`` draws of n values of ``SeededRNG(seed)`` (shared, read only)."""
    rng = SeededRNG(seed)
    return tuple(rng.uniform_like(torch.empty(N)) for _ in range(calls))


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a, b]).double())[0, 1].item()


def test_calls_and_seeds_differ_and_are_uncorrelated():
    a, b = draw(0, 2)
    (c,) = draw(1)
    for u, v in ((a, b), (a, c), (b, c)):
        assert not torch.equal(u, v)
        assert abs(corr(u, v)) < 5 * SD_CORR
        # index-aligned exact ties: Poisson(n / 2**24 = 1/16); P(>= 4) ~ 1e-6
        assert (u == v).sum().item() <= 3


# -- statistics of one call -----------------------------------------------------------------
def test_mean_and_variance():
    u = draw(0, 2)[0]
    u = u.double()
    # mean: sd sqrt(1/12 / n) = 2.8e-4
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / N)
    # sample variance: sd sqrt((mu4 - sigma**4) / n), mu4 = 1/80, sigma**4 = 1/144 -> 7.3e-5
    assert abs(u.var().item() - 1 / 12) < 5 * math.sqrt((1 / 80 - 1 / 144) / N)
    assert u.min().item() >= 0 and u.max().item() <= 1 - 2**-24


def chi2(counts: torch.Tensor) -> float:
    expected = counts.sum().item() / counts.numel()
    return ((counts.double() - expected) ** 2 / expected).sum().item()


def chi2_ok(stat: float, bins: int) -> bool:
    """Within 5 sd of its mean: chi-square with d = bins - 1 dof has mean d, sd sqrt(2d).
    The lower bound rejects too-even streams (a counter i / n has stat ~ 0)."""
    d = bins - 1
    return abs(stat - d) < 5 * math.sqrt(2 * d)


def test_chi_square_uniformity_high_and_low_bits_and_pairs():
    u = draw(0, 2)[0]
    k = (u * N_LEVELS).long()  # the 24 noise bits, exactly
    assert chi2_ok(chi2(torch.bincount(k >> 18, minlength=64)), 64)  # top 6 bits: 64 bins
    assert chi2_ok(chi2(torch.bincount(k & 255, minlength=256)), 256)  # low 8 bits
    # consecutive pairs (u_2j, u_2j+1) on a 16 x 16 grid: serial dependence beyond correlation
    pairs = (k >> 20).reshape(-1, 2)
    assert chi2_ok(chi2(torch.bincount(pairs[:, 0] * 16 + pairs[:, 1], minlength=256)), 256)


@pytest.mark.parametrize("lag", [1, 2, 3, 32, 256, 4096, 65536])
def test_lag_correlation(lag):
    u = draw(0, 2)[0]
    # sd of the sample correlation of n - lag independent pairs: ~ 1/sqrt(n)
    assert abs(corr(u[:-lag], u[lag:])) < 5 * SD_CORR


def test_repeated_values_within_and_across_calls():
    """Exact repeats of the 24-bit values, as for n independent draws from 2**24 values.

    Within a call, i -> h is a bijection on 32 bits, so the n values are drawn WITHOUT
    replacement from 2**32 hashes, 256 per noise value: a value is missing with probability
    prod_j (1 - n / (2**32 - j)) ~ (1 - n / 2**32)**256, giving E[distinct]; the number of
    distinct values has variance ~ L e**-lam (1 - (1 + lam) e**-lam), lam = n / L, L = 2**24
    (occupancy with replacement; without is slightly smaller). n - distinct ~ 32,000, sd ~ 172.
    Across calls: a value of call b is one of call a's D_a distinct values with probability
    p = D_a / L (~ n / 2**24 = 1/16); the count of such hits has variance ~ (n + 2 dup_b)
    p (1 - p) (call b's own repeats hit or miss together).
    """
    a, b = draw(0, 2)
    ka, kb = (a * N_LEVELS).long(), (b * N_LEVELS).long()
    lam = N / N_LEVELS
    expected_distinct = N_LEVELS * (1 - (1 - N / 2**32) ** 256)
    sd_distinct = math.sqrt(N_LEVELS * math.exp(-lam) * (1 - (1 + lam) * math.exp(-lam)))
    distinct_a, distinct_b = ka.unique().numel(), kb.unique().numel()
    for d in (distinct_a, distinct_b):
        assert abs(d - expected_distinct) < 5 * sd_distinct
    p = distinct_a / N_LEVELS
    hits = torch.isin(kb, ka).sum().item()
    sd_hits = math.sqrt((N + 2 * (N - distinct_b)) * p * (1 - p))
    assert abs(hits - N * p) < 5 * sd_hits
