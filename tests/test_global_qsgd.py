"""Global-QSGD (linear and exponential dithering, exponent reduce), torch backend.

Statistical tests use fixed seeds. Their tolerances come from the exact per-value variance
of the rounding: a value t between neighbouring levels lo < t < hi rounds to hi with
probability (t - lo) / (hi - lo), variance (hi - t)(t - lo). Means over N draws are checked
in groups of 64 values (so no single rare Bernoulli event dominates) against 5 sigma of
the group sum; summed squared errors against their exact expectation (relative std of the
estimate < 0.5% at these sizes, tolerance 3%).
"""

import math

import pytest
import torch

from hfcompress.compressors import Packed, get_compressor
from hfcompress.kernels import global_qsgd as K


def lin(**kw):
    return get_compressor("global_qsgd", **{"backend": "torch", **kw})


def expo(**kw):
    return get_compressor("global_qsgd_exp", **{"backend": "torch", **kw})


def group_z(mean, ref, var, n_draws, group=64):
    """z-scores of the summed errors of the means, per group of ``group`` values."""
    err = (mean - ref).reshape(-1, group).sum(1)
    sd = (var.reshape(-1, group).sum(1) / n_draws).sqrt()
    return err / sd.clamp_min(1e-300)


def exp_var(t, levels):
    """Exact variance of exponential dithering of t in [0, 1] (units of the scale)."""
    last = 2.0 ** -(levels - 1)
    lo = torch.where(t >= last, torch.exp2(torch.floor(torch.log2(t.clamp_min(1e-300)))),
                     torch.zeros_like(t))
    hi = torch.where(t >= last, 2 * lo, torch.full_like(t, last))
    return (hi - t) * (t - lo)


# -- parameters ---------------------------------------------------------------------------
def test_auto_levels_follow_overflow_argument():
    assert lin().levels == 127
    assert lin(num_peers=4).levels == 31          # 4 * 31 = 124 <= 127 < 4 * 32
    assert lin(num_peers=8).levels == 15
    assert lin(num_peers=3).levels == 42
    assert lin(num_peers=4, bits=16).levels == 8191
    assert lin(bits=32).levels == 1 << 24          # float32 integer limit
    assert lin(num_peers=1000, bits=32).levels == (2**31 - 1) // 1000
    assert lin(num_peers=4, levels=31).levels == 31
    e = expo()
    assert (e.levels, e.headroom) == (127, 0)
    e = expo(num_peers=8)
    assert (e.levels, e.headroom) == (124, 3)
    e = expo(num_peers=16, bits=4)                 # paper 4.2: n = 16, A = 4 -> s <= 3
    assert (e.levels, e.headroom) == (3, 4)
    assert expo(num_peers=4, headroom=3).levels == 124


