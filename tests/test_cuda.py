"""The GPU check (issue 20): what only a CUDA GPU shows, in one command on one GPU (< 10 min):

    TRITON_INTERPRET=0 python -m pytest -m cuda -q tests/test_cuda.py

(``python benchmarks/gpu_check.py`` runs it and more.) Without CUDA every test skips before
any CUDA call. Three parts:

- streams: ``torch.cuda._sleep`` (a ~0.1 s spin) is enqueued on the current stream right
  before each asynchronous path (FSDP2's ``unshard(async_op=True)`` all-gather, the
  reduce-scatter, the DDP comm hook, the HSDP replica all-reduce hook), and the result is
  compared with the same run without the sleep: a stage that is not ordered after the
  caller's stream reads its input before the kernels writing it have run.
- kernels: every Triton kernel on the GPU against its torch twin on the CPU, bit for bit.
- training: a few FSDP2 / DDP steps of every preset on a tiny LLaMA, loss close to ``none``'s.

One process is world size 1 over NCCL (a ``file://`` store). The streams, futures and
kernels run as with more ranks: every test runs under ``compress_one_rank()``
(``hfcompress/comm/one_rank.py``), so the compressed all-reduce (DDP / HSDP hooks) and
reduce-scatters (1-hop, 2-hop) run their compress / exchange / decode stages over the one
rank instead of returning before them (``tests/test_one_rank.py`` shows it on CPU). What one
GPU cannot show: FSDP2 calls no all-gather / reduce-scatter at world size 1 (the tests call
the objects hfcompress installed on an FSDP module as FSDP2 does with more ranks, and the
FSDP2 training steps run no hfcompress collective); exact collectives stay the identity;
nothing crosses a link (NCCL's transports, several ranks' ordering). On a machine with
several GPUs,
``torchrun --nproc_per_node N -m pytest -m cuda -q tests/test_cuda.py`` runs the same tests
with N ranks (one GPU each, different data per rank), where all of it runs.

``HFCOMPRESS_CUDA_TESTS_DEVICE=cpu`` runs these tests on CPU over gloo (the sleep a no-op,
Triton interpreted): a dry run of this file's own code, not of the GPU path.
"""

import importlib
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hfcompress
from hfcompress.compressors import get_compressor
from hfcompress.compressors.base import GloballyScaled
from hfcompress.comm.one_rank import compress_one_rank
from hfcompress.compressors.rng import SeededRNG
from hfcompress.config import get_config, list_presets
from hfcompress.kernels import dispatch
from hfcompress.kernels import global_qsgd as gqt
from hfcompress.kernels import group_quant as gq
from hfcompress.kernels import hadamard as hd
from hfcompress.kernels import learned_levels as ll
from hfcompress.kernels import noise as nz
from hfcompress.kernels import qsgd as qs
from hfcompress.kernels import random_shift as rs
from hfcompress.testing import tiny_llama

DEVICE_TYPE = os.environ.get("HFCOMPRESS_CUDA_TESTS_DEVICE", "cuda")
ON_GPU = DEVICE_TYPE == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (HFCOMPRESS_CUDA_TESTS_DEVICE=cpu: a CPU dry run)"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),    # NaN / Inf test values
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

#: hfcompress's presets: those FSDP2 trains, those only DDP (and HSDP's replica hook) runs
DDP_ONLY = [p for p in list_presets()
            if get_config(p).all_reduce is not None and not get_config(p).compresses_fsdp]
FSDP_PRESETS = [p for p in list_presets() if p not in DDP_ONLY]
WEIGHT_PRESETS = ["none"] + [p for p in FSDP_PRESETS if get_config(p).weights is not None]
GRAD_PRESETS = ["none"] + [p for p in FSDP_PRESETS if get_config(p).grad_inter is not None]
HOOK_PRESETS = ["none", "loco", *DDP_ONLY]      # all-reduce schemes of DDP and HSDP

