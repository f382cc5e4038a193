"""QSDP's quantizers (torch twins): ``qsgd`` (gradients, QSDP 3.2), ``random_shift`` (weights,
QSDP 4.1 Definition 1) and ``learned`` (QSDP 5.2 / App. C).

Statistical tests use fixed seeds and Bernstein tolerances: for R independent draws of an
error e with variance v and |e - E e| <= M, P(|mean - E e| > sqrt(2 v t / R) + 2 M t / (3 R))
<= 2 exp(-t); t = 20 and a union over 1024 coordinates leave a false-alarm chance < 1e-5.
"""

import math

import pytest
import torch

from hfcompress.compressors import get_compressor
from hfcompress.compressors.learned_levels import uniform_levels
from hfcompress.kernels import learned_levels as ll_kernels
from hfcompress.kernels.dispatch import Compiled

SCHEMES = ("qsgd", "random_shift", "learned")
T = 20.0  # Bernstein's t (see the module docstring)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def bernstein(var: torch.Tensor, bound: float, draws: int) -> torch.Tensor:
    """Deviation of a mean of ``draws`` iid errors exceeded with probability <= 2 exp(-T)."""
    return torch.sqrt(2 * var * T / draws) + 2 * bound * T / (3 * draws)


def make(name: str, **kw):
    if name == "learned":
        kw.setdefault("fit_steps", 0)
    return get_compressor(name, **kw)


def roundtrip(c, x):
    return c.decompress(c.compress(x))


# -- the contract -------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("numel", [0, 1, 31, 1000, 1024, 3000])
def test_wire_bits_are_the_payload_bytes(name, numel):
    c = make(name, bits=4, bucket_size=64)
    p = c.compress(torch.randn(numel))
    assert p.wire_bits() == c.wire_bits(numel) == 8 * p.flat().numel()
    buckets = -(-numel // 64)
    floats = {"qsgd": buckets, "random_shift": 2 * buckets, "learned": 2 * buckets + 16}[name]
    assert c.wire_bits(numel) == buckets * 64 * 4 + 32 * floats


def test_bits_per_value_at_defaults():
    # 1024-value buckets: qsgd 8 + 32/1024, random shift 8 + 64/1024, learned 5 + 64/1024 +
    # the 32-level codebook once per payload.
    n = 1 << 20
    assert get_compressor("qsgd").bits_per_value(n) == 8 + 32 / 1024
    assert get_compressor("random_shift").bits_per_value(n) == 8 + 64 / 1024
    assert get_compressor("learned").bits_per_value(n) == 5 + 64 / 1024 + 32 * 32 / n


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (0, 5), (7,), (3, 100), (2, 3, 1024)])
def test_shapes_dtypes_and_unflatten(name, dtype, shape):
    c = make(name, bits=8, bucket_size=96)
    x = torch.randn(shape).to(dtype)
    p = c.compress(x)
    y = c.decompress(p)
    assert y.shape == x.shape and y.dtype == dtype
    q = c.unflatten(p.flat(), x.shape, dtype)
    assert torch.equal(c.decompress(q), y)
    if x.numel():
        # 8 bits, bucket range <= 2 max|x|: error <= one level (2 max|x| / 127) + output rounding
        tol = (2 / 127 + 2 * torch.finfo(dtype).eps) * x.float().abs().max()
        assert (y.float() - x.float()).abs().max() <= tol


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_buckets_decode_non_finite(name, dtype, bad):
    c = make(name, bits=4, bucket_size=32)
    x = torch.randn(4 * 32 - 5).to(dtype)
    x[40] = bad
    y = c.decompress(c.compress(x)).float()
    assert torch.isnan(y[32:64]).all()  # the whole bucket, never finite garbage
    others = torch.cat([y[:32], y[64:]])
    assert torch.isfinite(others).all()
    assert (others - torch.cat([x[:32], x[64:]]).float()).abs().max() < 1.5


@pytest.mark.parametrize("name", SCHEMES)
def test_reduce_is_the_float32_sum(name):
    c = make(name, bits=4, bucket_size=64)
    ps = [c.compress(torch.randn(5, 77) * (i + 1)) for i in range(3)]
    total = c.decompress(ps[0]) + c.decompress(ps[1]) + c.decompress(ps[2])
    assert torch.equal(c.reduce(ps), total)
    with pytest.raises(ValueError, match="at least one"):
        c.reduce([])


