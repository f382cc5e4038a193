"""LoCo's error feedback in one Triton kernel (kernels/triton_loco.py) == LoCo's torch ops, bit for
bit, under the Triton interpreter (TRITON_INTERPRET=1, set in conftest.py): payloads and stored
errors over several calls, with resets, non-finite gradients and checkpoints."""

import pytest
import torch

from hfcompress.compressors.group_quant import GroupQuantizer
from hfcompress.compressors.loco import LoCo
from hfcompress.kernels import dispatch
from interpreter_fma import interpreter_fuses_fma

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not dispatch.triton_available(), reason="Triton not installed"),
    pytest.mark.skipif(dispatch.triton_available() and not interpreter_fuses_fma(),
                       reason="this Triton's interpreter rounds tl.fma twice (a GPU fuses it)"),
    # inf * 0 and NaN compares inside the interpreter's numpy are expected
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


def pair(bits=4, rounding="nearest", beta=0.2, reset_every=3, **kw):
    """The same LoCo on the Triton kernel and on torch ops."""
    return [LoCo(GroupQuantizer(bits, 128, rounding, seed=3, backend=b), beta=beta,
                 reset_every=reset_every, **kw) for b in ("triton", "torch")]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, NaN positions and values."""
    if not a.is_floating_point():
        return a.dtype == b.dtype and torch.equal(a, b)
    return (a.dtype == b.dtype and torch.equal(torch.isnan(a), torch.isnan(b))
            and torch.equal(a.nan_to_num(), b.nan_to_num()))


def gradients(n, dtype, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for t in range(steps):
        x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(2) * 4
        if t == 2:   # a non-finite step: its groups' payloads NaN, their errors zeroed
            x[5], x[300], x[-1] = float("nan"), float("inf"), float("-inf")
        yield x.to(dtype)


def check_same_state(fused: LoCo, ref: LoCo) -> None:
    assert (fused.error_codes is None) == (ref.error_codes is None)
    if ref.error_codes is not None:
        assert same(fused.error_codes, ref.error_codes)
        assert same(fused.error_scales, ref.error_scales)


def run(fused: LoCo, ref: LoCo, n, dtype, steps=5, seed=0):
    for x in gradients(n, dtype, steps, seed):
        assert fused._fused(x) and not ref._fused(x)
        a, b = fused.compress(x), ref.compress(x)
        assert a.shape == b.shape and a.dtype == b.dtype == x.dtype
        assert list(a.payload) == list(b.payload) == ["codes", "scales"]
        for k in a.payload:
            assert same(a.payload[k], b.payload[k]), k
        check_same_state(fused, ref)
        fused.step()
        ref.step()


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [128 * 40, 1000, 4096 * 3 + 77])   # whole groups, ragged tails
def test_feedback_kernel_equals_torch_ops(n, dtype, rounding):
    """Five calls (a reset after the first: the error restarts from zero), the third with
    NaN / Inf gradients: the same payloads and the same stored 8-bit errors."""
    run(*pair(rounding=rounding), n, dtype)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.8, 0.9, 1.0])
def test_every_beta_rounds_as_torch_lerp(beta):
    """torch.lerp's two forms (weight below 0.5, and from 0.5 up) each rounded once, with the
    float32 coefficient ``beta - 1`` (0.8: float64 ``0.8 - 1`` rounds to another float32)."""
    run(*pair(beta=beta, reset_every=None), 3000, torch.float32, seed=int(beta * 10))


@pytest.mark.parametrize("bits,dtype", [(2, torch.float16), (8, torch.float32)])
def test_other_inner_widths(bits, dtype):
    run(*pair(bits=bits, rounding="stochastic"), 2000, dtype)


def test_resumes_from_a_checkpoint_as_torch_ops_do():
    """An error saved by one path and loaded into a fresh instance continues bit for bit on
    the kernel (and a loaded error that is not whole aligned words runs the torch ops)."""
    fused, ref = pair(reset_every=None)
    run(fused, ref, 2048, torch.float32, steps=2)
    state = ref.state_dict()
    again, ref2 = pair(reset_every=None)
    again.load_state_dict(state)
    ref2.load_state_dict(state)
    x = next(gradients(2048, torch.float32, 1, seed=9))
    assert same(again.compress(x).payload["codes"], ref2.compress(x).payload["codes"])
    check_same_state(again, ref2)
    # the same error held at an odd byte offset: not read as int32 words by the kernel
    odd, ref3 = pair(reset_every=None)
    for m in (odd, ref3):
        m.load_state_dict(state)
        m.error_codes = torch.cat([torch.zeros(1, dtype=torch.uint8), m.error_codes])[1:]
    assert not odd._fused(x)
    assert same(odd.compress(x).payload["codes"], ref3.compress(x).payload["codes"])


@pytest.mark.parametrize("kw", [dict(error_scale=2.0 ** 20), dict(error_scale=None),
                                dict(inner=GroupQuantizer(4, 2048, backend="triton"))])
def test_other_settings_run_the_torch_ops(kw):
    """Errors stored otherwise, or inner groups other than the error's 128: no kernel."""
    loco = LoCo(**{"inner": GroupQuantizer(4, 128, backend="triton"), **kw})
    x = torch.randn(4096)
    assert not loco._fused(x)
    assert loco.compress(x).payload["codes"].numel() > 0


