"""LoCo's equations on hand-computed steps (issue 39; LoCo Alg. 1, Eqs. (2)-(7)).

The gradients are dyadic and every group's absmax is 7 (int4 scale 1, qmax 7) or 14 (scale
2), so each quantization, error and average below is exact in float32 and written out by
hand: int4 nearest rounding is ``floor(y + 0.5)`` in level units (LoCo Eq. (1) with the
group's absmax scale).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hfcompress import get_compressor
from hfcompress.config import LoCoSettings, get_config

N = 128    # one group of the int4 quantizer and of the 8-bit error


def vec(*head: float) -> torch.Tensor:
    """``head`` then zeros, N values."""
    return torch.tensor([*head, *[0.0] * (N - len(head))])


def error(loco) -> torch.Tensor | None:
    """The stored e (deq8(e), or e~ itself with ``error_scale=None``); None after a reset."""
    return None if loco.error_codes is None else loco._error(torch.empty(loco.numel))


G = vec(7.0, 0.25, -0.625, 2.375)      # int4: scale 7 / 7 = 1


# -- one process ----------------------------------------------------------------------------
def test_eq5_beta_weights_the_new_error():
    """Eq. (5): e~_{k+1} = (1 - beta) e~_k + beta (h - d); beta = 0.5, float32 error."""
    loco = get_compressor("loco", beta=0.5, reset_every=None, error_scale=None)
    # k = 0: h = g (Eq. (2), e = 0), d = [7, 0, -1, 2], h - d = [0, .25, .375, .375]
    assert torch.equal(loco.decompress(loco.compress(G)), vec(7, 0, -1, 2))
    assert torch.equal(error(loco), vec(0, 0.125, 0.1875, 0.1875))
    loco.step()
    # k = 1: h = [7, .375, -.4375, 2.5625], d = [7, 0, 0, 3], h - d = [0, .375, -.4375, -.4375]
    assert torch.equal(loco.decompress(loco.compress(G)), vec(7, 0, 0, 3))
    assert torch.equal(error(loco), vec(0, 0.25, -0.125, -0.125))


@pytest.mark.parametrize("beta, expected", [(1.0, vec(0, 0.25, 0.375, 0.375)),    # Eq. (4)
                                            (0.2, vec(0, 0.05, 0.075, 0.075)),
                                            (0.0, vec())])
def test_beta_is_the_weight_of_the_new_error(beta, expected):
    """beta = 1 is plain error feedback (Eq. (4)), beta = 0 never stores an error; the default
    0.2 is DeepSpeed's ``err_beta=0.8`` on the *old* error (``err_beta * err + (1 - err_beta)
    * new``)."""
    loco = get_compressor("loco", beta=beta, reset_every=None, error_scale=None)
    loco.compress(G)
    assert torch.allclose(error(loco), expected, rtol=0, atol=1e-8)
    assert LoCoSettings().beta == pytest.approx(1 - 0.8)


def test_reset_at_t_c_zeroes_the_error_and_its_average():
    """Eq. (7) with T_c = 2: e = 0 after k = 0, 2, 4; k = 3 starts from e~ = 0 (the previous
    average is deq8(e): the reset drops the history, as the authors' code does)."""
    loco = get_compressor("loco", beta=0.5, reset_every=2, error_scale=None)
    stored, sent = [], []
    for k in range(5):
        sent.append(loco.decompress(loco.compress(G)))
        loco.step()
        stored.append(error(loco))
    assert [e is None for e in stored] == [True, False, True, False, True]
    assert torch.equal(stored[1], vec(0, 0.125, 0.1875, 0.1875))
    assert torch.equal(stored[3], stored[1])            # not (1 - beta) x the k = 2 average
    assert torch.equal(sent[1], sent[0]) and torch.equal(sent[3], sent[0])
    assert torch.equal(sent[2], vec(7, 0, 0, 3))        # k = 2 compensated with e~ of k = 1


def test_reset_clock_resumes_at_the_same_step():
    """``steps`` is in the state dict: a resumed instance resets after the same k."""
    a = get_compressor("loco", beta=0.5, reset_every=3, error_scale=None)
    for _ in range(2):
        a.compress(G)
        a.step()
    b = a.fresh()
    b.load_state_dict(a.state_dict())
    for k in (2, 3):
        for c in (a, b):
            c.compress(G)
            c.step()
        assert (error(a) is None) == (error(b) is None) == (k % 3 == 0), k
    assert a.steps == b.steps == 4


def test_never_reset_with_reset_every_none():
    loco = get_compressor("loco", reset_every=None)
    for _ in range(3):
        loco.compress(G)
        loco.step()
        assert error(loco) is not None


def test_8bit_error_round_trip():
    """Eq. (7)'s Q8 of e~ = [0, .125, .1875, .1875]: group absmax .1875 is exact, .125 is
    code 85 (84.67 rounded), within absmax / 254 of e~; a fixed s_e = 16 stores the dyadic
    values exactly and saturates beyond 127 / s_e."""
    loco = get_compressor("loco", beta=0.5, reset_every=None)
    loco.compress(G)
    e_avg = vec(0, 0.125, 0.1875, 0.1875)
    e = error(loco)
    step = 0.1875 / 127
    assert e[2] == e[3] == 0.1875 and e[1] == torch.tensor(85 * step)
    assert (e - e_avg).abs().max() <= step / 2
    assert loco.error_codes.dtype == torch.uint8 and loco.error_scales.numel() == 1

    fixed = get_compressor("loco", beta=0.5, reset_every=None, error_scale=16.0)
    fixed.compress(G)
    assert torch.equal(fixed.error_codes[:4], torch.tensor([0, 2, 3, 3], dtype=torch.int8))
    assert torch.equal(error(fixed), e_avg)
    big = get_compressor("loco", beta=1.0, reset_every=None, error_scale=16.0)
    big.compress(vec(7000.0, 499.0))              # scale 1000: h - d = 499 > 127 / 16
    assert error(big)[1] == 127 / 16


def test_float32_error_state_round_trip():
    """``error_scale=None`` (Table 9 LoCo4) keeps e~ in float32, 4 bytes per value, and
    refuses a state saved with 8-bit codes."""
    loco = get_compressor("loco", error_scale=None, reset_every=None)
    loco.compress(G)
    assert loco.state_bytes() == loco.state_bytes_for(N, torch.float32) == {"errors": 4 * N}
    again = loco.fresh()
    again.load_state_dict(loco.state_dict())
    assert torch.equal(error(again), error(loco))
    grouped = get_compressor("loco")
    grouped.compress(G)
    with pytest.raises(ValueError, match="different error_scale"):
        loco.fresh().load_state_dict(grouped.state_dict())
    with pytest.raises(ValueError, match="reset_every"):
        get_compressor("loco", reset_every=0)


def test_optimizer_wrap_steps_the_clock_once_per_step():
    """LoCo 4.2: the wrapped AdamW steps the handle once per ``step()`` (the reset clock
    counts optimizer steps, not compresses)."""
    from hfcompress.optim import LoCoAdamW

    class Handle:
        steps = 0

        def step(self):
            self.steps += 1

    p = torch.nn.Parameter(torch.ones(3))
    opt = LoCoAdamW([p], compression=Handle(), lr=0.1)
    for _ in range(3):
        p.grad = torch.ones(3)
        opt.step()
    assert opt.compression.steps == 3


def test_ablation_variants_are_table_9_rows():
    """``bench_loss.py --loco-ablation``: the ``loco`` variant is the ``loco`` preset itself,
    ``loco_beta05`` the same with beta 0.5."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_loss

    loco = bench_loss.ablation_config("loco:int4g128")
    assert loco.loco == get_config("loco").loco
    assert loco.grad_inter == loco.grad_intra == get_config("loco").grad_inter
    assert bench_loss.ablation_config("no_feedback:int2g128").loco is None
    assert bench_loss.ablation_config("ef:int2g128").loco == LoCoSettings(1.0, None, None)
    assert bench_loss.ablation_config("ef:int2g128").grad_inter.params["bits"] == 2
    assert bench_loss.ablation_config("loco_beta05:int4g128").loco == LoCoSettings(0.5, 512,
                                                                                    "group")
    jobs = [p for p, _, _ in bench_loss.ablation_jobs(["int4g128"], [0, 1], 1e-3)]
    assert jobs[:3] == ["none", "no_feedback:int4g128", "loco:int4g128"] and len(jobs) == 14
    assert bench_loss.ablation_jobs(["int2g128"], [0], 1e-3, ["ef"]) == [("ef:int2g128", 0, 1e-3)]


# -- the 2-hop reduce-scatter on 4 gloo processes (2 nodes x 2 ranks) -----------------------
#: per step k: (the output every rank gets, e~ of every intra-node stream, e~ of every
#: inter-node stream, None after a reset); beta 0.5, T_c = 3, float32 errors (see the worker)
HOPS = [(vec(28, 0, 4), None, None),
        (vec(28, 0, 4), vec(0, 0.125), vec(0, 0, -0.5)),
        (vec(28, 0, 0), vec(0, 0.25), vec()),
        (vec(28, 4, 4), None, None),
        (vec(28, 0, 4), vec(0, 0.125), vec(0, 0, -0.5))]


def _hops_worker(rank, world):
    """Every row of rank r's input is g_r = [7, .25, c_r] (c = 1 on local rank 0, else 0).
    Hop 1 sends int4(g_r + e1): error .25 on value 1; the node's partial sum [14, 0, 1] is
    sent as int4 with scale 2 (h2 = [14, 0, 1] + e2): error -1 on value 2 at k = 0. Hand
    steps (h, d, e~):
      k=0: e1 = e2 = 0: out 2 x [14, 0, 2]; then reset (0 % 3 == 0)
      k=1: the same; e1 = [0, .125], e2 = [0, 0, -.5]
      k=2: h1 = [7, .375] -> d1 = [7, 0]: e1 = .5 (.125) + .5 (.375) = .25; h2 = [14, 0, .5]
           -> d2 = [14, 0, 0]: e2 = .5 (-.5) + .5 (.5) = 0; out [28, 0, 0]
      k=3: h1 = [7, .5] -> d1 = [7, 1]; h2 = [14, 2, 1] -> d2 = [14, 2, 2]: out [28, 4, 4];
           then reset (3 % 3 == 0) on every rank
      k=4: as k=1 (after a save / load at k=2: the resumed collective, bit for bit)."""
    from hfcompress.comm import Topology, TwoHopReduceScatter
    from hfcompress.integrations.handle import step_error_feedback

    settings = LoCoSettings(beta=0.5, reset_every=3, error_scale=None)
    int4 = get_config("loco").grad_inter

    def build():
        return TwoHopReduceScatter(Topology(ranks_per_node=2), settings.wrap(int4.build()),
                                   settings.wrap(int4.build()))

    g = vec(7.0, 0.25, 1.0 if rank % 2 == 0 else 0.0).repeat(world)
    coll, seen = build(), []
    for k in range(len(HOPS)):
        if k == 2:                                  # resume from a checkpoint of k = 0, 1
            state = coll.state_dict()
            coll = build()
            coll.load_state_dict(state)
        out = torch.empty(N)
        coll(out, g.clone())
        step_error_feedback(coll.compressors())
        seen.append((out, *({hop: [error(c) for c in s.instances() if c.numel is not None]
                             for hop, s in coll.streams.items()}[hop]
                            for hop in ("intra", "inter"))))
    return seen


@pytest.fixture(scope="module")
def hops_run():
    from dist_utils import run_distributed
    return run_distributed(_hops_worker, 4)


def test_two_hop_errors_per_hop_on_hand_computed_steps(hops_run):
    """Each hop's instances hold the error of what they sent (hop 1: a rank's rows; hop 2:
    the node's partial sums), averaged by Eq. (5) and reset after the same k on every rank,
    also across a save / load."""
    for rank, seen in enumerate(hops_run):
        for k, ((out, intra, inter), (want, want_intra, want_inter)) in enumerate(
                zip(seen, HOPS)):
            assert torch.equal(out, want), (rank, k, out[:4])
            assert len(intra) == 2 and len(inter) == 2, (rank, k)    # X parts, Y rows
            for got, exp in ((intra, want_intra), (inter, want_inter)):
                for e in got:
                    assert (e is None) == (exp is None), (rank, k)
                    rows = None if e is None else e.view(-1, N)   # hop 1: one per node
                    assert e is None or torch.equal(rows, exp.expand_as(rows)), (rank, k, e)
