"""Kernels reading and writing runs of one length equally spaced in place (a root unit's
embedding and LM head around its final norm: ``compressors/runs.py``'s strided view,
``kernels/triton_tiles.spaced_runs``): each equals its torch twin on a contiguous copy bit
for bit, and leaves the values between the runs as they were."""

from __future__ import annotations

import pytest
import torch

from hfcompress.kernels import group_quant as twin_gq
from hfcompress.kernels import hadamard as twin_hd
from hfcompress.kernels import triton_dequantize_sum as tri_dsum
from hfcompress.kernels import triton_group_quant as tri_gq
from hfcompress.kernels import triton_hadamard as tri_hd
from hfcompress.kernels.triton_tiles import spaced_runs

GS, GAP, E = 128, 64, 6
#: a run: one interpreted program's values (``triton_group_quant.BLOCK_ELEMS``), or two
L = tri_gq.BLOCK_ELEMS


def _values(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.logspace(-2, 1, shape[-1])).to(dtype)


def _spaced(rows: int, count: int, length: int, seed: int = 0, dtype=torch.float32,
            fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer [rows, count * (length + GAP)], its runs as a view [rows, count, length])``:
    ``count`` runs of ``length`` values, ``GAP`` values (``fill``) after each."""
    buf = torch.full((rows, count * (length + GAP)), fill, dtype=dtype)
    runs = buf.as_strided((rows, count, length), (buf.stride(0), length + GAP, 1))
    runs.copy_(_values(rows, count, length, seed=seed, dtype=dtype))
    return buf, runs


def _keys(rows: int) -> torch.Tensor:
    return torch.arange(2 * rows, dtype=torch.int64).view(rows, 2) * 7919 + 11


def test_spaced_runs_reads_the_view():
    buf, runs = _spaced(2, 3, 256)
    assert spaced_runs(runs, 2, 128) == (2, GAP)          # programs a run, values between
    assert spaced_runs(runs[:1], 1, 256) == (1, GAP) and spaced_runs(runs[0], 1, 128)
    assert spaced_runs(runs, 2, 512) is None              # a program would straddle two runs
    assert spaced_runs(runs, 1, 128) is None               # two rows are not one
    assert spaced_runs(buf, 2, 128) is None                # plain rows
    assert spaced_runs(runs.contiguous(), 2, 128) is None  # no gap


@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("length", [L, 2 * L])
def test_difference_row_reads_spaced_runs(stochastic, length):
    """qWD's difference row of a root slot's compressed columns, read where they lie."""
    _, x = _spaced(1, 2, length, seed=1)
    ref = _values(2, length, seed=2)
    tail = _values(1, E, seed=3, dtype=torch.bfloat16)
    noise = _keys(1) if stochastic else None
    copy, _, (_, _, _, kw) = tri_gq._row_plan(x[0], ref, 1, 4, GS, noise, tail)
    assert kw["RUNS"] and not copy
    got = tri_gq.quantize_difference_row(x[0], ref, 4, GS, noise, tail)
    want = twin_gq.quantize_difference_row(x[0].contiguous(), ref, 4, GS, noise, tail)
    assert torch.equal(got, want)


@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_rows_reads_spaced_runs(stochastic):
    """Rows of a reduce-scatter input whose compressed columns are spaced runs."""
    _, x = _spaced(2, 2, L, seed=4)
    tail = _values(2, E, seed=5)
    noise = _keys(2) if stochastic else None
    copy, _, (_, _, _, kw) = tri_gq._row_plan(x, None, 2, 4, GS, noise, tail)
    assert kw["RUNS"] and kw["XROWS"] and not copy
    got = tri_gq.quantize_rows(x, 2, 4, GS, noise, tail)
    assert torch.equal(got, twin_gq.quantize_rows(x.reshape(2, -1), 2, 4, GS, noise, tail))


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_add_writes_spaced_runs(rows, dtype):
    """qWD's decode writes the new references into the output's spaced columns too; the
    columns between the runs (the exact ones) keep their values."""
    wire = twin_gq.quantize_rows(_values(rows, 2 * L, seed=6), rows, 4, GS, None, None)
    ref = _values(rows * 2 * L, seed=7, dtype=dtype)
    outs = []
    for mod in (tri_gq, twin_gq):
        buf, also = _spaced(rows, 2, L, dtype=dtype, fill=-7.0)
        if mod is tri_gq:
            _, second, _, _, kw = tri_gq._add_plan(wire, L, 4, GS, ref, also, None)
            assert second and kw["RUNS"]
        got = mod.dequantize_add_wire(wire, L, 4, GS, ref.clone(), also)
        outs.append((got, buf))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    gaps = outs[0][1].view(rows, 2, L + GAP)[:, :, L:]
    assert torch.equal(gaps, torch.full_like(gaps, -7.0))
    assert torch.equal(outs[0][1].view(rows, 2, L + GAP)[:, :, :L].reshape(-1), outs[0][0])


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("stochastic", [False, True])
def test_hadamard_quantize_rows_reads_spaced_runs(rows, stochastic):
    """SDP4Bit's gradient rows (Hadamard-32 then int4) of a root unit's compressed columns,
    read where they lie (``triton_hadamard.BLOCK_ELEMS``-value programs)."""
    _, x = _spaced(rows, 2, tri_hd.BLOCK_ELEMS, seed=8)
    tail = _values(rows, E, seed=9, dtype=torch.bfloat16)
    noise = _keys(rows) if stochastic else None
    copy, _, (_, _, _, kw) = tri_hd._row_plan(x, rows, 4, GS, 32, noise, tail)
    assert kw["RUNS"] and not copy
    got = tri_hd.quantize_rows(x, rows, 4, GS, 32, noise, tail)
    want = twin_hd.quantize_rows(x.reshape(rows, -1), rows, 4, GS, 32, noise, tail)
    assert torch.equal(got, want)


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("dtype, post", [(torch.float32, None), (torch.bfloat16, ("div", 2.0))])
def test_decode_sum_writes_spaced_runs(hadamard, dtype, post):
    """The reduce-scatter's decode-sum writes a root unit's compressed gradient columns in
    place (``triton_dequantize_sum.BLOCK_ELEMS``-value programs), riders summed beside;
    the columns between the runs keep their values."""
    n = 2 * tri_dsum.BLOCK_ELEMS
    x = _values(2, n, seed=10)
    tail = _values(2, E, seed=11, dtype=dtype)
    wire = twin_hd.quantize_rows(x, 2, 4, GS, 32, None, tail) if hadamard else \
        twin_gq.quantize_rows(x, 2, 4, GS, None, tail)
    outs = []
    for mod in ((tri_hd, twin_hd) if hadamard else (tri_gq, twin_gq)):
        buf, out = _spaced(1, 2, n // 2, dtype=dtype, fill=-7.0)
        riders = torch.empty(E, dtype=dtype)
        args = (wire, n // 2, n // GS, 4, GS) + ((32, True) if hadamard else ())
        mod.dequantize_sum_wire(*args, out=out[0], post=post, riders=(riders, dtype, post))
        outs.append((buf, riders))
    plan = tri_dsum._wire_plan(wire, n // 2, n // GS, 4, GS, dtype, 32 if hadamard else 1,
                               hadamard, False, _spaced(1, 2, n // 2, dtype=dtype)[1][0], post,
                               None)
    assert plan[1][3]["RUNS"]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    gaps = outs[0][0].view(2, n // 2 + GAP)[:, n // 2:]
    assert torch.equal(gaps, torch.full_like(gaps, -7.0))


# -- the collectives, over 2 gloo ranks as 2 nodes ---------------------------------------------
RUNS = ((0, L), (L + GAP, 2 * L + GAP))     # a root unit's compressed columns: S = 2 (L + GAP)


def _collectives(rank: int, world: int, backend: str) -> list[torch.Tensor]:
    """qWD's all-gather of a slot whose compressed columns are ``RUNS`` (three calls: the
    exact first, then differences) and a Hadamard reduce-scatter of such rows, each fed
    the spaced views and, beside it, a contiguous copy: the gathered rows and reduced
    output of each (the spaced ones whole, the other columns included)."""
    from hfcompress import get_compressor
    from hfcompress.comm import QuantizedAllGather, Topology, TwoHopReduceScatter
    from hfcompress.compressors.runs import take, view
    topo, s = Topology(ranks_per_node=1), 2 * (L + GAP)
    inner = lambda: get_compressor("int", bits=4, group_size=2048,  # noqa: E731
                                   rounding="nearest", backend=backend)
    spaced_ag, plain_ag = (QuantizedAllGather(get_compressor("qwd", inner=inner()), topo)
                           for _ in range(2))
    out = []
    for step in range(3):
        slot = _values(world, s, seed=20 + step)[rank]
        rows = torch.full((world, s), -1.0)
        spaced_ag(rows, view(slot, RUNS, spaced=True), columns=RUNS)
        plain = torch.empty(world, 2 * L)
        plain_ag(plain, take(slot.view(1, -1), RUNS)[0])
        out += [rows, plain]
    hadamard = get_compressor("hadamard", bits=4, group_size=GS, hadamard_size=32,
                              rounding="nearest", backend=backend)
    grads = _values(world, s, seed=30) * (rank + 1)
    flat = torch.full((s,), -1.0)
    TwoHopReduceScatter(topo, None, hadamard)(view(flat, RUNS, spaced=True),
                                              view(grads, RUNS, spaced=True))
    plain = torch.empty(2 * L)
    TwoHopReduceScatter(topo, None, hadamard)(plain, take(grads, RUNS))
    return out + [flat, plain]


def spaced_worker(rank: int, world: int) -> list[torch.Tensor]:
    return [t for backend in ("torch", "triton") for t in _collectives(rank, world, backend)]


def test_collectives_read_and_write_spaced_runs_in_place():
    """The all-gather's slots land in their spaced columns and the reduce-scatter's sum in
    its spaced output, as from contiguous copies, the Triton kernels (interpreted) bit for
    bit the torch twins; the columns between the runs keep their values."""
    from dist_utils import run_distributed
    from hfcompress.compressors.runs import take
    for got in run_distributed(spaced_worker, 2):
        torch_side, triton_side = got[:8], got[8:]
        for side in (torch_side, triton_side):
            for spaced, plain in zip(side[0::2], side[1::2]):
                flat = spaced.view(-1, 2 * (L + GAP))
                assert torch.equal(take(flat, RUNS).view(plain.shape), plain)
                gaps = flat.view(-1, 2, L + GAP)[:, :, L:]
                assert torch.equal(gaps, torch.full_like(gaps, -1.0))
        for a, b in zip(torch_side, triton_side):
            assert torch.equal(a, b)