SLEEP_CYCLES = 200_000_000    # ~0.1 s of GPU clock (1.4-2 GHz)


# -- set-up ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def every_stage_at_one_rank():
    """Compressed collectives over one rank run all their stages (``one_rank.py``)."""
    with compress_one_rank():
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The process group: torchrun's (``WORLD_SIZE`` set), else one rank over a file store.
    Yields (rank, world size); the device is ``device()``."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if ON_GPU:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if ON_GPU else "gloo"
    if size > 1:
        dist.init_process_group(backend)
    else:
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if ON_GPU else torch.device("cpu")


def sleep() -> None:
    """A long spin on the current stream: later work on it starts ~0.1 s later."""
    if ON_GPU:
        torch.cuda._sleep(SLEEP_CYCLES)


class SleepInBackward(torch.autograd.Function):
    """Identity; its backward (the first of the backward pass) enqueues the spin, so every
    gradient kernel runs after it."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        sleep()
        return grad


def batch(step: int) -> torch.Tensor:
    """This rank's token ids at ``step`` (different data per rank)."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randint(0, 256, (4, 32), generator=g).to(device())


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def full(t: torch.Tensor) -> torch.Tensor:
    """A (sharded) parameter or gradient as one plain tensor on the CPU."""
    return cpu_copy(t.full_tensor() if hasattr(t, "full_tensor") else t)


def cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """A float32 copy on the CPU (FSDP2 frees the unsharded parameters' storage on reshard)."""
    return t.detach().to("cpu", torch.float32, copy=True)


# -- streams: a sleep before each asynchronous path ------------------------------------------
def layer_comms(preset: str):
    """A tiny LLaMA under FSDP2 with ``preset``: the handle, the all-gather / reduce-scatter
    objects installed on decoder layer 0 (what FSDP2 calls; FSDP2 skips both at world size 1,
    so the tests call them as FSDP2 does with more ranks) and the layer's parameters in the
    order of its all-gather buffer."""
    model = tiny_llama(seed=0).to(device())
    handle = hfcompress.apply(model, preset, shard=True)
    comms = handle.comms["model.layers.0"]
    params = dict(model.named_parameters())
    return handle, comms, [params[n] for n in comms.layouts.names]


