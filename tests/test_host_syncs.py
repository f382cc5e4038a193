"""No host-device sync in any compressor's steady state (compress / decompress / reduce), and
the guard of ``host_sync_guard.py`` itself."""

import os
import threading

import pytest
import torch

import hfcompress
from hfcompress import get_compressor, list_compressors
from host_sync_guard import HostSyncError, count_host_syncs, no_host_sync

PKG = os.path.dirname(hfcompress.__file__)


def _from_hfcompress(src: str, name: str):
    """A function whose code claims to live in hfcompress (as the guard sees call sites)."""
    ns: dict = {}
    exec(compile(src, os.path.join(PKG, "_guard_probe.py"), "exec"), ns)
    return ns[name]


# -- the guard ----------------------------------------------------------------------------
def test_guard_raises_on_hfcompress_syncs_and_names_the_call_site():
    item = _from_hfcompress("def f(t):\n    return t.item()\n", "f")
    truth = _from_hfcompress("def f(t):\n    if t:\n        return 1\n", "f")
    equal = _from_hfcompress("import torch\ndef f(a, b):\n    return torch.equal(a, b)\n", "f")
    t = torch.ones(())
    with no_host_sync():
        with pytest.raises(HostSyncError, match=r"Tensor\.item at hfcompress.*_guard_probe\.py:2"):
            item(t)
        with pytest.raises(HostSyncError, match=r"Tensor\.__bool__ at .*_guard_probe\.py:2"):
            truth(t)
        with pytest.raises(HostSyncError, match=r"torch\.equal at .*_guard_probe\.py:3"):
            equal(t, t)
        assert t.item() == 1.0 and bool(t) and torch.equal(t, t)  # test code: not counted
    assert item(t) == 1.0  # the guard is gone


def test_guard_counts_attributes_torch_internals_and_restores_methods():
    originals = {a: getattr(torch.Tensor, a) for a in ("item", "tolist", "__bool__", "cpu")}
    f = _from_hfcompress("def f(t):\n    a = t.tolist()\n    b = float(t[0])\n"
                         "    c = t.cpu()\n    return t.item() if t.numel() == 1 else a\n", "f")
    # torch.testing.assert_close calls Tensor methods internally: from test code, not counted
    with count_host_syncs() as syncs, count_host_syncs() as inner:
        f(torch.ones(2))
        f(torch.ones(1))
        torch.testing.assert_close(torch.ones(2), torch.ones(2))
        worker = threading.Thread(target=f, args=(torch.ones(2),))  # any thread
        worker.start()
        worker.join()
    site = os.path.join("hfcompress", "_guard_probe.py")
    assert syncs == inner
    assert syncs[f"Tensor.tolist at {site}:2"] == 3
    assert syncs[f"Tensor.__float__ at {site}:3"] == 3
    assert syncs[f"Tensor.cpu at {site}:4"] == 3
    assert syncs[f"Tensor.item at {site}:5"] == 1
    assert sum(syncs.values()) == 10
    assert {a: getattr(torch.Tensor, a) for a in originals} == originals


# -- every compressor in steady state -----------------------------------------------------
N = 3 * 1024 + 96  # not a multiple of any group / bucket / Hadamard block: padding paths too


def _tensors(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, generator=g).to(dtype) for _ in range(3)]


def _bucketed(name, **kw):
    def run(backend, xs, rounds):
        c = get_compressor(name, backend=backend, **kw)
        for _ in rounds():
            ps = [c.compress(x) for x in xs]
            c.decompress(ps[0])
            c.reduce(ps)
    return run


def _int_stochastic(backend, xs, rounds):
    c = get_compressor("int", rounding="stochastic", backend=backend)
    ref = xs[1].float()
    for _ in rounds():
        ps = [c.compress(x) for x in xs]
        c.decompress(ps[0])
        c.reduce(ps)
        c.decompress_add(c.compress_difference(xs[0], ref), ref)