def test_one_launch_per_call(monkeypatch):
    """The whole feedback (Alg. 1 lines 4-8, 12) is one kernel and no torch op on the tensor."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hfcompress.kernels import triton_loco

    launches = []
    kernel = triton_loco._feedback_kernel
    monkeypatch.setattr(kernel, "run", lambda *a, **k: launches.append(k["grid"]))

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in ("empty", "view", "detach", "alias", "slice", "select"):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    loco, _ = pair(rounding="stochastic")
    x = torch.randn(4096)
    loco.compress(x)             # the first call: no error yet
    with Ops() as ops:
        loco.compress(x)
    assert len(launches) == 2 and ops.ops == [], ops.ops


def test_a_stored_error_of_another_size_is_refused():
    """The kernel reads the error in place: one of another tensor's size is an error, not an
    out-of-bounds read."""
    from hfcompress.kernels import triton_loco

    codes, scales = torch.zeros(256, dtype=torch.uint8), torch.zeros(2)
    with pytest.raises(ValueError, match="expected 384 codes and 3 scales"):
        triton_loco.feedback(torch.randn(300), codes, scales, 0.2, 4, 128)


def streams_pair(rounding, beta=0.2):
    from hfcompress.comm.streams import Streams

    return [Streams(LoCo(GroupQuantizer(4, 128, rounding, seed=3, backend=b), beta=beta,
                         reset_every=3)) for b in ("triton", "torch")]


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", [(1, 1024), (3, 1000), (4, 2048)])
def test_every_destination_row_in_one_launch_equals_row_by_row(rows, n, dtype, rounding):
    """A reduce-scatter hop's rows (strided rows of a wider input, exact values riding along),
    each with its own stream's error (``comm/hop.compress_rows``): one kernel writes the wire
    and rewrites every stored error in place; the same wire and errors as LoCo's torch ops row
    by row, over resets and a non-finite step."""
    run_rows(rows, n, dtype, rounding)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_older_tritons_tile_equals_torch_ops(monkeypatch, dtype, rounding):
    """Triton < 3.9 runs 16-bit gradients at 8 values per thread (``triton_loco.PER_THREAD``'s
    note): that tile too, for one tensor and for a hop's rows, gives the torch ops' numbers."""
    from hfcompress.kernels import triton_loco

    monkeypatch.setattr(triton_loco, "OLDER_TRITON", True)
    assert [triton_loco._values_per_thread(b, 2) for b in (2, 4, 8)] == [16, 8, 8]
    assert triton_loco._values_per_thread(4, 4) == 16
    run(*pair(rounding=rounding), 4096 + 77, dtype)
    run_rows(3, 1000, dtype, rounding)


def run_rows(rows, n, dtype, rounding):
    """Five calls of a hop's rows through the kernel and through the torch ops row by row."""
    from hfcompress.comm.hop import compress_rows

    fused, ref = streams_pair(rounding, beta=0.8 if rows == 4 else 0.2)
    g = torch.Generator().manual_seed(rows * n)
    key = lambda k: (k, 0)   # noqa: E731
    for k in range(rows):    # each row's stream at another point of its noise
        fused[key(k)].inner.rng.calls = ref[key(k)].inner.rng.calls = 7 * k
    for t in range(5):
        x = (torch.randn(rows, n + 64, generator=g) * 3).to(dtype)[:, :n]
        if t == 2:
            x[rows - 1, 7], x[0, 300] = float("nan"), float("inf")
        rider = torch.randn(rows, 6, generator=g).to(dtype)
        assert torch.equal(compress_rows(fused, x, key, False, rider),
                           compress_rows(ref, x, key, False, rider))
        for k in range(rows):
            check_same_state(fused[key(k)], ref[key(k)])
        for s in (fused, ref):
            for loco in s.instances():
                loco.step()


def test_rows_launch_once_and_copy_nothing_from_the_host_once_running(monkeypatch):
    """One launch per hop whatever the rows; the device table of the errors' addresses is made
    on the first calls (no error yet, then errors) and after a reset, not in between."""
    from hfcompress.comm.hop import compress_rows
    from hfcompress.kernels import triton_loco

    fused, _ = streams_pair("stochastic")
    tables = []
    make = LoCo._error_table

    def recorded(self, instances, x):
        table = make(self, instances, x)
        tables.append(table)
        return table
    monkeypatch.setattr(LoCo, "_error_table", recorded)
    x = torch.randn(4, 1024)
    for _ in range(4):
        compress_rows(fused, x, lambda k: (k, 0), False)
    assert len({id(t) for t in tables}) == 2 and len(tables) == 4   # no error yet, errors
    for loco in fused.instances():
        loco.step()                 # a reset (step 0): new errors, a new table
    compress_rows(fused, x, lambda k: (k, 0), False)
    assert len({id(t) for t in tables}) == 3
    launches = []
    monkeypatch.setattr(triton_loco._feedback_rows_kernel, "run",
                        lambda *a, **k: launches.append(k["grid"]))
    compress_rows(fused, x, lambda k: (k, 0), False)
    assert len(launches) == 1 and launches[0][1] == 4