@pytest.mark.parametrize("name", SCHEMES)
def test_bad_parameters(name):
    with pytest.raises(ValueError, match="allowed"):
        make(name, bits=1)
    with pytest.raises(ValueError, match="allowed"):
        make(name, bits=9)
    for size in (0, 48, True, 1024.0):
        with pytest.raises(ValueError, match="multiple of 32"):
            make(name, bucket_size=size)
    with pytest.raises(ValueError, match="allowed"):
        make(name, backend="cuda")
    with pytest.raises(TypeError, match="float"):
        make(name).compress(torch.arange(10))


@pytest.mark.parametrize("name", SCHEMES)
def test_compiled_cpu_path_same_numbers(name, monkeypatch):
    # with HFCOMPRESS_COMPILE=1 (conftest turns it off), backend="auto" on CPU runs the twins
    # through torch.compile (COMPILE_ON_CPU): the same numbers as the eager twins
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "1")
    x = torch.randn(3, 700)
    eager, compiled = make(name, bits=4, backend="torch"), make(name, bits=4)
    pe, pc = eager.compress(x), compiled.compress(x)
    assert all(torch.equal(pe.payload[k], pc.payload[k]) for k in pe.payload)
    assert torch.equal(eager.decompress(pe), compiled.decompress(pc))
    twin = compiled._impl(x)  # the compiled copy of the twin module; None marks a failed graph
    # its kernels and those of the twin it decodes with (qsgd: group_quant's)
    kernels = [k for m in (twin, getattr(twin, "_gq", twin)) for k in vars(m).values()
               if isinstance(k, Compiled) and k.graphs]
    graphs = [g for k in kernels for g in k.graphs.values()]
    assert {k.__name__ for k in kernels} >= {"quantize"} and len(kernels) >= 2
    assert graphs and all(g is not None for g in graphs)


def test_qsgd_and_random_shift_take_packable_bits_only():
    for name in ("qsgd", "random_shift"):
        with pytest.raises(ValueError, match="2, 4, 6, 8"):
            get_compressor(name, bits=5)


@pytest.mark.parametrize("name", ["qsgd", "random_shift"])
def test_rng_state_resumes_the_same_noise(name):
    c = make(name, bits=2, bucket_size=32)
    x = torch.randn(4096)
    c.compress(x)
    state = c.state_dict()
    a = c.compress(x)
    d = make(name, bits=2, bucket_size=32, seed=123)
    d.load_state_dict(state)
    b = d.compress(x)
    assert all(torch.equal(a.payload[k], b.payload[k]) for k in a.payload)
    assert not torch.equal(c.compress(x).payload["codes"], a.payload["codes"])  # fresh noise


# -- QSGD (QSDP 3.2, D.3) -----------------------------------------------------------------
def test_qsgd_roundtrip_within_one_level():
    # Stochastic rounding moves a value to one of its two neighbouring levels: error < d.
    c = make("qsgd", bits=4, bucket_size=128)
    x = torch.randn(50, 128) * torch.logspace(-3, 3, 50)[:, None]
    p = c.compress(x)
    d = p.payload["scales"][:, None]
    assert ((c.decompress(p) - x).abs() <= d * (1 + 1e-6)).all()
    zero = c.decompress(c.compress(torch.zeros(300)))
    assert torch.equal(zero, torch.zeros(300))


@pytest.mark.parametrize("bits", [2, 4])
def test_qsgd_unbiased_with_the_paper_variance(bits):
    # R copies of one bucket, each with its own noise, in one call.
    R, n = 2048, 1024
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, generator=gen) * 2
    x[:4] = torch.tensor([0.0, -1.0, 1.0, 0.5]) * x.abs().max()  # values on levels too
    c = make("qsgd", bits=bits, bucket_size=n, seed=7)
    p = c.compress(x.repeat(R))
    y = c.decompress(p).reshape(R, n).double()
    d = p.payload["scales"][0].double()
    frac = torch.frac(x.double().abs() / d)
    var = d**2 * frac * (1 - frac)  # exact per-value variance of QSGD's rounding
    err = y - x.double()
    # unbiased: every coordinate's mean error within Bernstein (|e| <= d)
    assert ((err.mean(0)).abs() <= bernstein(var, d, R) + 1e-6 * d).all()
    # variance: mean over draws of sum_i e_i^2 against sum_i var_i; coordinates are
    # independent, Var(e_i^2) <= d^2 var_i, so 6 sigma = 6 d sqrt(sum var / R)
    mse = (err**2).sum(1).mean()
    assert (mse - var.sum()).abs() <= 6 * d * torch.sqrt(var.sum() / R)
    # the paper's bounds (D.3): sum var <= d ||x||_1 and <= n d^2 / 4
    assert var.sum() <= d * x.double().abs().sum() and var.sum() <= n * d**2 / 4