def gathered(preset: str, with_sleep: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Layer 0's all-gather with ``async_op=True`` (explicit prefetching) as FSDP2 makes it:
    copy-in on the caller's stream, the call, ``wait()``, copy-out on the caller's stream;
    and torch's exact all-gather of the same input. The weights are negated (after the
    spin) before the second gather: a gather that does not wait for the caller's stream
    sees the old weights or an unwritten buffer, a ``wait()`` that does not order the
    caller's stream after the decode gives the copy-out an unwritten output. Also returns
    whether the Work said it was completed right after the call (behind the spin on a GPU
    it must not)."""
    handle, comms, params = layer_comms(preset)
    rank, world = dist.get_rank(), dist.get_world_size()

    def gather() -> tuple[torch.Tensor, torch.Tensor, bool]:
        shard = torch.cat([p.to_local().reshape(-1) for p in params])
        n = shard.numel()
        assert n == comms.layouts.full.numel, "not FSDP2's all-gather buffer"
        out = torch.empty(world * n, dtype=shard.dtype, device=shard.device)
        out[rank * n:(rank + 1) * n].copy_(shard)
        work = comms.ag(output_tensor=out, input_tensor=out[rank * n:(rank + 1) * n],
                        group=dist.group.WORLD, async_op=True)
        done_at_once = work.is_completed()
        work.wait()
        got = out.clone()
        exact = torch.empty_like(out)
        dist.all_gather_into_tensor(exact, shard)
        return got, exact, done_at_once

    with torch.no_grad():
        gather()                  # the first gather (qWD: exact, sets the references)
        if with_sleep:
            sleep()
        for p in params:
            p.neg_()
        got, exact, done_at_once = gather()
    handle.remove()
    return cpu_copy(got), cpu_copy(exact), done_at_once


@pytest.mark.parametrize("preset", WEIGHT_PRESETS)
def test_async_all_gather_waits_for_the_callers_stream(world, preset):
    # without the spin first: its first calls compile and load the kernels, host time that
    # would outlast the spin (seen on an H200: is_completed() was True after it)
    fast, _, _ = gathered(preset, False)
    slow, exact, done_at_once = gathered(preset, True)
    assert not (ON_GPU and done_at_once), (preset, "is_completed() before the spin ended")
    # the same numbers (learned levels are fitted with index_add_, whose CUDA sums vary
    # in the last bits from run to run); a stale read is off by O(1)
    assert rel_err(slow, fast) < 1e-3, preset
    # the new (negated) weights within the scheme's error; the old ones are 2.0 off
    assert rel_err(fast, exact) <= (0 if preset == "none" else 0.5), preset


def scattered(preset: str, with_sleep: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's gradient reduce-scatter as FSDP2 calls it (on a stream ordered after the
    gradients' producer): its input written on the caller's stream after the spin, its output
    read on the caller's stream right after the call; and torch's exact reduce-scatter."""
    handle, comms, _ = layer_comms(preset)
    n, world = comms.layouts.full.numel, dist.get_world_size()
    g = torch.Generator().manual_seed(dist.get_rank())
    grads = torch.randn(world * n, generator=g).to(device())
    out, exact = torch.empty(n, device=device()), torch.empty(n, device=device())
    # FSDP2's op: SUM on one rank (NCCL's one-rank AVG lost values, NVIDIA/nccl#1950)
    op = dist.ReduceOp.AVG if world > 1 else dist.ReduceOp.SUM
    with torch.no_grad():
        if with_sleep:
            sleep()
        rows = grads * 2
        comms.rs(output_tensor=out, input_tensor=rows, group=dist.group.WORLD, op=op)
        got = out.clone()
        dist.reduce_scatter_tensor(exact, rows, op=op)
    handle.remove()
    return cpu_copy(got), cpu_copy(exact)


@pytest.mark.parametrize("preset", GRAD_PRESETS)
def test_reduce_scatter_waits_for_the_gradients(world, preset):
    (slow, exact), (fast, _) = scattered(preset, True), scattered(preset, False)
    assert rel_err(slow, fast) < 1e-3, preset      # as above
    assert rel_err(fast, exact) < (1e-6 if preset == "none" else 0.5), preset


def two_backward_passes(net, model, with_sleep: bool) -> dict[str, torch.Tensor]:
    """Backward of -loss, then of +loss with the spin first: a stage reading its input early
    sees the first pass's buffers (gradients of the other sign) or unwritten memory. Returns
    the second pass's gradients."""
    ids = batch(1)
    for sign in (-1.0, 1.0):
        model.zero_grad(set_to_none=True)
        loss = net(input_ids=ids, labels=ids).loss
        if with_sleep and sign > 0:
            loss = SleepInBackward.apply(loss)
        (sign * loss).backward()
    return {n: full(p.grad) for n, p in model.named_parameters()}


def fsdp_grads(preset: str, with_sleep: bool, mesh=None) -> dict[str, torch.Tensor]:
    model = tiny_llama(seed=0).to(device())
    kwargs = {"mesh": mesh} if mesh is not None else {}
    handle = hfcompress.apply(model, preset, shard=True, **kwargs)
    grads = two_backward_passes(model, model, with_sleep)
    handle.remove()
    return grads


def ddp_grads(preset: str, with_sleep: bool) -> dict[str, torch.Tensor]:
    model = tiny_llama(seed=0).to(device())
    ddp = DDP(model, device_ids=[device()] if ON_GPU else None, bucket_cap_mb=0.1)
    handle = hfcompress.apply(ddp, preset)
    grads = two_backward_passes(ddp, model, with_sleep)
    handle.remove()
    return grads


