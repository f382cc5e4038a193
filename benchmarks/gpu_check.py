"""The GPU check in one command (issue 20): on one CUDA GPU, in under 10 minutes,

    python benchmarks/gpu_check.py                 # --device cuda, results in --out
    python benchmarks/gpu_check.py --device cpu    # the dry run: the script's own bugs, on CPU

1. kernels: throughput (GB/s: bytes read + written per second) of each hot kernel through
   its public entry point (``hfcompress.get_compressor(...)``, the kernels' ``backend="auto"``:
   Triton on CUDA, the compiled torch twin on CPU), against the device's memory bandwidth
   measured the same way (a device-to-device copy; on CPU a clone);
2. steps: on a small LLaMA at world size 1 (NCCL on CUDA, gloo on CPU, one process, a
   ``file://`` store), under ``compress_one_rank()`` (``hfcompress/comm/one_rank.py``: the
   compressed collectives run every stage over the one rank, so the rows time real codecs):
   the training step of plain FSDP2 and of DDP with each all-reduce preset's hook (a preset
   passes when its losses are finite and its last loss is within 5% of ``none``'s); FSDP2
   calls no collective at world size 1, so for each FSDP2 preset the time per step of its
   collectives (every module's all-gather with ``async_op=True`` and gradient
   reduce-scatter, called as FSDP2 calls them with more ranks), passing when the results
   are within the scheme's error of the exact collectives' (``qwd``'s is 0: the weights do
   not change between its all-gathers, and it sends its gradients exactly);
3. correctness: ``python -m pytest -m cuda -q tests/test_cuda.py`` in a subprocess (streams
   under ``torch.cuda._sleep``, every Triton kernel against its twin, a few steps of every
   preset), with ``TRITON_INTERPRET=0`` on CUDA; on CPU the same tests dry-run over gloo
   (``HFCOMPRESS_CUDA_TESTS_DEVICE=cpu``, Triton interpreted).

Prints one PASS / FAIL line per check and an overall line; writes ``gpu_check.csv`` (every
check, the last row the overall summary), ``gpu_check_meta.csv`` (machine, versions, GPU)
and ``pytest_cuda.log`` to ``--out``. Send back those three files and the printed summary.
Exit status 0 when every check passed. ``--quick``: fewest sizes, steps and tests (the
test suite runs ``--device cpu --quick``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

FIELDS = ["part", "name", "status", "value", "unit", "reference", "detail", "moved"]


@dataclass
class Check:
    part: str          # kernels, steps, correctness, summary
    name: str
    ok: bool
    value: float | str = ""
    unit: str = ""
    reference: float | str = ""
    detail: str = ""
    moved: float | str = ""    # kernels: GB/s by the bytes every pass really moves

    def row(self) -> dict:
        fmt = (lambda v: f"{v:.4g}" if isinstance(v, float) else v)
        return {"part": self.part, "name": self.name, "status": "pass" if self.ok else "FAIL",
                "value": fmt(self.value), "unit": self.unit, "reference": fmt(self.reference),
                "detail": self.detail, "moved": fmt(self.moved)}

    def line(self) -> str:
        value = f" {self.row()['value']} {self.unit}" if self.value != "" else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{'PASS' if self.ok else 'FAIL'} {self.part}/{self.name}:{value}{detail}"


def failed(part: str, name: str, err: BaseException) -> Check:
    return Check(part, name, False, detail=f"{type(err).__name__}: {err}".splitlines()[0][:300])


# -- timing ----------------------------------------------------------------------------------
def synchronize(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


REPEATS = 5   # timed groups of calls; a row reports their median


def seconds_per_call(fn: Callable[[], object], reps: int, device) -> float:
    """Wall-clock seconds per call of ``fn()`` after two warm-up calls (compiles; qWD's first
    all-gather is exact, its second compiles the difference kernels): the median over
    :data:`REPEATS` groups of ``reps`` calls, each group device-synced."""
    fn()
    fn()
    groups = []
    for _ in range(REPEATS):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize(device)
        groups.append((time.perf_counter() - start) / reps)
    return statistics.median(groups)


#: aten ops that move no bytes (allocations, views, metadata)
FREE_OPS = {"empty", "empty_strided", "empty_like", "view", "_unsafe_view", "reshape",
            "as_strided", "expand", "slice", "select", "t", "transpose", "permute",
            "unsqueeze", "squeeze", "alias", "detach", "lift_fresh", "split", "unbind",
            "split_with_sizes", "view_as_real", "is_nonzero"}


def moved_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """(bytes, passes) of one call of ``fn`` as the device runs it: every Triton launch moves
    at most its tensor arguments' bytes and every other aten op its inputs' and outputs'
    (an upper bound, the honest side of a bandwidth figure). On CPU the twins run eager
    while counting (compiled graphs are opaque to the count)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    count = {"bytes": 0, "passes": 0}

    def nbytes(values) -> int:
        seen, total = set(), 0
        for v in values:
            if isinstance(v, torch.Tensor) and v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += v.numel() * v.element_size()
        return total

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ not in FREE_OPS:
                flat = torch.utils._pytree.tree_leaves((args, kwargs, out))
                count["bytes"] += nbytes(flat)
                count["passes"] += 1
            return out

    launches = []
    try:
        from triton.runtime.jit import JITFunction
        run = JITFunction.run

        def counted(self, *args, **kwargs):
            launches.append(nbytes(list(args) + list(kwargs.values())))
            return run(self, *args, **kwargs)
    except ImportError:
        JITFunction = None
    saved = os.environ.get("HFCOMPRESS_COMPILE")
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    if JITFunction is not None:
        JITFunction.run = counted
    try:
        with Count():
            fn()
    finally:
        if JITFunction is not None:
            JITFunction.run = run
        if saved is None:
            os.environ.pop("HFCOMPRESS_COMPILE")
        else:
            os.environ["HFCOMPRESS_COMPILE"] = saved
    return count["bytes"] + sum(launches), count["passes"] + len(launches)