# -- random shift (QSDP 4.1, Definition 1, Lemma 5) ---------------------------------------
def test_random_shift_nearest_point_of_one_shifted_lattice_per_bucket():
    c = make("random_shift", bits=4, bucket_size=64)
    x = torch.randn(20, 64) * torch.logspace(-2, 2, 20)[:, None]
    x[:, 10] = x[:, 3]  # equal values in a bucket share the lattice, hence the output
    p = c.compress(x)
    y = c.decompress(p)
    base, step = p.payload["base"][:, None], p.payload["step"][:, None]
    k = (y - base) / step
    assert (k - k.round()).abs().max() < 1e-3  # all outputs of a bucket on base + step Z
    r = base - x.min(1, keepdim=True).values
    assert (r.abs() <= step / 2 * (1 + 1e-6)).all()  # the shift: |r| <= step / 2
    assert torch.equal(y[:, 10], y[:, 3])
    # nearest rounding: error <= step / 2 (+ float rounding of base + k * step)
    slack = 4 * torch.finfo(torch.float32).eps * x.abs().amax(1, keepdim=True)
    assert ((y - x).abs() <= step / 2 * (1 + 1e-6) + slack).all()
    const = torch.full((100,), 3.25)
    assert torch.equal(roundtrip(c, const), const)


def test_random_shift_unbiased_over_the_shift():
    # R copies of one bucket, each with its own shift r, in one call. The error of Definition
    # 1 is e = step (round(w) - w) with w = (x - lo - r) / step uniform over one period, so e
    # is uniform on [-step/2, step/2): mean 0 and variance step^2 / 12 for EVERY value.
    # (Lemma 5 states step^2 z (1 - z); that is the variance of Q_{0,step}(x - r), without
    # adding r back. Both are <= step^2 / 4, checked below.)
    R, n, bits = 2048, 1024, 4
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, generator=gen)
    c = make("random_shift", bits=bits, bucket_size=n, seed=3)
    p = c.compress(x.repeat(R))
    y = c.decompress(p).reshape(R, n).double()
    step = p.payload["step"][0].double()
    assert torch.equal(p.payload["step"], p.payload["step"][:1].expand(R))  # same range
    assert p.payload["base"].unique().numel() > R - 10  # one fresh shift per bucket
    err = y - x.double()
    var = step**2 / 12
    assert (err.mean(0).abs() <= bernstein(var, step / 2, R) + 1e-5 * step).all()
    # per coordinate: mean e^2 of R draws within Bernstein of step^2/12 (0 <= e^2 <= step^2/4)
    msq = (err**2).mean(0)
    assert ((msq - var).abs() <= bernstein(var * step**2 / 4, step**2 / 4, R)).all()
    assert msq.max() <= step**2 / 4


def test_random_shift_shifts_are_the_counter_hash_of_each_call():
    """The shift of bucket b is the counter-hash noise of value b under the call's keys (one
    call) or row r's keys (``compress_rows``): a pure function of (seed, call, index), so a
    GPU draws what the CPU draws (a per-device torch.Generator did not: seen on an H200)."""
    from hfcompress.compressors.rng import SeededRNG
    from hfcompress.kernels import noise

    bucket, x = 32, torch.randn(3, 4 * 32)
    c = make("random_shift", bits=8, bucket_size=bucket, seed=7)
    rng = SeededRNG(7)
    lo = x.reshape(-1, bucket).amin(1)

    def shifts(base, step):
        return (base - lo) / step + 0.5             # u of base = lo + (u - 1/2) * step

    p = c.compress(x)
    want = noise.uniform_like(torch.empty(12), rng.next_keys("cpu"))
    assert torch.allclose(shifts(p.payload["base"], p.payload["step"]), want, atol=1e-4)
    c.compress_rows(x)                               # three rows: three calls' row keys
    want = noise.uniform_like(torch.empty(3, 4), rng.next_keys("cpu", 3))
    again = make("random_shift", bits=8, bucket_size=bucket, seed=7)
    again.compress(x)
    for r in range(3):                               # the same as three separate calls
        q = again.compress(x[r])
        got = (q.payload["base"] - x[r].reshape(-1, bucket).amin(1)) / q.payload["step"] + 0.5
        assert torch.allclose(got, want[r], atol=1e-4)


