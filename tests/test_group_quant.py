"""Symmetric absmax group quantization: the ``int`` compressor (SDP4Bit 2.2, ZeRO++ 3.2),
its torch twin and the compiled CPU path (kernels/dispatch.py)."""

import math
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from hfcompress import get_compressor
from hfcompress.kernels import dispatch
from hfcompress.kernels import group_quant as twin

BITS = (2, 4, 6, 8)
#: float32 slack of the error bounds, in units of the scale: the inverse scale and x * inv
#: each carry a relative error <= 2**-24, so y = x * inv is off by <= qmax * 2**-22 levels
#: (3e-5 at 8 bits), and q * scale by 2**-24 relative: 1e-4 covers both.
SLACK = 1e-4


def normal(n, seed):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def student_t2(n, seed):
    """Student-t with 2 degrees of freedom: Z / sqrt(chi2_2 / 2), chi2_2 / 2 = -ln U."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g)
    u = torch.rand(n, generator=g).clamp_min(1e-12)
    return z / torch.sqrt(-torch.log(u))


def outliers(n, seed):
    x = normal(n, seed)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))[: max(1, n // 100)]
    x[idx] *= 1000.0
    return x


INPUTS = {"normal": normal, "student_t2": student_t2, "outliers": outliers}


def element_scales(packed, group_size, numel):
    """The scale of every element's group, as a float64 tensor of ``numel`` values."""
    s = packed.payload["scales"].double().repeat_interleave(group_size)
    return s[:numel]