def _hadamard(backend, xs, rounds):
    c = get_compressor("hadamard", backend=backend)
    even = [x[:3 * 1024] for x in xs]  # the fused path (whole blocks) and the general one
    for _ in rounds():
        for ys in (xs, even):
            ps = [c.compress(y) for y in ys]
            c.decompress(ps[0])
            c.reduce(ps)
            rot = [c.compress_rotated(c.rotate(y)) for y in ys]
            c.decompress_rotated(rot[0])
            c.reduce_rotated(rot)


def _global(name, **kw):
    def run(backend, xs, rounds):
        c = get_compressor(name, num_peers=len(xs), backend=backend, **kw)
        for _ in rounds():
            scale = torch.stack([c.local_scale(x) for x in xs]).amax(0)  # all_reduce(MAX)
            ps = [c.compress(x, scale=scale) for x in xs]
            c.decompress(ps[0])
            c.reduce(ps)
            c.decompress(c.reduce_packed(ps))
    return run


def _loco(backend, xs, rounds):
    c = get_compressor("loco", inner=get_compressor("int", rounding="stochastic",
                                                     backend=backend))
    for _ in rounds():
        ps = [c.compress(xs[0]) for _ in range(2)]
        c.decompress(ps[0])
        c.reduce(ps)
        c.step()


def _qwd(backend, xs, rounds):
    c = get_compressor("qwd", inner=get_compressor("int", backend=backend))
    world, w = len(xs), torch.cat(xs)
    for i in rounds():
        w = w + 0.01 * (i + 1)  # an optimizer step between all-gathers
        slots = w.chunk(world)
        for unchanged in (False, True):  # forward all-gather, then backward (no step between)
            wire = torch.stack([c.compress_slot(s, r, world, unchanged).flat()
                                for r, s in enumerate(slots)])
            c.decompress_rows(wire, slots[0].numel(), w.dtype)


DRIVERS = {
    "int": _bucketed("int"),
    "qsgd": _bucketed("qsgd"),
    "random_shift": _bucketed("random_shift"),
    "learned": _bucketed("learned", bits=5, fit_steps=20),
    "hadamard": _hadamard,
    "global_qsgd": _global("global_qsgd"),
    "global_qsgd_exp": _global("global_qsgd_exp"),
    "loco": _loco,
    "qwd": _qwd,
}


def test_every_registered_compressor_has_a_driver():
    """Every scheme hfcompress registers (tests may register their own: not counted)."""
    from hfcompress.compressors.base import COMPRESSORS
    ours = [n for n in list_compressors() if COMPRESSORS[n].__module__.startswith("hfcompress.")]
    assert sorted(DRIVERS) == ours


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN compares in the interpreter
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_steady_state_has_no_host_sync(name, dtype, backend):
    """A warm-up round (first calls: qWD's exact first payload, learned levels' fit), then
    two steady-state rounds with host syncs counted (qWD: forward and backward all-gather,
    "unchanged" known on the host)."""
    xs = _tensors(dtype)
    counted = []

    def rounds():
        yield 0
        with count_host_syncs() as syncs:
            yield 1
            yield 2
        counted.append(syncs)

    DRIVERS[name](backend, xs, rounds)
    assert counted and not counted[0], dict(counted[0])


def test_learned_levels_reach_the_device_once_per_change():
    """qsdp_learned's compress used a pageable ``levels.to(device)`` per call; now one copy
    per change of the levels (the "meta" device stands in for a GPU: ``.to`` makes a copy)."""
    c = get_compressor("learned", bits=3, fit_steps=0)
    meta = torch.device("meta")
    first = c.levels_on(meta)
    assert first.device == meta and c.levels_on(meta) is first
    c.update_levels(torch.randn(4096))                       # new levels: a new copy
    second = c.levels_on(meta)
    assert second is not first and c.levels_on(meta) is second
    c.levels[0] = 0.0                                        # in-place edit: a new copy
    assert c.levels_on(meta) is not second