def concat(grads: dict) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])


def assert_same_grads(slow: dict, fast: dict, what: str) -> None:
    """Same gradients up to the GPU's run-to-run noise (atomics in attention / embedding
    backward; a compressor may round a value that noise moved to the next level); a stage
    that read stale data (the other pass's sign) is off by O(1)."""
    for name, g in fast.items():
        assert torch.isfinite(slow[name]).all(), (what, name)
        if what == "none":
            assert rel_err(slow[name], g) < 1e-3, (what, name, rel_err(slow[name], g))
    err = rel_err(concat(slow), concat(fast))
    assert err < 0.05, (what, err)


@pytest.mark.parametrize("preset", HOOK_PRESETS)
def test_ddp_hook_waits_for_the_gradients(world, preset):
    slow, fast = ddp_grads(preset, True), ddp_grads(preset, False)
    assert_same_grads(slow, fast, preset)
    if dist.get_world_size() == 1:   # the average over one rank: its own gradient, coded
        plain = tiny_llama(seed=0).to(device())
        err = rel_err(concat(fast), concat(two_backward_passes(plain, plain, False)))
        assert err < (1e-3 if preset == "none" else 0.5), (preset, err)
        assert preset == "none" or err > 0, (preset, "the codec did not run")


@pytest.mark.parametrize("preset", HOOK_PRESETS)
def test_hsdp_hook_waits_for_the_gradients(world, preset):
    """HSDP over a (replicas = world size, shards = 1) mesh: every rank is a replica."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE_TYPE, (dist.get_world_size(), 1),
                            mesh_dim_names=("replicate", "shard"))
    assert_same_grads(fsdp_grads(preset, True, mesh), fsdp_grads(preset, False, mesh), preset)


# -- Triton kernels on the GPU == their torch twins on the CPU -------------------------------
@pytest.fixture(scope="module")
def compiled_triton():
    if not dispatch.triton_available():
        pytest.skip("Triton is not installed")
    if ON_GPU and dispatch.triton_interpreted():
        pytest.fail("TRITON_INTERPRET=1 (tests/conftest.py sets it unless told otherwise): "
                    "run TRITON_INTERPRET=0 python -m pytest -m cuda, so that the kernels are "
                    "compiled for the GPU instead of interpreted")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and values; NaN where the other has NaN (any payload); -0.0 == 0.0."""
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))) if a.is_floating_point() \
        else (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


def on_device(v):
    return v.to(DEVICE_TYPE) if isinstance(v, torch.Tensor) else v


def check(twin, name: str, *args):
    """``hfcompress.kernels.triton_<twin>.<name>`` on the device's copies of ``args`` equals
    ``twin.<name>(*args)`` on the CPU, output by output; returns the twin's outputs."""
    triton_module = importlib.import_module(
        f"hfcompress.kernels.triton_{twin.__name__.rsplit('.', 1)[1]}")
    want = getattr(twin, name)(*args)
    got = getattr(triton_module, name)(*map(on_device, args))
    many = isinstance(want, tuple)
    want, got = (want, got) if many else ((want,), (got,))
    assert len(got) == len(want), name
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == DEVICE_TYPE, (name, i)
        assert same(g.cpu(), w), (twin.__name__, name, i,
                                  [a for a in args if not torch.is_tensor(a)])
    return want if many else want[0]


def values(numel: int, seed: int, dtype=torch.float32, group: int = 128) -> torch.Tensor:
    """Mixed magnitudes with an Inf, a NaN, a -Inf group and an all-zero group."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.rand(numel, generator=g).pow(3) * 10
    x[3], x[group + 1], x[3 * group + 5] = float("inf"), float("nan"), float("-inf")
    x[2 * group: 3 * group] = 0
    return x.to(dtype)


def noises(numel: int, seed: int, rows: int = 3):
    """Nearest rounding, float32 noise values, one key pair, ``rows`` row keys."""
    rng = SeededRNG(seed)
    return [None, torch.rand(numel, generator=torch.Generator().manual_seed(seed)),
            rng.next_keys("cpu"), rng.next_keys("cpu", rows)]


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("bits, gs", [(4, 128), (8, 128), (6, 96), (2, 32)])
def test_group_quant_kernels(compiled_triton, bits, gs):
    n = gs * 150                               # several programs, the last partial
    for dtype in DTYPES:
        x = values(n, bits, dtype, gs)
        for noise in noises(n, gs):
            codes, scales = check(gq, "quantize", x, bits, gs, noise)
        check(gq, "dequantize", codes, scales, bits, gs, dtype)
    peers = [gq.quantize(values(n, s, group=gs) * (s + 1), bits, gs) for s in range(3)]
    packed, scale = torch.stack([p[0] for p in peers]), torch.stack([p[1] for p in peers])
    check(gq, "dequantize_sum", packed, scale, bits, gs)
    n = 384 * 10                               # whole groups of both sizes
    peers = [gq.quantize(values(n, s, group=gs) * (s + 1), bits, gs) for s in range(3)]
    packed, scale = torch.stack([p[0] for p in peers]), torch.stack([p[1] for p in peers])
    for noise in noises(n, 7)[:3]:
        check(gq, "dequantize_sum_quantize", packed, scale, bits, gs, 4, 128, noise)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_difference_kernels(compiled_triton, dtype):
    """qWD's sender / receiver steps (int4, group 2048), any numel."""
    n, gs = 2048 * 3 + 77, 2048
    x = values(n, 1, dtype, gs)
    ref = (x.float() + 0.01 * torch.randn(n, generator=torch.Generator().manual_seed(2))).to(dtype)
    for noise in (None, SeededRNG(3).next_keys("cpu")):
        codes, scales = check(gq, "quantize_difference", x, ref, 4, gs, noise)
    check(gq, "dequantize_add", codes, scales, 4, gs, ref)
    for width in (gs, gs - 77):
        rows = ref[:3 * width].reshape(3, width).contiguous()
        check(gq, "dequantize_add_rows", codes[:3 * gs // 2], scales[:3], 4, gs, rows)


@pytest.mark.parametrize("bits, gs, h", [(4, 128, 32), (8, 128, 32), (6, 96, 32), (4, 256, 1)])
def test_hadamard_kernels(compiled_triton, bits, gs, h):
    n = gs * 37
    for numel in (h * 3, 4096 * 2 + 128 * 3):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(5))
        check(hd, "rotate", x.to(torch.bfloat16), h)
    x = values(n, bits, group=gs) * 3
    for dtype in DTYPES:
        for noise in noises(n, bits, rows=1):
            codes, scales = check(hd, "quantize", x.to(dtype), bits, gs, h, noise)
        for inverse in (True, False):
            check(hd, "dequantize", codes, scales, bits, gs, h, dtype, inverse)
    peers = [hd.quantize(values(n, s, group=gs), bits, gs, h) for s in range(3)]
    packed, scale = torch.stack([p[0] for p in peers]), torch.stack([p[1] for p in peers])
    for inverse in (True, False):
        check(hd, "dequantize_sum", packed, scale, bits, gs, h, inverse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_riders_in_the_decode_kernels(compiled_triton, dtype):
    """The exact values riding a wire's rows (``comm/riders.py``): summed by the decode-sum's
    own launch (group quant and Hadamard with the inverse; SUM, PREMUL by 1/3, AVG by 2,
    the division exact on both) and copied by the gathered slots' decode, on the device as
    the twins on the CPU, bit for bit; the payload's sum untouched."""
    from hfcompress.kernels import triton_group_quant as tgq
    from hfcompress.kernels import triton_hadamard as thd
    from hfcompress.kernels.packing import split_tail
    p, n, e = 3, 128 * 40, 64
    peers = [gq.quantize(values(n, s) * (s + 1), 4, 128) for s in range(p)]
    packed, scale = torch.stack([q[0] for q in peers]), torch.stack([q[1] for q in peers])
    riding = (torch.randn(p, e, generator=torch.Generator().manual_seed(3))
              * torch.tensor([1.0, 100.0, 0.01])[:, None]).to(dtype)
    wire = torch.cat([packed, scale.view(torch.uint8), riding.view(torch.uint8)], 1)
    args = (wire, packed.shape[1], scale.shape[1], 4, 128)
    for fn, ref, extra in ((tgq.dequantize_sum_wire, gq.dequantize_sum_wire, ()),
                           (thd.dequantize_sum_wire, hd.dequantize_sum_wire, (32, True))):
        for post in (None, ("mul", 1 / 3), ("div", 2)):
            want, want_e = torch.empty(n), torch.empty(e, dtype=dtype)
            ref(*args, *extra, out=want, post=post, riders=(want_e, dtype, post))
            got = torch.empty(n, device=DEVICE_TYPE)
            got_e = torch.empty(e, dtype=dtype, device=DEVICE_TYPE)
            fn(*map(on_device, args), *extra, out=got, post=post, riders=(got_e, dtype, post))
            assert same(got.cpu(), want) and same(got_e.cpu(), want_e), (fn, post)
    out = torch.full((p, n + e + 8), 7.0, dtype=dtype)
    gq.dequantize_rows(packed, scale, 4, 128, out[:, :n], riders=(out[:, n + 8:], riding))
    got = on_device(torch.full((p, n + e + 8), 7.0, dtype=dtype))
    body, riders = split_tail(on_device(wire), wire.shape[1] - e * dtype.itemsize, dtype)
    fields = (body[:, :packed.shape[1]], body[:, packed.shape[1]:].view(torch.float32))
    tgq.dequantize_rows(*fields, 4, 128, got[:, :n], riders=(got[:, n + 8:], riders))
    assert same(got.cpu(), out)


def buckets(bucket: int, dtype, seed: int = 0) -> torch.Tensor:
    """11 buckets: normal values, a NaN, an Inf, zeros, a constant, a ramp, wide, tiny."""
    x = torch.randn(11, bucket, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5
    x[1, 5], x[2, 7], x[3], x[4] = float("nan"), -float("inf"), 0, 0.75
    x[5] = torch.linspace(0, 1, bucket)
    x[6] *= 1e4
    x[7] *= 1e-30
    return x.reshape(-1).to(dtype)


QSDP_CASES = [(torch.float32, 1024, 8), (torch.bfloat16, 1024, 4), (torch.float16, 96, 4),
              (torch.bfloat16, 32, 8)]


@pytest.mark.parametrize("dtype, bucket, bits", QSDP_CASES)
def test_qsdp_kernels(compiled_triton, dtype, bucket, bits):
    """QSGD, the random-shift lattice and learned levels (QSDP)."""
    x = buckets(bucket, dtype)
    n, nb = x.numel(), x.numel() // bucket
    for noise in noises(n, 1)[1:3]:
        codes, scales = check(qs, "quantize", x, bits, bucket, noise)
    check(qs, "dequantize", codes, scales, bits, bucket, dtype)
    peers = [qs.quantize(x * (p + 1), bits, bucket, torch.rand(n)) for p in range(3)]
    check(qs, "dequantize_sum", *[torch.stack([p[i] for p in peers]) for i in range(2)],
          bits, bucket)
    q = check(rs, "quantize", x, bits, bucket, torch.rand(nb))
    check(rs, "dequantize", *q, bits, bucket, dtype)
    peers = [rs.quantize(x * (p + 1), bits, bucket, torch.rand(nb)) for p in range(3)]
    check(rs, "dequantize_sum", *[torch.stack([p[i] for p in peers]) for i in range(3)],
          bits, bucket)
    levels = torch.rand(1 << bits, generator=torch.Generator().manual_seed(3)).sort().values
    q = check(ll, "quantize", x, levels, bits, bucket)
    check(ll, "dequantize", *q, levels, bits, bucket, dtype)
    peers = [ll.quantize(x * (p + 1), levels, bits, bucket) for p in range(2)]
    check(ll, "dequantize_sum", *[torch.stack([p[i] for p in peers]) for i in range(3)],
          torch.stack([levels, levels]), bits, bucket)


@pytest.mark.parametrize("block_size", [None, 256])
def test_global_qsgd_kernels(compiled_triton, block_size):
    n = 3 * 4096 + 384
    k = 1 if block_size is None else -(-n // block_size)
    scale = torch.rand(k, generator=torch.Generator().manual_seed(3)) * 8 + 1
    for dtype in DTYPES:
        x = values(n, 4, dtype)
        for i, noise in enumerate(noises(n, 2)[1:]):   # values, one key pair, row keys
            decode = i == 0                             # decodes take no noise: once
            for wire, levels in ((torch.int8, 31), (torch.int32, 1 << 24)):
                codes = check(gqt, "linear_quantize", x, scale, levels, noise, wire, block_size)
                if decode:
                    check(gqt, "linear_dequantize", codes, scale, levels, dtype, block_size)
                    check(gqt, "linear_dequantize", codes.long() * 3, scale, levels, dtype,
                          block_size)
            for bits in (8, 4):
                a = check(gqt, "exp_quantize", x, scale, 5, 2, bits, noise, block_size)
                if decode:
                    check(gqt, "exp_dequantize", a, scale, 2, bits, dtype, block_size)
                b = gqt.exp_quantize(values(n, 9, dtype), scale, 5, 2, bits, torch.rand(n),
                                     block_size)
                check(gqt, "exp_combine", a, b, bits, noise)


def test_noise_kernel(compiled_triton):
    """The counter hash expanded on the GPU: one key pair and row keys."""
    x = torch.empty(3 * 4096 + 384)
    for keys in noises(x.numel(), 11)[2:]:
        check(nz, "uniform_like", x, keys)


COMPRESSORS = [("int", dict(bits=4, group_size=128, rounding="stochastic")),
               ("int", dict(bits=8, group_size=2048, rounding="nearest")),
               ("hadamard", dict(bits=4, group_size=128, hadamard_size=32)),
               ("qsgd", dict(bits=8, bucket_size=1024)),
               ("random_shift", dict(bits=8, bucket_size=1024)),
               ("global_qsgd", dict(num_peers=2)),
               ("global_qsgd_exp", dict(num_peers=2))]


@pytest.mark.parametrize("name, params", COMPRESSORS, ids=[c[0] for c in COMPRESSORS])
def test_compressors_on_the_gpu_equal_the_cpu(compiled_triton, name, params):
    """Each scheme on the device (Triton) gives the CPU twin's payloads, decodes and row
    reduce: the seeded noise, row keys and paddings of the compressors, not only kernels.
    (``learned`` fits its levels with ``index_add_``, whose float sums differ between
    devices; its kernels are checked with fixed levels above.)"""
    x = values(3 * 4001, 13, torch.bfloat16).nan_to_num(0, 0, 0).reshape(3, -1)
    a = get_compressor(name, seed=5, backend="torch", **params)
    b = get_compressor(name, seed=5, backend="triton", **params)
    pa, pb = a.compress(x), b.compress(x.to(DEVICE_TYPE))
    for key in pa.payload:
        assert same(pb.payload[key].cpu(), pa.payload[key]), (name, key)
    assert same(b.decompress(pb).cpu(), a.decompress(pa))
    if isinstance(a, GloballyScaled):     # peers compress with the all-reduced scale
        scale = torch.stack([a.local_scale(r) for r in x]).amax()
        pa = [a.compress(r, scale=scale) for r in x]
        pb = [b.compress(r.to(DEVICE_TYPE), scale=scale.to(DEVICE_TYPE)) for r in x]
        assert same(b.reduce(pb).cpu(), a.reduce(pa))
        return
    wa, wb = a.compress_rows(x), b.compress_rows(x.to(DEVICE_TYPE))
    assert same(wb.cpu(), wa)
    assert same(b.reduce_rows(wb, (x.shape[1],), x.dtype).cpu(),
                a.reduce_rows(wa, (x.shape[1],), x.dtype))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_loco_feedback_on_the_gpu_equals_the_cpu(compiled_triton, rounding):
    """LoCo's feedback kernels on the device (one tensor; a hop's rows in one launch, errors
    rewritten in place) give LoCo's torch ops on the CPU: payloads and stored 8-bit errors,
    over a reset and a non-finite step, beta in both of torch.lerp's forms."""
    from hfcompress.comm.hop import compress_rows
    from hfcompress.comm.streams import Streams
    from hfcompress.compressors.group_quant import GroupQuantizer
    from hfcompress.compressors.loco import LoCo
    from interpreter_fma import interpreter_fuses_fma

    if not ON_GPU and not interpreter_fuses_fma():
        pytest.skip("this Triton's interpreter rounds tl.fma twice (a GPU fuses it)")
    for beta in (0.2, 0.8):
        make = lambda b: LoCo(GroupQuantizer(4, 128, rounding, seed=3, backend=b),  # noqa: E731
                              beta=beta, reset_every=2)
        one, ref = make("triton"), make("torch")
        rows, rows_ref = Streams(make("triton")), Streams(make("torch"))
        key = lambda k: (k, 0)   # noqa: E731
        for t in range(4):
            x = values(3 * 4001, 20 + t, torch.bfloat16).reshape(3, -1)
            if t != 1:
                x = x.nan_to_num(0, 0, 0)
            a, b = one.compress(x[0].to(DEVICE_TYPE)), ref.compress(x[0])
            assert all(same(a.payload[k].cpu(), b.payload[k]) for k in b.payload), (beta, t)
            wa = compress_rows(rows, x.to(DEVICE_TYPE), key, False, x[:, :6].to(DEVICE_TYPE))
            assert same(wa.cpu(), compress_rows(rows_ref, x, key, False, x[:, :6])), (beta, t)
            for got, want in [(one, ref)] + [(rows[key(k)], rows_ref[key(k)]) for k in range(3)]:
                assert same(got.error_codes.cpu(), want.error_codes), (beta, t)
                assert same(got.error_scales.cpu(), want.error_scales), (beta, t)
            for loco in [one, ref, *rows.instances(), *rows_ref.instances()]:
                loco.step()


# -- training: a few steps of every preset at world size 1 -----------------------------------
STEPS = 4
_losses: dict[tuple[str, str], list[float]] = {}


def train(engine: str, preset: str) -> list[float]:
    """``STEPS`` AdamW steps of the tiny LLaMA (FSDP2 or DDP) on one batch per rank, the
    losses (cached)."""
    if (engine, preset) in _losses:
        return _losses[engine, preset]
    model = tiny_llama(seed=0).to(device())
    if engine == "fsdp2":
        net, handle = model, hfcompress.apply(model, preset, shard=True)
    else:
        net = DDP(model, device_ids=[device()] if ON_GPU else None)
        handle = hfcompress.apply(net, preset)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    ids = batch(0)                   # one batch: the loss must go down
    for _ in range(STEPS):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        handle.step()
        losses.append(loss.item())
    handle.remove()
    _losses[engine, preset] = losses
    return losses


@pytest.mark.parametrize("engine, preset", [("fsdp2", p) for p in FSDP_PRESETS]
                         + [("ddp", p) for p in HOOK_PRESETS])
def test_training_steps(world, engine, preset):
    losses, exact = train(engine, preset), train(engine, "none")
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], losses                      # it learns
    assert abs(losses[-1] - exact[-1]) < 0.05 * exact[-1], (losses, exact)
