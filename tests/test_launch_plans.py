"""``kernels/launch_plans.py``: the hot kernel wrappers plan a launch once per call
signature and reuse it. Calls of two signatures in turn (a plan reused after another was
made) each equal the torch twin bit for bit; one plan per signature; operands that differ
only in what a plan may depend on (row stride, start alignment, riders, dtype) get plans of
their own."""

from __future__ import annotations

import pytest
import torch

from hfcompress.kernels import group_quant as twin_gq
from hfcompress.kernels import hadamard as twin_hd
from hfcompress.kernels import triton_dequantize_sum as tri_dsum
from hfcompress.kernels import triton_group_quant as tri_gq
from hfcompress.kernels import triton_hadamard as tri_hd
from hfcompress.kernels.launch_plans import LaunchPlans, signature

ROWS, S, E, GS = 2, 256, 6, 128


def _values(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.logspace(-2, 1, shape[-1])).to(dtype)


def _in_wider(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``x``'s values as the columns ``offset:`` of wider rows (a strided view; ``offset``
    1: a start 4 bytes past a 16-byte boundary)."""
    wide = torch.zeros(x.shape[0], x.shape[1] + 16, dtype=x.dtype)
    wide[:, offset:offset + x.shape[1]] = x
    return wide[:, offset:offset + x.shape[1]]


def _keys(rows: int) -> torch.Tensor:
    return torch.arange(2 * rows, dtype=torch.int64).view(rows, 2) * 7919 + 11


def test_a_plan_is_built_once_per_key_and_the_cache_is_bounded():
    built = []
    plans = LaunchPlans(lambda *a: built.append(a) or (None if a[0] == "none" else len(built)),
                        limit=3)
    assert plans("a", "a") == 1 and plans("a", "a") == 1
    assert plans("none", "none") is None and plans("none", "none") is None   # None is a plan
    assert len(built) == 2
    plans("b", "b")
    plans("c", "c")       # full: dropped, then rebuilt
    assert plans("a", "a") == 5 and len(built) == 5


def test_signature_tells_apart_what_a_plan_reads():
    x = torch.zeros(4, 64)
    assert signature(x) == signature(torch.ones(4, 64))
    assert signature(x) != signature(x.t())
    assert signature(x) != signature(x.to(torch.bfloat16))
    assert signature(x.view(-1)[4:]) != signature(x.view(-1)[8:])   # 16 vs 32 bytes in
    assert signature(None) is None


def _variants():
    """(x rows, tail) of three signatures: contiguous; strided rows read in place with
    bfloat16 riders; a misaligned start (read flat) with float32 riders."""
    x = _values(ROWS, S)
    return [(x, None),
            (_in_wider(x, 0), _values(ROWS, E, seed=1, dtype=torch.bfloat16)),
            (_in_wider(x, 1), _values(ROWS, E, seed=2))]


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantize_rows_plans_equal_the_twin(hadamard, stochastic):
    plans = tri_hd._row_plans if hadamard else tri_gq._row_plans
    before = len(plans._plans)
    variants = _variants()
    for x, tail in variants + variants:
        noise = _keys(ROWS) if stochastic else None
        if hadamard:
            got = tri_hd.quantize_rows(x, ROWS, 4, GS, 32, noise, tail)
            want = twin_hd.quantize_rows(x, ROWS, 4, GS, 32, noise, tail)
        else:
            got = tri_gq.quantize_rows(x, ROWS, 4, GS, noise, tail)
            want = twin_gq.quantize_rows(x, ROWS, 4, GS, noise, tail)
        assert torch.equal(got, want)
    assert len(plans._plans) - before == len(variants)


def test_difference_row_plans_equal_the_twin():
    before = len(tri_gq._row_plans._plans)
    x, ref = _values(1, S + 40), _values(1, S + 40, seed=3)     # padded to whole groups
    cases = [(x[0], ref[0], None), (x[0].bfloat16(), ref[0], _values(1, E, seed=4))]
    for xs, r, tail in cases + cases:
        got = tri_gq.quantize_difference_row(xs, r, 4, GS, _keys(1), tail)
        assert torch.equal(got, twin_gq.quantize_difference_row(xs, r, 4, GS, _keys(1), tail))
    assert len(tri_gq._row_plans._plans) - before == len(cases)


def _wire(tail: torch.Tensor | None, hadamard: bool = False) -> torch.Tensor:
    x = _values(ROWS, S, seed=5)
    return twin_hd.quantize_rows(x, ROWS, 4, GS, 32, None, tail) if hadamard else \
        twin_gq.quantize_rows(x, ROWS, 4, GS, None, tail)


@pytest.mark.parametrize("hadamard", [False, True])
def test_decode_sum_plans_equal_the_twin(hadamard):
    before = len(tri_dsum._wire_plans._plans)
    code_bytes, groups = ROWS * 0 + S // 2, S // GS
    cases = []
    for dtype, post in ((torch.float32, None), (torch.bfloat16, ("div", 2.0))):
        tail = _values(ROWS, E, seed=6, dtype=dtype)
        cases.append((_wire(tail, hadamard), dtype, post))
    for wire, dtype, post in cases + cases:
        outs = []
        for mod in ((tri_hd, twin_hd) if hadamard else (tri_gq, twin_gq)):
            out, riders = torch.empty(S, dtype=dtype), torch.empty(E, dtype=dtype)
            args = (wire, code_bytes, groups, 4, GS) + ((32, True) if hadamard else ())
            mod.dequantize_sum_wire(*args, out=out, post=post, riders=(riders, dtype, post))
            outs.append((out, riders))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert len(tri_dsum._wire_plans._plans) - before == len(cases)


def test_dequantize_add_plans_equal_the_twin():
    before = len(tri_gq._add_plans._plans)
    code_bytes = S // 2
    cases = [(_wire(None), torch.float32, None, False),
             (_wire(_values(ROWS, E, seed=7)), torch.bfloat16, torch.float32, True)]
    for wire, dtype, rider_dtype, also in cases + cases:
        ref = _values(ROWS * S, seed=8, dtype=dtype)
        outs = []
        for mod in (tri_gq, twin_gq):
            into = torch.empty(ROWS, S + 8, dtype=dtype)[:, :S] if also else None
            riders = torch.empty(ROWS, E, dtype=rider_dtype) if rider_dtype else None
            got = mod.dequantize_add_wire(wire, code_bytes, 4, GS, ref.clone(), into, riders)
            outs.append((got, into, riders))
        assert torch.equal(outs[0][0], outs[1][0])
        for a, b in zip(outs[0][1:], outs[1][1:]):
            assert a is None or torch.equal(a, b)
    assert len(tri_gq._add_plans._plans) - before == len(cases)