# -- learned levels (QSDP 5.2, Alg. 2, App. C) --------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_learned_code_packing_round_trip(bits):
    codes = torch.randint(0, 1 << bits, (8 * 37,), dtype=torch.uint8)
    packed = ll_kernels.pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == 37 * bits == ll_kernels.packed_nbytes(8 * 37, bits)
    assert torch.equal(ll_kernels.unpack_codes(packed, bits), codes)
    if bits == 5:  # the documented layout: c0 | c1 << 5 | ... as a little-endian 40-bit word
        word = sum(int(c) << (5 * k) for k, c in enumerate(codes[:8]))
        assert packed[:5].tolist() == [(word >> (8 * j)) & 0xFF for j in range(5)]


def mse(c, x):
    return ((roundtrip(c, x) - x) ** 2).mean().item()


@pytest.mark.parametrize("bits,steps,margin", [(4, 300, 0.75), (5, 1000, 0.8)])
def test_learned_levels_beat_uniform_on_normal_data(bits, steps, margin):
    # Uniform levels (fit_steps=0) are the min-max uniform quantizer. Measured ratios:
    # 0.61 (4 bits, 300 steps) and 0.66 (5 bits, 1000 steps); asserted with margin.
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(4))
    uniform = make("learned", bits=bits)
    learned = make("learned", bits=bits)
    learned.fit(x, steps=steps)
    assert torch.equal(uniform.levels, uniform_levels(bits))
    assert mse(learned, x) <= margin * mse(uniform, x)
    held_out = torch.randn(1 << 14, generator=torch.Generator().manual_seed(5))
    assert mse(learned, held_out) <= margin * mse(uniform, held_out)


def test_learned_roundtrip_bound_nearest_level():
    c = make("learned", bits=3, bucket_size=32)
    x = torch.randn(1000)
    c.fit(x, steps=50)
    lv = c.levels.double()
    half_gap = max(lv[0].item(), 1 - lv[-1].item(), ((lv[1:] - lv[:-1]) / 2).max().item())
    p = c.compress(x)
    rng = p.payload["range"].repeat_interleave(32)[:1000]
    slack = 4 * torch.finfo(torch.float32).eps * x.abs().max()
    assert ((c.decompress(p) - x).abs() <= rng * half_gap * (1 + 1e-6) + slack).all()


def test_update_levels_is_one_alg2_step_that_lowers_the_error():
    # Each level moves toward the mean of the values it codes, which lowers its cell's squared
    # error; re-choosing nearest levels lowers it further (a partial Lloyd step).
    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(6))
    c = make("learned", bits=4)
    before = mse(c, x)
    c.update_levels(x, lr=0.01)
    assert mse(c, x) < 0.97 * before
    assert torch.equal(c.levels, c.levels.sort().values)
    assert c.levels.min() >= 0 and c.levels.max() <= 1
    # a level chosen by one value moves by exactly lr toward it (Alg. 2 line 6); levels that
    # only the bucket's min (v = 0) and max (v = 1) choose stay put; unchosen ones too
    one = make("learned", bits=2, bucket_size=32)
    one.update_levels(torch.tensor([0.0] * 30 + [0.3, 1.0]), lr=0.5)
    assert torch.allclose(one.levels, torch.tensor([0.0, 1 / 3 + 0.5 * (0.3 - 1 / 3), 2 / 3, 1.0]))
    y = torch.cat([torch.zeros(16), torch.full((15,), 0.4), torch.ones(1)])
    two = make("learned", bits=2, bucket_size=32)
    two.update_levels(y, lr=0.5)  # 15 values 0.4 move level 1/3 by 1 - 0.5**15 of the way
    assert math.isclose(two.levels[1].item(), 1 / 3 + (1 - 0.5**15) * (0.4 - 1 / 3), rel_tol=1e-6)