# -- round-trip error ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("kind", sorted(INPUTS))
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_round_trip_error_bound(bits, kind, rounding):
    """nearest: |x - x^| <= scale / 2 per element; stochastic: |x - x^| < scale
    (scale = absmax / qmax of the element's group), up to SLACK for float32 rounding."""
    x = INPUTS[kind](50_000, seed=bits)
    c = get_compressor("int", bits=bits, group_size=128, rounding=rounding, seed=1)
    p = c.compress(x)
    y = c.decompress(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    s = element_scales(p, 128, x.numel())
    err = (x.double() - y.double()).abs()
    bound = (0.5 if rounding == "nearest" else 1.0) + SLACK
    assert (err <= bound * s).all(), float((err / s).max())
    # the bound is tight: errors reach close to it (the test can see a wrong scale)
    assert float((err / s).max()) > (0.45 if rounding == "nearest" else 0.9)
    # scales are absmax / qmax of each group
    absmax = x.reshape(-1)[: x.numel() // 128 * 128].reshape(-1, 128).abs().amax(1)
    qmax = 2 ** (bits - 1) - 1
    assert torch.equal(p.payload["scales"][: absmax.numel()], absmax / qmax)


@pytest.mark.parametrize("dtype, eps", [(torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8),
                                        (torch.float16, 2.0 ** -11)])
@pytest.mark.parametrize("bits", [4, 8])
def test_dtypes_round_trip_to_their_own_dtype(dtype, eps, bits):
    """bf16 / fp16 / fp32 in -> same dtype out, equal to the float32 decode rounded once to
    that dtype: |x - x^| <= scale / 2 + eps * |x^| (eps: the dtype's half ulp)."""
    x = normal(10_000, seed=7).to(dtype)
    c = get_compressor("int", bits=bits, group_size=128)
    p = c.compress(x)
    y = c.decompress(p)
    assert y.dtype == dtype and y.shape == x.shape
    f32 = twin.dequantize(p.payload["codes"], p.payload["scales"], bits, 128)[: x.numel()]
    assert torch.equal(y, f32.to(dtype))
    s = element_scales(p, 128, x.numel())
    err = (x.double() - y.double()).abs()
    assert (err <= (0.5 + SLACK) * s + eps * y.double().abs()).all()


@pytest.mark.parametrize("numel", [0, 1, 31, 33, 1000, 4097])
@pytest.mark.parametrize("bits", [2, 4, 6, 8])
def test_any_numel_pads(numel, bits):
    """Any numel works (zero-padded to whole groups, padding counted on the wire)."""
    gs = 32
    x = normal(numel, seed=numel).reshape(-1, 1) if numel else torch.zeros(0, 3)
    c = get_compressor("int", bits=bits, group_size=gs)
    p = c.compress(x)
    y = c.decompress(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    groups = math.ceil(x.numel() / gs)
    assert c.wire_bits(x.numel()) == groups * gs * bits + groups * 32 == p.wire_bits()
    if numel:
        s = element_scales(p, gs, x.numel())
        assert ((x.reshape(-1).double() - y.reshape(-1).double()).abs() <= (0.5 + SLACK) * s).all()


@pytest.mark.parametrize("bits", BITS)
def test_all_zero_groups_decode_to_exact_zero(bits):
    x = normal(128 * 6, seed=3)
    x[128:256] = 0.0
    x[512:640] = -0.0
    c = get_compressor("int", bits=bits, group_size=128)
    p = c.compress(x)
    y = c.decompress(p)
    assert p.payload["scales"][1] == 0 and p.payload["scales"][4] == 0
    assert (y[128:256] == 0).all() and (y[512:640] == 0).all()
    codes = twin.unpack_codes(p.payload["codes"], bits)
    assert (codes[128:256] == 2 ** (bits - 1)).all()
    assert (y[:128] != 0).any()


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_group_decodes_to_nan(bits, bad, dtype):
    """A group holding Inf or NaN decodes to all-NaN (never finite garbage); the other
    groups are untouched."""
    x = normal(128 * 4, seed=5)
    x[128 + 17] = bad
    x = x.to(dtype)
    c = get_compressor("int", bits=bits, group_size=128, rounding="stochastic")
    p = c.compress(x)
    y = c.decompress(p)
    assert torch.isnan(y[128:256]).all()
    assert torch.isfinite(y[:128]).all() and torch.isfinite(y[256:]).all()
    ref = get_compressor("int", bits=bits, group_size=128, rounding="stochastic")
    clean = x.clone()
    clean[128:256] = 0
    assert torch.equal(y[:128], ref.decompress(ref.compress(clean))[:128])
    assert torch.isnan(c.reduce([p, p])[128:256]).all()


def test_stochastic_rounding_is_unbiased():
    """E[x^] = x. Each of N independent draws of an element is x + e with
    E[e] = 0 and Var[e] = scale^2 p (1 - p) <= scale^2 / 4, so the mean of N draws has
    standard deviation <= scale / (2 sqrt(N)). With N = 4000 the tolerance is 6 of those
    (per-element false-alarm 2e-9, 512 elements). Nearest rounding must fail the same test,
    which shows the test can fail."""
    n_draws, gs = 4000, 128
    x = student_t2(512, seed=11)
    reps = x.repeat(n_draws)  # every copy draws its own noise: N independent draws
    s = element_scales(get_compressor("int", bits=2, group_size=gs).compress(x), gs, x.numel())
    tol = 6 * s / (2 * math.sqrt(n_draws))
    for rounding in ("stochastic", "nearest"):
        c = get_compressor("int", bits=2, group_size=gs, rounding=rounding, seed=2)
        mean = c.decompress(c.compress(reps)).double().reshape(n_draws, -1).mean(0)
        ok = ((mean - x.double()).abs() <= tol).all()
        assert bool(ok) == (rounding == "stochastic"), rounding


# -- payload contract ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("numel", [1, 1000, 4097])
def test_wire_bits_and_unflatten(bits, numel):
    c = get_compressor("int", bits=bits, group_size=64)
    x = normal(numel, seed=bits)
    p = c.compress(x)
    flat = p.flat()
    assert p.wire_bits() == c.wire_bits(numel) == 8 * flat.numel() == 8 * p.nbytes()
    q = c.unflatten(flat, x.shape, x.dtype)
    assert q.payload.keys() == p.payload.keys()
    for k in p.payload:
        assert torch.equal(q.payload[k], p.payload[k])
    assert torch.equal(c.decompress(q), c.decompress(p))
    # a payload is a whole number of float32 words, so a peer's slice of a received buffer
    # starts 4-byte aligned, not 8: it decodes the same
    assert flat.numel() % 4 == 0
    big = torch.cat([torch.zeros(4, dtype=torch.uint8), flat])
    assert torch.equal(c.decompress(c.unflatten(big[4:], x.shape, x.dtype)), c.decompress(p))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_reduce_is_sum_of_decompressions(bits, rounding):
    """Exactly the float32 sum of the peers' decompressions, added in order."""
    c = get_compressor("int", bits=bits, group_size=128, rounding=rounding)
    shape = (7, 111)
    ps = [c.compress(normal(777, seed=i).reshape(shape)) for i in range(3)]
    total = c.decompress(ps[0]).float()
    for p in ps[1:]:
        total = total + c.decompress(p).float()
    r = c.reduce(ps)
    assert r.dtype == torch.float32 and r.shape == shape
    assert torch.equal(r, total)
    with pytest.raises(ValueError):
        c.reduce([])


@pytest.mark.parametrize("param, value, allowed", [
    ("bits", 3, "2, 4, 6, 8"), ("group_size", 48, "multiple of 32"),
    ("rounding", "up", "'nearest', 'stochastic'"),
    ("backend", "cuda", "'auto', 'torch', 'triton'")])
def test_bad_parameters_raise(param, value, allowed):
    with pytest.raises(ValueError, match=param) as err:
        get_compressor("int", **{param: value})
    assert allowed in str(err.value)


def test_non_float_input_raises():
    with pytest.raises(TypeError, match="float"):
        get_compressor("int").compress(torch.arange(64))


# -- the compiled CPU path (HFCOMPRESS_COMPILE=1) ------------------------------------------

def _same(a, b):
    """Equal values, NaN where the other is NaN, same dtype and shape."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(torch.isnan(a), torch.isnan(b))
            and torch.equal(a.nan_to_num(), b.nan_to_num()))


def test_pick_chooses_compiled_only_when_enabled(monkeypatch):
    x = torch.zeros(4)
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "0")
    assert dispatch.pick(x, "auto", twin, "triton_group_quant") is twin
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "1")
    mod = dispatch.pick(x, "auto", twin, "triton_group_quant")
    assert mod is dispatch.compiled(twin) and isinstance(mod.quantize, dispatch.Compiled)
    # helpers and composites stay Python, calling the compiled kernels (their globals: the copy)
    assert mod.qmax_of(4) == 7 and mod.qmax_of.__globals__ is vars(mod)
    from hfcompress.kernels import hadamard
    had = dispatch.compiled(hadamard)
    assert had._gq is mod and isinstance(had.rotate, dispatch.Compiled)
    assert not isinstance(had.quantize, dispatch.Compiled)
    assert dispatch.pick(x, "torch", twin, "triton_group_quant") is twin


def test_compiled_kernels_equal_eager(monkeypatch):
    """torch.compile'd twin == eager twin, bit for bit (nearest and stochastic, non-finite
    and all-zero groups, a sum of 3 peers, the fused requantize). Compilation takes seconds:
    one bit width, two shapes (the second must reuse the dynamic-shape graph)."""
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "1")
    mod = dispatch.compiled(twin)
    g = torch.Generator().manual_seed(0)
    graphs = []
    for n in (128 * 40, 128 * 75):
        x = torch.randn(n, generator=g)
        x[5], x[300], x[600:728] = float("inf"), float("nan"), 0.0
        noise = torch.rand(n, generator=g)
        keys = torch.tensor([0x9E3779B9, 0xDEADBEEF])  # noise hashed inside the graph
        for nz in (None, noise, keys):
            assert all(map(_same, mod.quantize(x, 4, 128, nz), twin.quantize(x, 4, 128, nz)))
        codes, scales = twin.quantize(x, 4, 128)
        codes = torch.cat([codes[:1], codes])[1:]  # a view at an odd offset, as received
        assert _same(mod.dequantize(codes, scales, 4, 128, torch.bfloat16),
                     twin.dequantize(codes, scales, 4, 128, torch.bfloat16))
        packs = [twin.quantize(torch.randn(n, generator=g), 4, 128) for _ in range(3)]
        pk, sc = torch.stack([p[0] for p in packs]), torch.stack([p[1] for p in packs])
        assert _same(mod.dequantize_sum(pk, sc, 4, 128), twin.dequantize_sum(pk, sc, 4, 128))
        # keys only (the production noise): rounding with noise values is quantize's code,
        # checked above; each combination is a graph of its own (seconds to compile)
        assert all(map(_same, mod.dequantize_sum_quantize(pk, sc, 4, 128, 8, 128, keys),
                       twin.dequantize_sum_quantize(pk, sc, 4, 128, 8, 128, keys)))
        ref = torch.randn(n - 3, generator=g).bfloat16()        # qWD: any numel, bf16 w~
        w = x[:n - 3].bfloat16()
        assert all(map(_same, mod.quantize_difference(w, ref, 4, 128),
                       twin.quantize_difference(w, ref, 4, 128)))
        assert _same(mod.dequantize_add(codes, scales, 4, 128, ref),
                     twin.dequantize_add(codes, scales, 4, 128, ref))
        for width in (n // 5, n // 5 - 3):   # qWD's 5 rows: whole groups, then padded rows
            rows = torch.randn(5, width, generator=g).bfloat16()
            assert _same(mod.dequantize_add_rows(codes, scales, 4, 128, rows),
                         twin.dequantize_add_rows(codes, scales, 4, 128, rows))
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1], "the second size recompiled"  # dynamic shapes


def test_compiled_6_bit_equals_eager(monkeypatch):
    """The 6-bit packing path (three bytes per unit) compiled == eager, group size 96."""
    monkeypatch.setenv("HFCOMPRESS_COMPILE", "1")
    mod = dispatch.compiled(twin)
    x = outliers(96 * 50, seed=4)
    x[100] = float("nan")
    codes, scales = mod.quantize(x, 6, 96)
    assert all(map(_same, (codes, scales), twin.quantize(x, 6, 96)))
    assert _same(mod.dequantize(codes, scales, 6, 96), twin.dequantize(codes, scales, 6, 96))


def test_each_argument_combination_compiles_under_its_own_code_name(monkeypatch):
    """Dynamo remembers sizes per code name / file / line: combinations sharing one made every
    later one compile as a generic dynamic-shape recompile (measured 5x slower)."""
    names = []

    def record(fn, **kwargs):
        names.append(fn.__code__.co_name)
        return fn

    monkeypatch.setattr(torch, "compile", record)
    fn = dispatch.Compiled(twin.quantize)
    x = normal(256, seed=1)
    for bits in (4, 8, 4):
        assert all(map(torch.equal, fn(x, bits, 128), twin.quantize(x, bits, 128)))
    assert len(names) == 2 and len(set(names)) == 2 and all("quantize" in n for n in names)


@pytest.mark.parametrize("stage", ["construct", "run"])
def test_compiled_falls_back_to_eager_with_one_warning(monkeypatch, stage):
    """torch.compile failing (unsupported platform, or the compiled call raising) -> eager
    results, one warning for the function, later argument combinations silent."""
    def broken(fn, **kwargs):
        if stage == "construct":
            raise RuntimeError("no compiler here")

        def run(*args):
            raise RuntimeError("no compiler here")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    fn = dispatch.Compiled(twin.quantize)
    x = normal(256, seed=1)
    with pytest.warns(RuntimeWarning, match="running it eager"):
        out = fn(x, 4, 128)
    assert all(map(torch.equal, out, twin.quantize(x, 4, 128)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(map(torch.equal, fn(x, 4, 128), twin.quantize(x, 4, 128)))
        assert all(map(torch.equal, fn(x, 8, 128), twin.quantize(x, 8, 128)))
    with pytest.raises(RuntimeError):  # bad arguments still raise
        fn(normal(100, seed=1), 4, 128)