# -- 1. kernels ------------------------------------------------------------------------------
def kernel_cases(n: int, device) -> list[tuple[str, Callable[[], tuple[Callable, int]]]]:
    """(name, setup) of each hot kernel on ``n`` float32 values; ``setup()`` gives the call
    and the bytes it reads + writes (built lazily: a kernel that fails fails its own row)."""
    import torch

    from hfcompress import get_compressor
    from hfcompress.kernels import dispatch
    from hfcompress.kernels import group_quant as gq

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, device=device, generator=g)
    peers = 8

    def int_case(bits: int, what: str):
        c = get_compressor("int", bits=bits, group_size=128,
                           rounding="nearest" if what == "nearest" else "stochastic", seed=0)
        wire = c.wire_bits(n) // 8
        if what in ("stochastic", "nearest"):
            return lambda: c.compress(x), 4 * n + wire
        if what == "dequantize":
            packed = c.compress(x)
            return lambda: c.decompress(packed), wire + 4 * n
        rows = c.compress_rows(x.view(peers, -1))
        return lambda: c.reduce_rows(rows, (n // peers,), torch.float32), \
            rows.numel() + 4 * n // peers

    def hadamard(rotate: bool):
        h = get_compressor("hadamard", bits=4, group_size=128, hadamard_size=32, seed=0)
        return (lambda: h.rotate(x), 8 * n) if rotate else \
            (lambda: h.compress(x), 4 * n + h.wire_bits(n) // 8)

    def qwd():
        ref = x + 0.01 * torch.randn(n, device=device, generator=g)
        impl = dispatch.pick(x, "auto", gq, "triton_group_quant")
        return lambda: impl.quantize_difference(x, ref, 4, 2048), 8 * n + n // 2 + 2 * n // 1024

    def loco():
        """LoCo's feedback (the loco preset's int4 g128 inner) of bf16 gradients with a stored
        error: reads g and the 8-bit error, writes the payload and the new error."""
        c, xb = get_compressor("loco"), x.bfloat16()
        c.compress(xb)
        return lambda: c.compress(xb), 2 * n + 2 * (n + n // 32) + n // 2 + n // 32

    q = get_compressor("global_qsgd", num_peers=peers, seed=0)

    def global_qsgd(scale: bool):
        """The local scale (one pass over x) and the quantize given the scale, apart."""
        if scale:
            return lambda: q.local_scale(x), 4 * n + 4
        s = q.local_scale(x)
        return lambda: q.compress(x, s), 4 * n + q.wire_bits(n) // 8

    cases = []
    for bits in (4, 8):
        for what in ("stochastic", "nearest"):
            cases.append((f"int{bits}_g128_quantize_{what}", lambda b=bits, w=what: int_case(b, w)))
        cases.append((f"int{bits}_g128_dequantize", lambda b=bits: int_case(b, "dequantize")))
        cases.append((f"int{bits}_g128_dequantize_sum_{peers}peers",
                      lambda b=bits: int_case(b, "sum")))
    return cases + [("hadamard32_rotate", lambda: hadamard(True)),
                    ("hadamard32_int4_quantize", lambda: hadamard(False)),
                    ("qwd_int4_g2048_difference_quantize", qwd),
                    ("loco_int4_g128_feedback_bf16", loco),
                    ("global_qsgd_local_scale", lambda: global_qsgd(True)),
                    ("global_qsgd_int8_quantize", lambda: global_qsgd(False))]


def check_kernels(device, n: int, reps: int) -> list[Check]:
    import torch

    from hfcompress.kernels import dispatch

    x = torch.randn(n, device=device)
    out = torch.empty_like(x)
    copy_s = seconds_per_call((lambda: out.copy_(x)) if device.type == "cuda" else x.clone,
                              reps, device)
    copy_gbs = 2 * x.nbytes / copy_s / 1e9
    what = "device-to-device copy" if device.type == "cuda" else "clone"
    checks = [Check("kernels", "memory_bandwidth", True, copy_gbs, "GB/s", "",
                    f"{what} of {x.nbytes / 2**20:.2f} MiB")]
    backend = "triton" if dispatch.use_triton(x) else (
        "torch compiled" if dispatch.compile_enabled() and device.type == "cpu" else "torch")
    if device.type == "cuda" and backend != "triton":
        checks.append(Check("kernels", "triton_backend", False,
                            detail="the CUDA path runs the torch twins: pip install triton"))
    for name, setup in kernel_cases(n, device):
        try:
            fn, nbytes = setup()
            result = fn()
            tensors = result.payload.values() if hasattr(result, "payload") else (
                result if isinstance(result, tuple) else (result,))
            finite = all(torch.isfinite(t.float()).all() for t in tensors if t.is_floating_point())
            s = seconds_per_call(fn, reps, device)
            gbs = nbytes / s / 1e9
            moved, passes = moved_bytes(fn)
            checks.append(Check("kernels", name, bool(finite), gbs, "GB/s", copy_gbs,
                                f"{100 * gbs / copy_gbs:.0f}% of copy, {s * 1e3:.3f} ms, "
                                f"{backend}; moved {moved / n:.3g} B/value in {passes} "
                                f"pass(es) ({nbytes / n:.3g} counted): "
                                f"{100 * moved / s / 1e9 / copy_gbs:.0f}% of copy"
                                + ("" if finite else ", non-finite output"),
                                moved=moved / s / 1e9))
        except Exception as err:  # noqa: BLE001 - reported as a failed check
            checks.append(failed("kernels", name, err))
    return checks


# -- 2. training steps -----------------------------------------------------------------------
#: model and batch per device: small enough for a few seconds per preset
DIMS = {"cuda": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=8, vocab_size=4096,
                     max_position_embeddings=256),
        "cpu": {}}          # hfcompress.testing.TINY_LLAMA
BATCH = {"cuda": (8, 256), "cpu": (4, 32)}


def model_on(device):
    from hfcompress.testing import tiny_llama
    return tiny_llama(seed=0, **DIMS[device.type]).to(device)


def train(variant: str, device, steps: int, warmup: int) -> tuple[list[float], float]:
    """Losses of ``warmup + steps`` AdamW steps and the mean seconds of the last ``steps``:
    ``fsdp2`` (plain FSDP2), ``ddp`` (plain DDP) or ``ddp:<preset>`` (hfcompress's hook)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hfcompress
    from hfcompress.integrations import shard_model

    model = model_on(device)
    engine, _, preset = variant.partition(":")
    handle = None
    if engine == "fsdp2":
        net = shard_model(model, 1, False)
    else:
        net = DDP(model, device_ids=[device] if device.type == "cuda" else None)
        if preset:
            handle = hfcompress.apply(net, preset)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, seq = BATCH[device.type]
    losses, start = [], 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        g = torch.Generator().manual_seed(step + 1000 * dist.get_rank())
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if handle is not None:
            handle.step()
        losses.append(loss.detach())
    synchronize(device)
    seconds = (time.perf_counter() - start) / steps
    if handle is not None:
        handle.remove()
    return [v.item() for v in losses], seconds


def fsdp_collectives(preset: str, device, steps: int) -> tuple[float, float]:
    """Seconds per step of ``preset``'s FSDP2 collectives and their largest relative error
    against the exact ones. FSDP2 calls no collective at world size 1, so they are called
    here as FSDP2 does with more ranks: every FSDP module's all-gather (``async_op=True``,
    then ``wait()``) and gradient reduce-scatter, on buffers of the module's size."""
    import torch
    import torch.distributed as dist

    import hfcompress

    model = model_on(device)
    handle = hfcompress.apply(model, preset, shard=True)
    params = dict(model.named_parameters())
    jobs = []
    with torch.no_grad():
        for comms in handle.comms.values():
            shard = torch.cat([params[n].to_local().reshape(-1) for n in comms.layouts.names])
            grads = torch.randn(shard.numel(), device=device)
            jobs.append((comms, shard, torch.empty_like(shard), grads, torch.empty_like(grads)))

    def step() -> None:
        with torch.no_grad():
            for comms, shard, gathered, grads, reduced in jobs:
                gathered.copy_(shard)
                comms.ag(output_tensor=gathered, input_tensor=gathered,
                         group=dist.group.WORLD, async_op=True).wait()
                comms.rs(output_tensor=reduced, input_tensor=grads, group=dist.group.WORLD,
                         op=dist.ReduceOp.SUM)      # FSDP2's op on one rank
        handle.step()

    seconds = seconds_per_call(step, steps, device)
    err = max(max(rel_err(gathered, shard), rel_err(reduced, grads))
              for _, shard, gathered, grads, reduced in jobs)
    handle.remove()
    return seconds, err


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check_steps(device, steps: int, warmup: int) -> list[Check]:
    from _dist_common import DDP_PRESETS, FSDP_PRESETS

    from hfcompress.comm.one_rank import compress_one_rank

    with compress_one_rank():
        return steps_at_one_rank(device, steps, warmup, DDP_PRESETS, FSDP_PRESETS)


def steps_at_one_rank(device, steps: int, warmup: int, ddp_presets, fsdp_presets) -> list[Check]:
    checks = []
    trained = {}
    for v in ["fsdp2", "ddp", "ddp:none"] + [f"ddp:{p}" for p in ddp_presets]:
        try:
            trained[v] = train(v, device, steps, warmup)
        except Exception as err:  # noqa: BLE001
            checks.append(failed("steps", v, err))
    exact = trained.get("ddp:none")
    for v, (losses, seconds) in trained.items():
        finite = all(math.isfinite(x) for x in losses)
        close = not v.startswith("ddp:") or (
            exact is not None and abs(losses[-1] - exact[0][-1]) <= 0.05 * exact[0][-1])
        ref = trained["ddp"][1] * 1e3 if v.startswith("ddp:") and "ddp" in trained else ""
        checks.append(Check("steps", v, finite and close, seconds * 1e3, "ms/step", ref,
                            f"training step, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
                            + ("" if finite else ", non-finite loss")
                            + ("" if close else ", last loss not within 5% of ddp:none's")))
    plain = trained["fsdp2"][1] * 1e3 if "fsdp2" in trained else ""
    for preset in fsdp_presets:
        try:
            seconds, err = fsdp_collectives(preset, device, steps)
        except Exception as e:  # noqa: BLE001
            checks.append(failed("steps", f"fsdp2:{preset}", e))
            continue
        ok = math.isfinite(err) and err <= (0.0 if preset == "none" else 0.5)
        checks.append(Check("steps", f"fsdp2:{preset}", ok, seconds * 1e3, "ms/step", plain,
                            f"collectives only (all-gather + reduce-scatter of every module, "
                            f"by hand), max rel. error {err:.3g} vs exact; reference: a "
                            f"plain FSDP2 training step"))
    return checks


# -- 3. correctness: the cuda-marked tests ---------------------------------------------------
def check_tests(device, quick: bool, log: Path) -> list[Check]:
    env = dict(os.environ)
    if device.type == "cuda":
        env["TRITON_INTERPRET"] = "0"
    else:
        env.update(TRITON_INTERPRET="1", HFCOMPRESS_CUDA_TESTS_DEVICE="cpu")
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "tests/test_cuda.py"]
    if quick:
        cmd += ["-k", "all_gather and qw and not qwd"]     # one test
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    tail = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    summary = tail[-1].strip("= ") if tail else f"no output (exit {proc.returncode})"
    return [Check("correctness", "pytest -m cuda", proc.returncode == 0,
                  time.perf_counter() - start, "s", "", f"{summary}; log {log.name}")]


# -- main ------------------------------------------------------------------------------------
def device_info(device) -> dict[str, str]:
    import torch
    info = {}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        info["gpu"] = (f"{p.name}, sm_{p.major}{p.minor}, {p.total_memory >> 30} GiB, "
                       f"CUDA {torch.version.cuda}, NCCL {nccl}")
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gpu_check")
    ap.add_argument("--quick", action="store_true",
                    help="fewest sizes, steps and tests (a smoke test of this script)")
    ap.add_argument("--skip-tests", action="store_true",
                    help="leave out part 3 (benchmarks/gpu_run.sh runs the cuda tests itself, "
                         "streaming their log)")
    args = ap.parse_args(argv)
    if args.quick and args.device == "cpu":
        os.environ.setdefault("HFCOMPRESS_COMPILE", "0")     # eager twins: no compile time

    import torch
    import torch.distributed as dist

    from _dist_common import load_average, run_info, write_csv, write_meta

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; run with --device cpu for the dry run")
        return 2
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    n = {"cuda": 1 << 26, "cpu": 1 << 22}[device.type] >> (6 if args.quick else 0)
    reps = 1 if args.quick else {"cuda": 10, "cpu": 3}[device.type]
    steps, warmup = (1, 1) if args.quick else (5, 2)
    info = run_info(f"python benchmarks/gpu_check.py {' '.join(argv or sys.argv[1:])}".strip(),
                    f"LLaMA {DIMS[device.type] or 'hfcompress.testing.TINY_LLAMA'}, "
                    f"batch x seq {BATCH[device.type]}",
                    f"device {device}, kernels on {n} float32 values x {reps} reps, "
                    f"{warmup} + {steps} steps per preset, world size 1")
    info.update(device_info(device))

    checks: list[Check] = []

    def save() -> None:
        write_csv(args.out / "gpu_check.csv", [c.row() for c in checks], FIELDS)
        info["load_average_end"] = load_average()
        write_meta(args.out / "gpu_check_meta.csv", info)

    def run(part: str, fn: Callable[[], list[Check]]) -> None:
        print(f"gpu_check: {part} ...", flush=True)
        try:
            got = fn()
        except Exception as err:  # noqa: BLE001 - the part fails, the others still run
            got = [failed(part, "setup", err)]
        for c in got:
            print(c.line(), flush=True)
            checks.append(c)
        save()                    # after each part: a run cut short keeps what is done

    run("kernels", lambda: check_kernels(device, n, reps))
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            run("steps", lambda: check_steps(device, steps, warmup))
        finally:
            dist.destroy_process_group()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_tests:
        run("correctness (pytest -m cuda)",
            lambda: check_tests(device, args.quick, args.out / "pytest_cuda.log"))

    bad = [c for c in checks if not c.ok]
    overall = Check("summary", "overall", not bad, time.perf_counter() - start, "s", "",
                    f"{len(checks) - len(bad)} of {len(checks)} checks passed"
                    + (f"; failed: {', '.join(c.part + '/' + c.name for c in bad)}"
                       if bad else ""))
    checks.append(overall)
    print(overall.line())
    save()
    written = ["gpu_check.csv", "gpu_check_meta.csv"] + ([] if args.skip_tests else
                                                         ["pytest_cuda.log"])
    print(f"wrote {', '.join(str(args.out / f) for f in written)}: send these files and the "
          f"lines above")
    return 0 if not bad else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)       # gloo threads can abort an ordinary interpreter exit (PLATFORM.md)
