"""``comm/frozen.py`` in one process: the bytes qWD sends when only some values can change."""

from __future__ import annotations

import pytest
import torch

from hfcompress.comm import QuantizedAllGather
from hfcompress.comm.all_gather import VersionWatch
from hfcompress.comm.frozen import FrozenParams, SentBytes
from hfcompress.compressors import get_compressor
from hfcompress.compressors.runs import merged, put, runs_of, take


@pytest.mark.parametrize("bits", [4, 8])
def test_sent_bytes_rebuild_the_full_payload(bits):
    """Differences zero outside ``runs`` (groups of 128, runs crossing and inside groups, a
    last partial group): the selected bytes, expanded with the zero-difference payload, equal
    the full payload byte for byte, and fewer bytes are sent."""
    qwd = get_compressor("qwd", inner=get_compressor("int", bits=bits, group_size=128))
    numel = 1000
    runs = [(100, 140), (500, 510), (990, 1000)]
    ref = torch.randn(numel)
    x = ref.clone()
    for a, b in runs:
        x[a:b] += torch.randn(b - a)
    full = qwd.inner.compress_difference(x, ref).flat()
    sent = SentBytes(qwd, numel, runs)
    picked = sent.select(full)
    assert picked.numel() == sent.count == 4 * (128 * bits // 8 + 4)    # groups 0, 1, 3, 7
    assert torch.equal(sent.expand(picked.view(1, -1).expand(3, -1))[2], full)


def test_other_inner_sends_everything():
    qwd = get_compressor("qwd", inner=get_compressor("int", bits=4, group_size=128,
                                                     rounding="stochastic"))
    assert not SentBytes(qwd, 1000, [(0, 10)]).active


def test_runs_of_merges_adjacent_segments():
    assert runs_of([(3, True), (2, True), (4, False), (0, True), (1, True)]) == ((0, 5), (9, 10))
    assert merged([(0, 2), (2, 4), (5, 5), (6, 8)]) == ((0, 4), (6, 8))
    rows = torch.arange(12).view(2, 6)
    assert take(rows, ()).shape == (2, 0)
    assert torch.equal(take(rows, ((1, 3), (4, 5))), rows[:, [1, 2, 4]])


@pytest.mark.parametrize("runs", [((0, 4), (6, 10)), ((1, 3), (5, 7), (9, 11)),
                                  ((0, 4), (5, 8)), ((0, 2), (3, 5), (8, 10))])
def test_take_and_put_of_equally_spaced_runs_are_the_slices(runs):
    """Runs of one length equally spaced (the embedding and LM head around the final norm)
    go through one strided view; others, and the 1-D case, through slices: the same
    values either way, the other columns untouched."""
    rows = torch.arange(24.0).view(2, 12)[:, 1:]   # strided rows, not at the storage start
    want = torch.cat([rows[:, a:b] for a, b in runs], dim=1)
    got = take(rows, runs)
    assert torch.equal(got, want) and got.data_ptr() != rows.data_ptr()
    for target in (torch.full((2, 11), -1.0), torch.full((2, 13), -1.0)[:, 2:],
                   torch.full((11,), -1.0)):
        cols = -want - 1 if target.dim() == 2 else -want[0] - 1
        expect = target.clone()
        offset = 0
        for a, b in runs:
            expect[..., a:b] = cols[..., offset:offset + b - a]
            offset += b - a
        put(target, runs, cols)
        assert torch.equal(target, expect)


def test_frozen_params_restart_qwd_when_the_frozen_set_or_a_frozen_value_changes():
    """Read on the host before each all-gather: nothing changed, or a trainable parameter
    written (its differences are sent anyway): same split, references kept. A frozen
    parameter written in place, or unfrozen: the references start afresh (the next
    all-gather is exact) and the split follows the new frozen set."""
    qwd = QuantizedAllGather(get_compressor("qwd"))
    refs = qwd.references
    w, norm = torch.zeros(300, requires_grad=True), torch.ones(4)
    frozen, params = FrozenParams([(300, False), (4, True)], qwd), [w, norm]

    def gathered(numel):            # what an all-gather leaves behind
        refs.qwd.reference, refs.layout = torch.zeros(numel), (1, 1, numel)

    columns = frozen.current(VersionWatch.read(params))
    assert columns.qwd_numel == 304 and columns.exact_numel == 0
    gathered(304)
    with torch.no_grad():
        w.add_(1)
    assert frozen.current(VersionWatch.read(params)) is columns and refs.qwd.reference is not None
    with torch.no_grad():
        norm.mul_(2)
    columns = frozen.current(VersionWatch.read(params))
    assert columns.qwd_numel == 304 and refs.qwd.reference is None and refs.layout is None
    gathered(304)
    assert frozen.current(VersionWatch.read(params)) is columns and refs.qwd.reference is not None
    norm.requires_grad_(True)       # unfrozen: sent exactly, no frozen columns left
    assert frozen.current(VersionWatch.read(params)) is None and refs.qwd.reference is None
    gathered(300)
    norm.requires_grad_(False)
    frozen.rebase()                 # references loaded: kept if their layout fits
    assert frozen.current(VersionWatch.read(params)).qwd_numel == 304 and refs.qwd.reference is None
    gathered(304)
    frozen.rebase()
    assert frozen.current(VersionWatch.read(params)).qwd_numel == 304 and refs.qwd.reference is not None


class _Handled(torch.Tensor):
    """A tensor subclass with its own ``__torch_function__`` (as DTensor has): counts calls."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_version_watch_reads_subclasses_without_their_handler():
    """``VersionWatch.read`` of tensor subclasses (FSDP2's DTensor parameters): the values
    their ``__torch_function__`` gives, with no handler call; an in-place write through the
    subclass moves its version counter, which the next read sees."""
    params = [torch.zeros(8).as_subclass(_Handled), torch.ones(4).as_subclass(_Handled)]
    params[1].requires_grad_(True)
    with_handler = tuple((t.data_ptr(), t._version, t.requires_grad) for t in params)
    _Handled.calls = 0
    first = VersionWatch.read(params)
    assert first == with_handler and _Handled.calls == 0
    watch = VersionWatch()
    assert not watch.unchanged(first) and watch.unchanged(VersionWatch.read(params))
    with torch.no_grad():
        params[0].add_(1)
    assert not watch.unchanged(VersionWatch.read(params))
