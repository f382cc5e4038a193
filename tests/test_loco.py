"""LoCo error feedback (LoCo Alg. 1, sections 3.1-3.3)."""

import dataclasses
import io

import pytest
import torch

from hfcompress import get_compressor, kernels
from hfcompress.compressors.loco import LoCo

FIXED = 2.0 ** 17  # a paper-style fixed error scale s_e (Sec. 3.2: s_e = 4s..6s)
SCALES = ["group", FIXED]


def _grads(steps, n, seed=0, sigma=1e-3):
    gen = torch.Generator().manual_seed(seed)
    mu = 0.2 * sigma * torch.randn(n, generator=gen)
    return [mu + sigma * torch.randn(n, generator=gen) for _ in range(steps)]


# -- a plain reference of Alg. 1 ---------------------------------------------------------
def _absmax_quant(x, bits, group):
    """Symmetric absmax group quantization, nearest rounding, dequantized to float32: the
    eager torch twin of the kernels (their numbers are specified and tested elsewhere)."""
    n = x.numel()
    codes, scales = kernels.quantize_groups(torch.nn.functional.pad(x, (0, -n % group)), bits,
                                            group, backend="torch")
    return kernels.dequantize_groups(codes, scales, bits, group, backend="torch")[:n]


def _reference_loco(grads, beta, reset_every, error_scale):
    """Alg. 1 line by line; compressor(h; s, 4) is int4 absmax per 128, e is 8 bit."""
    e = torch.zeros_like(grads[0])                      # deq8(e_k); e~_k is deq8(e_k)
    sent = []
    for k, g in enumerate(grads):
        h = g + e                                       # line 4
        d = _absmax_quant(h, 4, 128)                    # lines 5 and 7
        e_avg = (1 - beta) * e + beta * (h - d)         # line 8
        if k % reset_every == 0:                        # lines 9-10
            e = torch.zeros_like(e)
        elif error_scale == "group":                    # line 12
            e = _absmax_quant(e_avg, 8, 128)
        else:
            e = torch.round(e_avg * error_scale).clamp(-127, 127) / error_scale
        sent.append(d)                                  # line 15 (one node)
    return sent


@pytest.mark.parametrize("error_scale", SCALES)
@pytest.mark.parametrize("beta", [0.2, 0.7])
def test_matches_plain_algorithm_1(error_scale, beta):
    grads = _grads(13, 1000)
    ref = _reference_loco(grads, beta, 5, error_scale)  # resets after k = 0, 5, 10
    loco = get_compressor("loco", beta=beta, reset_every=5, error_scale=error_scale)
    for k, g in enumerate(grads):
        out = loco.decompress(loco.compress(g))
        loco.step()
        assert torch.equal(out, ref[k]), k


def test_defaults():
    loco = get_compressor("loco")
    assert loco.beta == 0.2 and loco.reset_every == 512 and loco.error_scale == "group"
    assert loco.inner.config() == get_compressor("int", bits=4, group_size=128,
                                                 rounding="nearest").config()
    assert loco.stateful and not loco.unbiased


@pytest.mark.parametrize("error_scale", SCALES)
def test_reset_every_t_c_steps_exactly(error_scale):
    """The error made in iteration k is dropped iff k % T_c == 0: iteration k + 1 then
    sends exactly inner(g), with no feedback."""
    t_c, grads = 4, _grads(14, 700, seed=1)
    loco = get_compressor("loco", reset_every=t_c, error_scale=error_scale)
    plain = get_compressor("int")
    for k, g in enumerate(grads):
        p = loco.compress(g)
        if k == 0 or (k - 1) % t_c == 0:
            assert torch.equal(p.flat(), plain.compress(g).flat()), k
        else:
            assert not torch.equal(p.flat(), plain.compress(g).flat()), k
        loco.step()
        assert ("error_codes" in loco.state_dict()) == (k % t_c != 0), k
    assert loco.steps == len(grads)