@pytest.mark.parametrize("make, kw, match", [
    (lin, dict(num_peers=4, levels=127), "maximum for num_peers=4 and bits=8 is 31"),
    (lin, dict(num_peers=200), "cannot hold"),
    (lin, dict(bits=4), "allowed: 8, 16, 32"),
    (lin, dict(num_peers=0), "positive integer"),
    (lin, dict(num_peers=True), "positive integer"),
    (lin, dict(levels=0), "positive integer"),
    (lin, dict(levels="max"), "positive integer"),
    (lin, dict(backend="cuda"), "allowed"),
    (expo, dict(bits=16), "allowed: 4, 8"),
    (expo, dict(num_peers=4, levels=126), "maximum for num_peers=4 and bits=8 is 125"),
    (expo, dict(num_peers=8, headroom=2), "ceil"),
    (expo, dict(num_peers=256, bits=4), "cannot hold"),
])
def test_bad_parameters(make, kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


@pytest.mark.parametrize("make", [lin, expo])
@pytest.mark.parametrize("block_size", [0, -32, 48, 1000, True, 1024.0, "1024"])
def test_bad_block_size(make, block_size):
    with pytest.raises(ValueError, match="block_size=.* must be a positive multiple of 32"):
        make(block_size=block_size)


def test_bad_inputs():
    c = lin()
    with pytest.raises(TypeError):
        c.compress(torch.arange(4))
    with pytest.raises(ValueError, match="one value"):
        c.compress(torch.ones(4), scale=torch.ones(2))
    with pytest.raises(ValueError, match=r"one value or one per block of 32 values \(3\)"):
        lin(block_size=32).compress(torch.ones(65), scale=torch.ones(2))


# -- linear dithering ---------------------------------------------------------------------
def test_linear_unbiased_and_variance():
    torch.manual_seed(0)
    d, n = 4096, 256
    x = torch.randn(d)
    scale = float(x.abs().max()) * 1.25
    c = lin(num_peers=4, seed=1)                       # 31 levels
    dec = c.decompress(c.compress(x.repeat(n), scale=scale)).reshape(n, d).double()
    y = x.double().abs() / scale * c.levels
    var = (torch.ceil(y) - y) * (y - torch.floor(y)) * (scale / c.levels) ** 2
    z = group_z(dec.mean(0), x.double(), var, n)
    assert z.abs().max() < 5 and 0.5 < (z ** 2).mean() < 1.6
    emp = ((dec - x.double()) ** 2).sum(1).mean()
    assert emp.item() == pytest.approx(var.sum().item(), rel=0.03)
    # Theorem 3 (n = 1): E||C(x) - x||^2 <= sqrt(d) / s * ||x||^2; here also <= d step^2 / 4
    assert emp <= math.sqrt(d) / c.levels * x.double().pow(2).sum()
    assert emp <= d * (scale / c.levels) ** 2 / 4


def test_linear_rounding_thresholds_are_exact():
    """y = x / scale * levels rounds up iff y + noise reaches the next integer in float32: from
    noise 1 - frac(y) on, and never from an ulp of the sum below it (2**-17 at 127 levels;
    rounding to nearest moves the threshold by at most half that): P(up) is the fractional
    part within 2**-18 of a level, E[q] = y within that."""
    torch.manual_seed(4)
    x = torch.rand(4000) * 2 - 1
    one, levels = torch.ones(1), 127
    y = x.clamp(-1, 1) * levels
    frac = y - torch.floor(y)
    keep = (frac > 0) & (y.abs() >= 1)       # 1 - frac exact in float32
    up = 1 - frac
    below = (up - 2.0 ** -17).clamp_min(0)
    for u, want in ((up, torch.ceil(y)), (below, torch.floor(y))):
        q = K.linear_quantize(x, one, levels, u, torch.int8)
        assert torch.equal(q[keep].float(), want[keep])
    assert keep.sum() > 3800 and (up[keep] >= 2.0 ** -17).all()


def test_linear_reduce_packed_is_exact_integer_sum():
    torch.manual_seed(1)
    c = lin(num_peers=4, seed=2)
    xs = [torch.randn(999) for _ in range(4)]
    for x in xs:                                   # every peer at +-scale: codes +-31
        x[:10], x[10:20] = 5.0, -5.0
    scale = torch.stack([c.local_scale(x) for x in xs]).amax()          # the MAX all-reduce
    ps = [c.compress(x, scale=scale) for x in xs]
    total = c.reduce_packed(ps)
    exact = torch.stack([p.payload["codes"].long() for p in ps]).sum(0)
    assert total.payload["codes"].dtype == torch.int8
    assert torch.equal(total.payload["codes"].long(), exact)
    assert (exact[:10] == 124).all() and (exact[10:20] == -124).all()  # 4 * 31 fits int8
    # a stock int8 all_reduce(SUM) (wrapping arithmetic) gives the same codes
    assert torch.equal(torch.stack([p.payload["codes"] for p in ps]).sum(0, dtype=torch.int8),
                       total.payload["codes"])
    step = scale / c.levels
    out = c.decompress(total)
    assert torch.equal(out, exact.float() * step)                      # one float multiply
    assert torch.equal(c.reduce(ps), out)
    torch.testing.assert_close(out, sum(c.decompress(p) for p in ps), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="num_peers=4"):
        c.reduce_packed(ps + ps[:1])
    with pytest.raises(ValueError, match="same global scale"):
        c.reduce_packed([ps[0], c.compress(xs[0] * 2)])


# -- exponential dithering ----------------------------------------------------------------
def test_exp_rounding_thresholds_are_exact():
    """P(round up) equals (t - lo) / (hi - lo) exactly: noise just below it rounds up, noise
    at it rounds down (levels region and the region below the last level)."""
    torch.manual_seed(2)
    levels = 6
    t = torch.cat([torch.rand(2000), torch.rand(2000) * 2.0 ** -(levels - 1)])
    lo = torch.where(t >= 2.0 ** -(levels - 1), torch.exp2(torch.floor(torch.log2(t))),
                     torch.zeros_like(t))
    hi = torch.where(t >= 2.0 ** -(levels - 1), 2 * lo, torch.full_like(t, 2.0 ** -(levels - 1)))
    p_up = ((t.double() - lo) / (hi - lo)).float()                     # exact in float32
    one = torch.ones(1)
    for u, want in ((torch.nextafter(p_up, torch.zeros(1)), hi), (p_up, lo)):
        codes = K.exp_quantize(t, one, levels, 0, 8, u)
        got = K.exp_dequantize(codes, one, 0, 8)
        keep = p_up > 0
        assert torch.equal(got[keep], want[keep])
    assert torch.equal(K.exp_dequantize(K.exp_quantize(t, one, levels, 0, 8, torch.rand(4000)),
                                        one, 0, 8)[p_up == 0], t[p_up == 0])


@pytest.mark.parametrize("bits, peers", [(8, 1), (4, 4)])
def test_exp_unbiased_and_variance(bits, peers):
    torch.manual_seed(3)
    d, n = 4096, 256
    mag = torch.exp2(-torch.randint(0, 7, (d,)).float()) * (1 + torch.rand(d)) / 2
    x = torch.where(torch.rand(d) < 0.5, -mag, mag) * 3.0
    scale = float(x.abs().max())
    c = expo(num_peers=peers, bits=bits, seed=4)
    dec = c.decompress(c.compress(x.repeat(n), scale=scale)).reshape(n, d).double()
    var = exp_var(x.double().abs() / scale, c.levels) * scale ** 2
    z = group_z(dec.mean(0), x.double(), var, n)
    assert z.abs().max() < 5 and 0.5 < (z ** 2).mean() < 1.6
    emp = ((dec - x.double()) ** 2).sum(1).mean()
    assert emp.item() == pytest.approx(var.sum().item(), rel=0.03)
    norm2 = x.double().pow(2).sum()
    # Theorem 3 (n = 1): omega = 1/8 + sqrt(d) / 2**(s-1)
    assert emp <= (1 / 8 + math.sqrt(d) / 2 ** (c.levels - 1)) * norm2
    if c.levels > 20:                              # all values above the last level: C_nat
        assert emp <= norm2 / 8                    # E||C(x)||^2 <= 9/8 ||x||^2


def test_exp_worst_case_variance_is_one_eighth():
    """t = 4/3 * 2**-j rounds to 2**-j w.p. 2/3 and to 2**(1-j) w.p. 1/3: variance t**2 / 8.
    Per draw (C - t)**2 / t**2 has mean 1/8 and std 0.088; 1M draws -> std of the mean
    8.8e-5, tolerance 1e-3."""
    c = expo(seed=5)
    x = (4 / 3) * torch.exp2(-torch.arange(1, 9).float()).repeat(1 << 17)
    dec = c.decompress(c.compress(x, scale=1.0)).double()
    ratio = ((dec - x.double()) ** 2 / x.double() ** 2).mean()
    assert abs(ratio - 1 / 8) < 1e-3


# -- the exponent reduce (Alg. 2) ---------------------------------------------------------
def enumerate_combine(bits):
    """Every pair of codes, combined under each value k = 1..m of Alg. 2's k (noise 2**-k),
    with the probability of k: P(k) = 2**-k for k < m, P(m) = 2**-(m-1)."""
    m = (1 << (bits - 1)) - 1
    codes = torch.arange(1 << bits, dtype=torch.int32)
    ca, cb = torch.meshgrid(codes, codes, indexing="ij")
    ca, cb = ca.reshape(-1), cb.reshape(-1)
    pack = (lambda c: c.to(torch.uint8)) if bits == 8 else \
        (lambda c: (c.reshape(-1, 2)[:, 0] | (c.reshape(-1, 2)[:, 1] << 4)).to(torch.uint8))
    outs, probs = [], []
    for k in range(1, m + 1):
        p = torch.full(ca.shape, 2.0 ** -k if k < m else 0.0)
        outs.append(K._split(K.exp_combine(pack(ca), pack(cb), bits, p), bits))
        probs.append(2.0 ** -k if k < m else 2.0 ** -(m - 1))
    return ca, cb, torch.stack(outs), torch.tensor(probs, dtype=torch.float64)


def value(c, bits):
    """Reference decoding of (sign, e) codes (eq. 3, headroom 0, scale 1) in float64."""
    e = (c & ((1 << (bits - 1)) - 1)).double()
    v = torch.where(e > 0, torch.exp2(1 - e), torch.zeros_like(e))
    return torch.where((c >> (bits - 1)) == 1, -v, v)


@pytest.mark.parametrize("bits", [4, 8])
def test_exponent_reduce_exact_expectation_and_variance(bits):
    """Over all code pairs and the exact law of k: E[combine(a, b)] = a + b and
    Var <= (a + b)**2 / 8 (C_nat), except same-sign pairs at the top exponent (e = 1),
    which the compressor's headroom keeps out of any sum."""
    m = (1 << (bits - 1)) - 1
    ca, cb, out, prob = enumerate_combine(bits)
    ea, eb = ca & m, cb & m
    same = ((ca >> (bits - 1)) == (cb >> (bits - 1))) & (ea > 0) & (eb > 0)
    ok = ~(same & (torch.minimum(ea, eb) == 1))
    assert ((out & m) >= 0).all() and ((out & m)[:, ok] > 0).any()
    z = value(ca, bits) + value(cb, bits)
    v = value(out, bits)
    mean = (prob[:, None] * v).sum(0)
    var = (prob[:, None] * (v - z) ** 2).sum(0)
    torch.testing.assert_close(mean[ok], z[ok], rtol=1e-12, atol=0.0)
    assert (var[ok] <= z[ok] ** 2 / 8 * (1 + 1e-12)).all()
    # the worst pair, 2**-e + 2**-(e+2) = 1.25 * 2**-e: variance exactly 3/25 z**2
    pair = ok & same & (eb - ea == 2)
    torch.testing.assert_close(var[pair], 3 / 25 * z[pair] ** 2, rtol=1e-12, atol=0.0)
    # a zero operand passes the other through; opposite signs, equal exponents -> zero
    zero_a = ea == 0
    assert torch.equal(v[:, zero_a], value(cb[zero_a], bits).expand(m, -1))
    cancel = (ea == eb) & (ea > 0) & ~same
    assert (v[:, cancel] == 0).all()


def test_combine_unbiased_statistically():
    """combine() with the compressor's own noise: mean over 256 draws -> a + b (5 sigma per
    group of 64 values), summed squared error -> its exact value (3%), <= ||a + b||**2 / 8."""
    torch.manual_seed(6)
    d, n = 4096, 256
    c = expo(num_peers=2, seed=7)
    x1, x2 = torch.randn(d), torch.randn(d)
    scale = float(torch.maximum(x1.abs().max(), x2.abs().max()))
    a, b = c.compress(x1, scale=scale), c.compress(x2, scale=scale)
    z = c.decompress(a).double() + c.decompress(b).double()

    def rep(p):
        return Packed({"scale": p.payload["scale"], "codes": p.payload["codes"].repeat(n)},
                      torch.Size([n * d]), torch.float32)

    got = c.decompress(c.combine(rep(a), rep(b))).reshape(n, d).double()
    t = z.abs() / scale                                    # C_nat rounds t between powers of 2
    lo = torch.exp2(torch.floor(torch.log2(t.clamp_min(1e-300))))
    var = torch.where(t > 0, (2 * lo - t) * (t - lo), torch.zeros_like(t)) * scale ** 2
    zz = group_z(got.mean(0), z, var, n)
    assert zz.abs().max() < 5 and 0.5 < (zz ** 2).mean() < 1.6
    emp = ((got - z) ** 2).sum(1).mean()
    assert emp.item() == pytest.approx(var.sum().item(), rel=0.03)
    assert emp <= (z ** 2).sum() / 8


def test_exp_reduce_packed_tree():
    torch.manual_seed(8)
    c = expo(num_peers=5, seed=9)                          # headroom 3 >= tree depth 3
    xs = [torch.full((64,), 2.0) for _ in range(5)]        # the largest sum: 5 * scale
    ps = [c.compress(x, scale=2.0) for x in xs]
    out = c.decompress(c.reduce_packed(ps))
    assert ((out == 8.0) | (out == 16.0)).all()           # C_nat(10), never 0 (no overflow)
    assert torch.equal(c.reduce(ps), torch.full((64,), 10.0))
    with pytest.raises(ValueError, match="num_peers=5"):
        c.reduce_packed(ps + ps[:1])
    with pytest.raises(ValueError, match="same global scale"):
        c.combine(ps[0], c.compress(xs[0], scale=4.0))


# -- block-wise global scales (block_size) ------------------------------------------------
BLOCKED = [lambda **k: lin(num_peers=4, **k), lambda **k: expo(num_peers=4, **k),
           lambda **k: expo(num_peers=2, bits=4, **k)]


@pytest.mark.parametrize("make", BLOCKED)
@pytest.mark.parametrize("numel", [1, 31, 1000])
def test_block_size_none_is_one_block(make, numel):
    """block_size=None (the paper) == one block holding the whole tensor, bit for bit."""
    torch.manual_seed(11)
    xs = [torch.randn(numel) for _ in range(2)]
    one, blocked = make(seed=3), make(seed=3, block_size=1024)
    assert blocked.num_scales(numel) == 1
    for x in xs:
        p, q = one.compress(x), blocked.compress(x)
        assert torch.equal(p.payload["scale"], q.payload["scale"])
        assert torch.equal(p.payload["codes"], q.payload["codes"])
        assert torch.equal(one.decompress(p), blocked.decompress(q))
    scale = torch.stack([one.local_scale(x) for x in xs]).amax(0)
    ps, qs = ([c.compress(x, scale=scale) for x in xs] for c in (one, blocked))
    assert torch.equal(one.reduce(ps), blocked.reduce(qs))
    assert torch.equal(one.reduce_packed(ps).payload["codes"],
                       blocked.reduce_packed(qs).payload["codes"])


def test_kernels_equal_block_scales_equal_one_scale():
    """Every block at the same scale gives the bits of the single scale (the per-value scale
    lookup changes nothing else), Inf/NaN inputs and a partial last block included."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1000, generator=g) * torch.exp2(-torch.randint(0, 20, (1000,), generator=g))
    x[:3] = torch.tensor([float("inf"), float("nan"), 0.0])
    u = torch.rand(1000, generator=g)
    for s in (0.7, float("inf")):
        one = torch.tensor([s])
        for bs in (32, 96):
            vec = one.repeat(-(-1000 // bs))
            for wire in (torch.int8, torch.int32):
                q = K.linear_quantize(x, one, 31, u, wire)
                assert torch.equal(q, K.linear_quantize(x, vec, 31, u, wire, bs))
                a = K.linear_dequantize(q, one, 31, torch.bfloat16)
                assert torch.equal(a.nan_to_num(), K.linear_dequantize(
                    q, vec, 31, torch.bfloat16, bs).nan_to_num())
            for bits in (8, 4):
                c = K.exp_quantize(x, one, 5, 2, bits, u)
                assert torch.equal(c, K.exp_quantize(x, vec, 5, 2, bits, u, bs))
                a = K.exp_dequantize(c, one, 2, bits)
                assert torch.equal(a.nan_to_num(), K.exp_dequantize(c, vec, 2, bits,
                                                                    block_size=bs).nan_to_num())


def test_local_scale_per_block():
    torch.manual_seed(13)
    x = torch.randn(1000).to(torch.bfloat16)
    c = lin(block_size=64)
    want = torch.nn.functional.pad(x.float().abs(), (0, 24)).view(16, 64).amax(1)
    assert c.num_scales(1000) == 16 and torch.equal(c.local_scale(x), want)
    assert torch.equal(c.compress(x).payload["scale"], want)
    assert torch.equal(c.compress(x, scale=5.0).payload["scale"], torch.full((16,), 5.0))
    assert c.config()["block_size"] == 64 and lin().config()["block_size"] is None


def two_point(t, lo, hi):
    """Unbiased rounding of t to lo or hi: (variance, 4th moment) of the error."""
    p = torch.where(hi > lo, (t - lo) / (hi - lo), torch.zeros_like(t))
    return (hi - t) * (t - lo), p * (hi - t) ** 4 + (1 - p) * (t - lo) ** 4


@pytest.mark.parametrize("make", [lambda **k: lin(num_peers=4, **k),
                                  lambda **k: expo(num_peers=4, **k)])
def test_block_unbiased_and_variance(make):
    """16 blocks of 256 values, block j at magnitude 2**-(j) (range 2**15), each quantized
    against its own scale (1.25 x its absmax, as another peer's larger max would make it).
    Per value and per block: mean over 256 draws within 5 sigma (groups of 64 and whole
    blocks); per block the summed squared error equals its exact variance within 5 sigma of
    the estimate (sigma**2 = sum(E[e**4] - Var**2) / draws, the exact 4th moment)."""
    torch.manual_seed(14)
    d, n, bs = 4096, 256, 256
    c = make(block_size=bs, seed=15)
    x = torch.randn(d) * torch.exp2(-torch.arange(16.0)).repeat_interleave(bs)
    scale = c.local_scale(x) * 1.25
    dec = c.decompress(c.compress(x.repeat(n), scale=scale.repeat(n))).reshape(n, d).double()
    s = scale.double().repeat_interleave(bs)
    t = x.double().abs() / s
    if c.name == "global_qsgd":
        lo = torch.floor(t * c.levels) / c.levels
        hi = lo + 1 / c.levels
    else:                                       # every t here is above the last level
        assert (t > 2.0 ** -(c.levels - 1)).all()
        lo = torch.exp2(torch.floor(torch.log2(t)))
        hi = 2 * lo
    var, m4 = two_point(t, lo, hi)
    var, m4 = var * s ** 2, m4 * s ** 4
    for group in (64, bs):
        z = group_z(dec.mean(0), x.double(), var, n, group)
        assert z.abs().max() < 5
    assert 0.5 < (group_z(dec.mean(0), x.double(), var, n) ** 2).mean() < 1.6
    emp = ((dec - x.double()) ** 2).mean(0).reshape(16, bs).sum(1)
    want = var.reshape(16, bs).sum(1)
    sigma = ((m4 - var ** 2).reshape(16, bs).sum(1) / n).sqrt()
    assert ((emp - want).abs() <= 5 * sigma).all(), ((emp - want) / sigma)
    assert (sigma < 0.05 * want).all()          # a tight check, not a vacuous one


@pytest.mark.parametrize("make, none_min, block_max", [
    (lambda **k: lin(**k), 2.0, 0.02),          # 127 levels: measured 4.5-5.4 vs 0.011
    (lambda **k: expo(num_peers=4, bits=4, **k), 5.0, 0.35),   # 5 levels: 12.7-15 vs 0.28
])
def test_block_scales_keep_the_small_half(make, none_min, block_max):
    """x = N(0, 1), its first half x1000. One scale (~3900): the small half sits far below one
    level (step ~31 linear; under the last level 2**-4 exponential) and decodes as dither noise,
    relative error ~ sqrt(E|x| step) = 5 (linear). Blocks of 1024: scale ~3.3 per small block,
    relative error ~ step / sqrt(6) = 0.011 (linear), <= sqrt(1/8) = 0.35 (exponential,
    C_nat)."""
    torch.manual_seed(16)
    x = torch.randn(8192)
    x[:4096] *= 1000
    small = slice(4096, None)
    err = {}
    for bs in (None, 1024):
        c = make(block_size=bs, seed=17)
        y = c.decompress(c.compress(x))
        err[bs] = ((y[small] - x[small]).norm() / x[small].norm()).item()
    assert err[None] > none_min and err[1024] < block_max, err


@pytest.mark.parametrize("make", BLOCKED)
def test_non_finite_stays_in_its_block(make):
    """Peer 0 holds Inf in block 1, peer 1 NaN in block 3 (blocks of 64, 300 values: 5 blocks,
    the last partial): the global scale is Inf there, so both peers and both sums decode
    non-finite exactly in blocks 1 and 3 and finite elsewhere."""
    torch.manual_seed(18)
    c = make(block_size=64, seed=19)
    xs = [torch.randn(300), torch.randn(300)]
    xs[0][70], xs[1][200] = float("inf"), float("nan")
    scale = torch.stack([c.local_scale(x) for x in xs]).amax(0)
    assert torch.isinf(scale).tolist() == [False, True, False, True, False]
    ps = [c.compress(x, scale=scale) for x in xs]
    bad = (torch.arange(300) // 64 == 1) | (torch.arange(300) // 64 == 3)
    for y in (c.decompress(ps[0]), c.decompress(ps[1]), c.reduce(ps),
              c.decompress(c.reduce_packed(ps))):
        assert not torch.isfinite(y[bad]).any() and torch.isfinite(y[~bad]).all()


# -- contract -----------------------------------------------------------------------------
COMPRESSORS = [lambda: lin(num_peers=4), lambda: lin(bits=16), lambda: lin(bits=32),
               lambda: expo(num_peers=4), lambda: expo(num_peers=2, bits=4),
               lambda: lin(num_peers=4, block_size=32), lambda: expo(num_peers=2, block_size=32),
               lambda: expo(num_peers=2, bits=4, block_size=64)]


@pytest.mark.parametrize("make", COMPRESSORS)
@pytest.mark.parametrize("numel", [0, 1, 7, 1001])
def test_wire_bits_and_unflatten(make, numel):
    c = make()
    x = torch.randn(numel)
    p = c.compress(x)
    assert p.wire_bits() == c.wire_bits(numel) == 8 * p.flat().numel()
    scales = 1 if c.block_size is None else -(-numel // c.block_size)   # 1001 / 32: 32
    assert c.wire_bits(numel) == 32 * scales + c.bits * (numel + (numel % 2 if c.bits == 4 else 0))
    q = c.unflatten(p.flat(), x.shape, x.dtype)
    assert torch.equal(c.decompress(q), c.decompress(p))


@pytest.mark.parametrize("make", COMPRESSORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_shapes_and_error_bound(make, dtype):
    torch.manual_seed(10)
    c = make()
    x = torch.randn(3, 5, 7).to(dtype)
    y = c.decompress(c.compress(x))
    assert y.dtype == dtype and y.shape == x.shape
    err = (y.float() - x.float()).abs()
    scale = x.float().abs().max()
    if c.name == "global_qsgd":
        bound = scale / c.levels                             # one level
    else:                                                    # the lower neighbour <= |x|
        bound = torch.maximum(x.float().abs(), scale * 2.0 ** -(c.levels - 1))
    assert (err <= bound + torch.finfo(dtype).eps * (x.float().abs() + bound)).all()


@pytest.mark.parametrize("make", COMPRESSORS)
def test_non_finite_and_zero(make):
    """A non-finite value makes its block's scale Inf: the whole block decodes non-finite
    (here values 0..31 with block_size 32, every value without blocks), the rest stays
    finite (block_size 32: value 32; 64: none)."""
    c = make()
    for bad in (float("inf"), float("-inf"), float("nan")):
        x = torch.randn(33)
        x[5] = bad
        block = torch.arange(33) < (c.block_size or 33)
        assert torch.isinf(c.local_scale(x)[0]) and torch.isfinite(c.local_scale(x)[1:]).all()
        y = c.decompress(c.compress(x))
        assert not torch.isfinite(y[block]).any() and torch.isfinite(y[~block]).all()
        # a non-finite global scale (another peer held Inf/NaN) poisons this peer too
        ps = [c.compress(torch.randn(33), scale=bad) for _ in range(min(2, c.num_peers))]
        assert not torch.isfinite(c.decompress(ps[0])).any()
        assert not torch.isfinite(c.reduce(ps)).any()
        assert not torch.isfinite(c.decompress(c.reduce_packed(ps))).any()
    z = torch.zeros(40, dtype=torch.bfloat16)
    p = c.compress(z)
    assert (p.payload["scale"] == 0).all() and torch.equal(c.decompress(p), z)
    e = c.compress(torch.empty(0, 3))
    empty_scale = c.local_scale(torch.empty(0))       # one 0 (no blocks), or none (blocks)
    assert c.decompress(e).shape == (0, 3) and empty_scale.tolist() == [0.0] * c.num_scales(0)


@pytest.mark.parametrize("make", COMPRESSORS)
def test_state_dict_replays_noise(make):
    c = make()
    x = torch.randn(500)
    c.compress(x)
    state = c.state_dict()
    first = c.compress(x).payload["codes"].clone()
    other = c.fresh()
    other.load_state_dict(state)
    assert torch.equal(other.compress(x).payload["codes"], first)
    assert c.unbiased and c.config()["name"] == c.name


# -- the compiled CPU path (dispatch.COMPILE_ON_CPU) --------------------------------------
def test_compiled_twin_equals_eager():
    """torch.compile'd kernels == eager twin bit for bit (NaN anywhere NaN is), including
    Inf/NaN inputs and zero / Inf scales. Compiling costs ~2-5 s per function."""
    from hfcompress.kernels import dispatch
    mod = dispatch.compiled(K)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6000, generator=g) * torch.exp2(-torch.randint(0, 30, (6000,), generator=g))
    x[:3] = torch.tensor([float("inf"), float("nan"), 0.0])
    u = torch.rand(6000, generator=g)

    def same(a, b):
        if a.is_floating_point():
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        return a.dtype == b.dtype and torch.equal(a, b)

    for s in (1.0, 0.0, float("inf")):
        scale = torch.tensor([s])
        lq = mod.linear_quantize(x, scale, 31, u, torch.int8)
        assert same(lq, K.linear_quantize(x, scale, 31, u, torch.int8))
        assert same(mod.linear_dequantize(lq, scale, 31, torch.bfloat16),
                    K.linear_dequantize(lq, scale, 31, torch.bfloat16))
        eq = mod.exp_quantize(x, scale, 5, 2, 4, u)
        assert same(eq, K.exp_quantize(x, scale, 5, 2, 4, u))
        assert same(mod.exp_dequantize(eq, scale, 2, 4, torch.float32),
                    K.exp_dequantize(eq, scale, 2, 4, torch.float32))
        assert same(mod.exp_combine(eq, eq.flip(0), 4, u), K.exp_combine(eq, eq.flip(0), 4, u))
    # per-block scales (block_size 64: 94 blocks, the last partial)
    scale = torch.rand(94, generator=g).mul_(2.0)
    scale[[3, 50]] = torch.tensor([0.0, float("inf")])
    lq = mod.linear_quantize(x, scale, 31, u, torch.int8, 64)
    assert same(lq, K.linear_quantize(x, scale, 31, u, torch.int8, 64))
    assert same(mod.linear_dequantize(lq, scale, 31, torch.bfloat16, 64),
                K.linear_dequantize(lq, scale, 31, torch.bfloat16, 64))
    eq = mod.exp_quantize(x, scale, 5, 2, 4, u, 64)
    assert same(eq, K.exp_quantize(x, scale, 5, 2, 4, u, 64))
    assert same(mod.exp_dequantize(eq, scale, 2, 4, torch.float32, 64),
                K.exp_dequantize(eq, scale, 2, 4, torch.float32, 64))