def test_learned_codebook_travels_with_the_payload():
    x = torch.randn(5000)
    sender = make("learned", bits=5)
    sender.fit(x, steps=100)
    p = sender.compress(x)
    assert torch.equal(p.payload["levels"], sender.levels)
    receiver = make("learned", bits=5)  # still uniform levels: decoding needs none of its state
    assert torch.equal(receiver.decompress(p), sender.decompress(p))
    assert torch.equal(receiver.reduce([p, p]), sender.decompress(p) * 2)


def test_learned_state_dict_round_trip():
    x = torch.randn(3000)
    a = make("learned", bits=4, fit_steps=50)
    a.compress(x)  # fits once, on this first tensor
    fitted = a.levels.clone()
    assert not torch.equal(fitted, uniform_levels(4))
    b = make("learned", bits=4, fit_steps=50, seed=99)
    b.load_state_dict(a.state_dict())
    pa, pb = a.compress(x * 3), b.compress(x * 3)  # b does not fit again
    assert all(torch.equal(pa.payload[k], pb.payload[k]) for k in pa.payload)
    assert torch.equal(a.levels, fitted)
    with pytest.raises(ValueError, match="sorted finite"):
        b.load_state_dict({**a.state_dict(), "levels": torch.linspace(1, 0, 16)})
    with pytest.raises(ValueError, match="16 sorted"):
        b.load_state_dict({**a.state_dict(), "levels": torch.linspace(0, 1, 8)})
    assert torch.equal(a.fresh().levels, uniform_levels(4))


def test_learned_fits_once_after_warmup():
    x = torch.randn(2048)
    c = make("learned", bits=3, fit_steps=20, fit_after=2)
    c.compress(x)
    c.compress(x)
    assert not c.fitted and torch.equal(c.levels, uniform_levels(3))
    c.compress(x)
    fitted = c.levels.clone()
    assert c.fitted and not torch.equal(fitted, uniform_levels(3))
    c.compress(x * 5 + 1)
    assert torch.equal(c.levels, fitted)


def test_learned_bad_parameters():
    for kw in ({"lr": 0}, {"lr": 1.5}, {"lr": True}, {"fit_steps": -1}, {"fit_after": -2},
               {"batch_size": 0}, {"fit_steps": 2.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            make("learned", **kw)
    c = make("learned")
    with pytest.raises(ValueError, match="steps"):
        c.fit(torch.randn(10), steps=-1)
    with pytest.raises(ValueError, match="lr"):
        c.update_levels(torch.randn(10), lr=2.0)
    c.fit(torch.full((10,), float("nan")), steps=5)  # nothing finite to learn from
    assert torch.equal(c.levels, uniform_levels(5)) and not c.fitted
    auto = make("learned", bits=3, fit_steps=5)
    auto.compress(torch.empty(0))  # an empty first tensor does not use up the one fit
    auto.compress(torch.randn(100))
    assert auto.fitted and not torch.equal(auto.levels, uniform_levels(3))


@pytest.mark.parametrize("name", ["random_shift", "learned"])
def test_min_max_edge_cases(name):
    c = make(name, bits=8, bucket_size=32)
    # fp16 values at the format's limit stay finite (decoded values clip to the dtype's range)
    h = torch.linspace(-65504, 65504, 64).to(torch.float16)
    assert torch.isfinite(roundtrip(c, h)).all()
    # a bucket whose range overflows float32 decodes to NaN (loud), never finite garbage
    big = torch.tensor([3e38, -3e38] * 16)
    assert torch.isnan(roundtrip(c, big)).all()
    # the last bucket is padded with its last value: its range and step stay those of the data
    tail = torch.cat([torch.randn(32), torch.tensor([5.0, 6.0, 7.0])])
    key = "step" if name == "random_shift" else "range"
    ref = 2.0 / 254 if name == "random_shift" else 2.0
    assert math.isclose(c.compress(tail).payload[key][-1].item(), ref, rel_tol=1e-6)