@pytest.mark.parametrize("numel", [1, 1000, 4096])
def test_error_stored_in_8_bits(numel):
    g = _grads(1, numel)[0]
    loco = get_compressor("loco")
    loco.compress(g)
    st = loco.state_dict()
    groups = -(-numel // 128)
    assert st["error_codes"].dtype == torch.uint8 and st["error_codes"].numel() == groups * 128
    assert st["error_scales"].dtype == torch.float32 and st["error_scales"].numel() == groups
    fixed = get_compressor("loco", error_scale=FIXED)
    fixed.compress(g)
    st = fixed.state_dict()
    assert st["error_codes"].dtype == torch.int8 and st["error_codes"].numel() == numel
    assert "error_scales" not in st
    # nothing else of the error's size is kept on the instance
    assert not any(isinstance(v, torch.Tensor) and v.numel() >= numel and v.element_size() > 1
                   for v in vars(fixed).values())


@pytest.mark.parametrize("error_scale", SCALES)
def test_time_average_tracks_true_average(error_scale):
    """200 steps of g = mu + noise (sigma 1e-3, int4 group 128 nearest): the error of the summed
    compressed gradients, relative to the summed true gradients, is 0.040 without feedback and
    0.0056 (group) / 0.0066 (fixed 2^17) with LoCo (beta 0.2); it is bounded by |e_K| / beta
    instead of growing with K. Deterministic (fixed seeds); asserted ratio < 0.3."""
    grads = _grads(200, 4096)
    loco = get_compressor("loco", error_scale=error_scale)
    plain = get_compressor("int")
    total = torch.stack(grads).sum(0)
    s_loco, s_plain = torch.zeros(4096), torch.zeros(4096)
    for g in grads:
        s_loco += loco.decompress(loco.compress(g))
        loco.step()
        s_plain += plain.decompress(plain.compress(g))
    err_loco = ((s_loco - total).norm() / total.norm()).item()
    err_plain = ((s_plain - total).norm() / total.norm()).item()
    assert err_loco < 0.3 * err_plain, (err_loco, err_plain)


@pytest.mark.parametrize("numel", [0, 1, 129, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_wire_bits_dtypes_and_sizes(numel, dtype):
    inner = get_compressor("int", bits=4, group_size=128)
    loco = LoCo(inner=inner)
    g = _grads(1, numel, sigma=1.0)[0].to(dtype).reshape(-1, 1)
    p = loco.compress(g)
    assert p.wire_bits() == loco.wire_bits(numel) == inner.wire_bits(numel)
    assert p.wire_bits() == 8 * p.flat().numel()
    out = loco.decompress(loco.unflatten(p.flat(), g.shape, dtype))
    assert out.dtype == dtype and out.shape == g.shape
    assert torch.equal(out, inner.decompress(p))
    # first step has no feedback: same payload as the inner on the (float32) gradient
    assert torch.equal(p.flat(), inner.compress(g.float()).flat())


def test_reduce_is_the_inner_sum():
    loco = get_compressor("loco")
    packeds = [loco.fresh().compress(g) for g in _grads(3, 300)]
    assert torch.equal(loco.reduce(packeds), loco.inner.reduce(packeds))


def test_non_finite_gradient_does_not_poison_the_error():
    loco = get_compressor("loco")
    g = _grads(2, 1000)
    bad = g[0].clone()
    bad[3] = float("nan")
    out = loco.decompress(loco.compress(bad))
    assert torch.isnan(out[:128]).all() and torch.isfinite(out[128:]).all()
    assert torch.isfinite(loco.state_dict()["error_scales"]).all()
    loco.step()  # k = 0: reset anyway; check a later step too
    loco.compress(g[1])
    loco.step()
    bad = g[1].clone()
    bad[700] = float("inf")
    assert not torch.isfinite(loco.decompress(loco.compress(bad))[700])
    assert torch.isfinite(loco.state_dict()["error_scales"]).all()
    assert torch.isfinite(loco.decompress(loco.compress(g[0]))).all()


@pytest.mark.parametrize("error_scale", SCALES)
def test_state_dict_round_trip_continues_identically(error_scale):
    inner = get_compressor("int", rounding="stochastic", seed=3)
    a = LoCo(inner=inner, reset_every=6, error_scale=error_scale)
    grads = _grads(14, 900, seed=4)
    for g in grads[:7]:
        a.compress(g)
        a.step()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = a.fresh()
    b.load_state_dict(torch.load(buf, weights_only=True))
    for g in grads[7:]:  # crosses the reset after k = 12
        assert torch.equal(a.compress(g).flat(), b.compress(g).flat())
        a.step()
        b.step()
    assert a.steps == b.steps == 14


def test_bad_parameters():
    for kwargs, match in [({"beta": 1.5}, "beta"), ({"beta": "x"}, "beta"),
                          ({"reset_every": 0}, "reset_every"),
                          ({"reset_every": 2.5}, "reset_every"),
                          ({"error_scale": "row"}, "error_scale"),
                          ({"error_scale": -1.0}, "error_scale"), ({"inner": 5}, "inner")]:
        with pytest.raises(ValueError, match=match):
            LoCo(**kwargs)
    loco = get_compressor("loco")
    loco.compress(torch.zeros(10))
    with pytest.raises(ValueError, match="fresh"):
        loco.compress(torch.zeros(11))
    with pytest.raises(ValueError, match="error_scale"):
        get_compressor("loco", error_scale=FIXED).load_state_dict(loco.state_dict())


# -- the ``loco`` preset on the 2-hop reduce-scatter (LoCo 3.3, LoCo-Zero++ 5.2) ------------
S = 300     # values per rank: not a multiple of LoCo's groups of 128


def _step_inputs(world, steps, rank):
    """Every rank's reduce-scatter input per step: g = mu + noise, the rank's own mu."""
    return [g.reshape(world * S) for g in _grads(steps, world * S, seed=rank, sigma=1.0)]


def _run(collective, inputs):
    """One call per step, then the optimizer step's reset clock (``Compression.step``)."""
    from hfcompress.integrations.handle import step_error_feedback

    outs = []
    for x in inputs:
        out = torch.empty(S)
        collective(out, x.clone())
        step_error_feedback(collective.compressors())
        outs.append(out)
    return outs


def _loco_worker(rank, world):
    import torch.distributed as dist

    from hfcompress.comm import Topology, TwoHopReduceScatter, WireMeter
    from hfcompress.config import LoCoSettings, get_config
    from hfcompress.cost.state import estimate_state_bytes
    from hfcompress.integrations.fsdp import gradient_collective

    res = {}
    short = LoCoSettings(reset_every=3)          # crosses the resets after steps 0 and 3
    new = dataclasses.replace(get_config("loco"), loco=short)
    old = dataclasses.replace(new, grad_intra=None, two_hop=False)    # loco before: 1-hop
    inputs = _step_inputs(world, 6, rank)
    build = lambda cfg, topo: gradient_collective(cfg, topo, WireMeter(), 0, rank, 0)  # noqa
    one = Topology(ranks_per_node=1)
    a, b = build(old, one), build(new, one)
    res["x1_kinds"] = (type(a).__name__, type(b).__name__)
    res["x1_equal"] = [torch.equal(p, q) for p, q in zip(_run(a, inputs), _run(b, inputs))]

    two = Topology(ranks_per_node=2)             # 2 nodes x 2 ranks
    c = build(new, two)
    _run(c, inputs[:2])
    state = c.state_dict()
    res["x2_errors"] = {hop: sum("error_codes" in s for s in st["streams"].values())
                        for hop, st in state.items()}    # a stream per destination row
    res["x2_state_bytes"] = c.state_bytes()["errors"]
    res["x2_estimate"] = estimate_state_bytes(new, [S], world, 2, torch.float32)["errors"]
    again = build(new, two)
    again.load_state_dict(state)
    res["x2_resumed"] = [torch.equal(p, q)
                         for p, q in zip(_run(c, inputs[2:]), _run(again, inputs[2:]))]

    # the time average at 2 x 2: the summed outputs vs the exact sum, with error feedback on
    # no hop, on the first hop only, and on both
    steps = 60
    inputs = _step_inputs(world, steps, 100 + rank)
    exact = torch.zeros(S)
    for x in inputs:
        out = torch.empty(S)
        dist.reduce_scatter_tensor(out, x.clone())
        exact += out
    loco, int4 = LoCoSettings(), lambda: get_compressor("int")             # noqa: E731
    errs = {}
    for label, intra, inter in (("none", int4(), int4()), ("first", loco.wrap(int4()), int4()),
                                ("both", loco.wrap(int4()), loco.wrap(int4()))):
        total = torch.stack(_run(TwoHopReduceScatter(two, intra, inter), inputs)).sum(0)
        errs[label] = ((total - exact).norm() / exact.norm()).item()
    res["x2_time_average"] = errs
    return res


@pytest.fixture(scope="module")
def loco_run():
    from dist_utils import run_distributed
    return run_distributed(_loco_worker, 4)


def test_loco_at_one_rank_per_node_is_the_1_hop_loco_bit_for_bit(loco_run):
    """With one rank per node the 2-hop ``loco`` runs only its inter-node hop, with LoCo on
    it: the numbers of the former 1-hop preset, step after step, across error resets."""
    for r in loco_run:
        assert r["x1_kinds"] == ("QuantizedReduceScatter", "TwoHopReduceScatter")
        assert r["x1_equal"] == [True] * 6, r["x1_equal"]


def test_loco_feeds_back_the_error_of_both_hops_and_checkpoints_it(loco_run):
    """2 nodes x 2 ranks: LoCo wraps the intra-node hop (X rows per rank) and the inter-node
    hop (Y partial sums per rank, as the authors' LoCo-Zero++); the errors of both are in the
    state dict (a fresh collective that loads it continues bit for bit) and in the memory
    estimate, which equals the measured state."""
    for r in loco_run:
        assert r["x2_errors"] == {"intra": 2, "inter": 2}
        assert r["x2_state_bytes"] == r["x2_estimate"] > 0
        assert r["x2_resumed"] == [True] * 4, r["x2_resumed"]


def test_error_feedback_on_the_second_hop_keeps_the_time_average(loco_run):
    """60 steps of g = mu + noise at 2 x 2 (int4 nearest, group 128): the summed outputs'
    error relative to the exact sum is 0.103 without feedback, 0.073 with it on the first hop
    only (the partial sums' 4-bit error accumulates) and 0.024 with it on both hops (LoCo 3.2,
    Eq. 6: bounded instead of growing). Deterministic; asserted both < 0.5 x first."""
    errs = loco_run[0]["x2_time_average"]
    assert errs["both"] < 0.5 * errs["first"] and errs["first"] < errs["none"], errs


def test_loco_inter_node_bytes_per_node():
    """Declared traffic (``comm/traffic.py``) of one reduce-scatter of S values per rank,
    per node: the 2-hop ``loco`` sends X x (Y - 1) int4 rows, X times less than the 1-hop
    all-to-all's X^2 (Y - 1); equal to it at X = 1."""
    from hfcompress.comm import QuantizedReduceScatter, TwoHopReduceScatter
    from hfcompress.comm.traffic import sent
    from hfcompress.config import get_config

    cfg, n = get_config("loco"), 128 * 1024
    int4 = cfg.grad_inter.build()
    for x in (1, 2, 8):
        for y in (2, 4):
            new = x * sent(TwoHopReduceScatter.traffic(n, x, y, int4, int4, 4), x, y)[1]
            old = x * sent(QuantizedReduceScatter.traffic(n, x, y, int4, 4), x, y)[1]
            exact = x * sent(QuantizedReduceScatter.traffic(n, x, y, None, 4), x, y)[1]
            assert new == x * (y - 1) * n * 4.25 / 8 and old == x * new, (x, y)
            assert exact / new == pytest.approx(x * 32 / 4.25), (x, y)
