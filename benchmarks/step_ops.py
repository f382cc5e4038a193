"""GPU operations and host time per FSDP unit and step of every FSDP2 preset, read on a CPU.

    python benchmarks/step_ops.py --out DIR          # DIR/step_ops.csv (~1 min of CPU)
    python benchmarks/step_ops.py --world 2          # 2 ranks on one node (rank 0's counts)
    python benchmarks/kernel_isa.py --steps --out DIR

On the small LLaMA of ``gpu_check.py`` (its CUDA ``DIMS``, on CPU tensors) at world size 1
(gloo, a ``file://`` store, one process, under ``compress_one_rank()``; ``--world N``: N
processes, nodes of ``--ranks-per-node``, the paths a multi-GPU run takes), each preset's
collectives of a step run as ``gpu_check.fsdp_collectives`` calls them (every unit's
all-gather ``async_op=True`` + ``wait()``, its gradient reduce-scatter with the op FSDP2
passes, ``AVG`` over more than one rank and ``SUM`` over one (``--op`` sets it), then
``handle.step()``) on the code path a GPU takes: ``dispatch.use_triton`` answers as for a
CUDA tensor, every module's ``per_program`` gives the GPU tile, futures run inline
(``inline_on_cpu``, CUDA's control flow), and every Triton launch is stubbed
(``JITFunction.run`` counts it and returns; a clean subprocess without ``TRITON_INTERPRET``).

Counted per step after ``--warmup`` steps, divided by the number of FSDP units
(``len(handle.comms)``): Triton launches; aten ops that launch a kernel on a GPU (a
``TorchDispatchMode``; allocations, views, ``detach`` and metadata ops are free; ops that
run inside ``torch.distributed`` (gloo's own copies) are not the step's); collectives (the
``c10d`` ops); host-to-device copies (tensors built from host data, ``torch.tensor``: on a
GPU a copy, pinned or not). The benchmark's own copy of each shard into its all-gather
buffer (FSDP2's copy-in) is outside the count. ``host_ms``: the median wall time of a step
with the launches stubbed and no dispatch mode (CPU tensors: the aten ops still compute on
the CPU, so it is the Python cost plus small CPU kernels). ``python_calls``: the function
calls of a step per unit (``cProfile``'s count, C builtins and tensor methods included, the
stubbed launches too), a deterministic proxy of the host time, which moves +-15% between
runs of this shared machine. ``host_aten``: every aten op the step issues per unit, views
and allocations included (each costs the host a dispatch, ~1-3 us, kernel or not).

``--floor`` adds the host time of the bare torch calls, timed with the presets' steps:
``floor:none`` the two collectives ``none`` makes per unit, ``floor:sdp4bit`` the fewest
torch calls sdp4bit's wire takes per unit (each direction one row of codes with the exact
columns riding, its collective, the exact columns out of the received rows, and a Python
call in place of each of its four kernels; one run of exact columns per unit), no hfcompress
layer around either; and ``floor:sdp4bit+wrapper``, ``none``'s step with its collectives
traded for ``floor:sdp4bit``'s calls: the least host time sdp4bit could take behind the
same FSDP wrapper as ``none``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIELDS = ["preset", "ops_per_unit", "triton", "aten", "collectives", "h2d", "host_ms",
          "host_ratio_vs_none", "python_calls", "calls_ratio_vs_none", "host_aten", "units",
          "triton_kernels", "aten_ops"]

#: aten ops that launch no kernel on a GPU (allocation, views, metadata)
FREE = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view",
        "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "expand_as",
        "slice", "select", "t", "transpose", "permute", "unsqueeze", "squeeze", "alias",
        "detach", "split", "split_with_sizes", "unbind", "narrow", "flatten", "unflatten",
        "view_as", "chunk", "diagonal", "movedim", "set_", "resize_", "record_stream",
        "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
        "_has_compatible_shallow_copy_type", "is_nonzero_noop"}
#: aten ops that bring host data to the device (``torch.tensor(...)``)
H2D = {"lift_fresh", "lift_fresh_copy"}


def interleaved_ms(steps: dict, repeats: int) -> dict[str, float]:
    """The median milliseconds of this thread's CPU time of each step (``name ->
    callable``), the steps called in turn ``repeats`` times (a load drift hits them
    alike)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, run in steps.items():
            t0 = time.thread_time()
            run()
            times[name].append(time.thread_time() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def gpu_code_path(launch, package: str = "hfcompress") -> None:
    """On CPU tensors, the code path a GPU takes: every kernel module's ``use_triton``
    answers as for a CUDA tensor (the backend still validated), ``per_program`` gives the
    GPU tile, and Triton's launches call ``launch(self, *args, grid, warmup, **kwargs)``
    instead (a stub: the host's cost of the launch call, not of Triton's launcher).
    ``package``: the name ``hfcompress`` is imported as (``host_ab_trees.py``: another
    tree's beside it)."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    K = importlib.import_module(f"{package}.kernels")
    dispatch = importlib.import_module(f"{package}.kernels.dispatch")
    TT = importlib.import_module(f"{package}.kernels.triton_tiles")
    use_triton = dispatch.use_triton

    def as_on_cuda(t, backend="auto"):
        use_triton(t, "torch" if backend == "torch" else "auto")    # validates backend
        return backend != "torch" and dispatch.triton_available()

    gpu_tile = lambda t, interpreted, gpu: gpu  # noqa: E731
    mods = [importlib.import_module(f"{package}.kernels.{i.name}")
            for i in pkgutil.iter_modules(K.__path__)]
    for mod in [K, dispatch, *mods]:
        if getattr(mod, "use_triton", None) is use_triton:
            mod.use_triton = as_on_cuda
        if getattr(mod, "per_program", None) is TT.per_program:
            mod.per_program = gpu_tile
    TT.per_program = gpu_tile
    JITFunction.run = launch


def jobs_of(handle, model, world: int, rank: int) -> list[tuple]:
    """Per unit of ``handle``: its comms, this rank's shard, the all-gather output and its
    slot (the input, as FSDP2 passes it), the gradients of every rank's shard and the
    output."""
    import torch
    params = dict(model.named_parameters())
    jobs = []
    with torch.no_grad():
        for comms in handle.comms.values():
            shard = torch.cat([params[n].to_local().reshape(-1) for n in comms.layouts.names])
            n = shard.numel()
            gathered = torch.empty(world * n)
            grads = torch.randn(world * n)
            jobs.append((comms, shard, gathered, gathered[rank * n:(rank + 1) * n], grads,
                         torch.empty_like(shard)))
    return jobs


def unit_step(handle, jobs: list[tuple], op, mode=None) -> None:
    """One step of the collectives as FSDP2 calls them: per unit the copy-in into the
    all-gather slot (outside ``mode``), the all-gather, the reduce-scatter of the gradients
    with ``op``; then the handle's step."""
    import contextlib

    import torch
    import torch.distributed as dist
    with torch.no_grad():
        for comms, shard, gathered, slot, grads, reduced in jobs:
            slot.copy_(shard)       # FSDP2's copy-in: not counted
            with mode if mode is not None else contextlib.nullcontext():
                comms.ag(output_tensor=gathered, input_tensor=slot,
                         group=dist.group.WORLD, async_op=True).wait()
                comms.rs(output_tensor=reduced, input_tensor=grads,
                         group=dist.group.WORLD, op=op)
    with mode if mode is not None else contextlib.nullcontext():
        handle.step()


def _child(presets: list[str], warmup: int, counted: int, repeats: int, rank: int = 0,
           world: int = 1, per_node: int = 1, store: str = "", floor: bool = False,
           op: str = "sum") -> list[dict]:
    """Runs in the clean subprocess (rank ``rank`` of ``world``, nodes of ``per_node``
    ranks, a shared ``file://`` store when ``world > 1``; gradients reduced with ``op``):
    one dict per preset (and, with ``floor``, one per bare step: ``host_ms`` only)."""
    import collections
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    import hfcompress
    from gpu_check import DIMS
    from hfcompress.comm.futures import inline_on_cpu
    from hfcompress.comm.one_rank import compress_one_rank
    from hfcompress.testing import tiny_llama

    launches: collections.Counter = collections.Counter()
    reduce_op = getattr(dist.ReduceOp, op.upper())

    def stub(self, *args, grid, warmup, **kwargs):
        launches[self.fn.__name__] += 1

    gpu_code_path(stub)
    dist_dir = os.path.dirname(dist.__file__)

    class Ops(TorchDispatchMode):
        """aten / c10d ops of the step, those torch.distributed runs itself left out."""

        def __init__(self):
            super().__init__()
            self.ops: collections.Counter = collections.Counter()
            self.host = 0       # every aten op of the step, free ones included

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            ns = func.namespace
            f = sys._getframe(1)
            inside_dist = False
            while f is not None:
                if f.f_code.co_filename.startswith(dist_dir):
                    inside_dist = True
                    break
                f = f.f_back
            if ns == "c10d":
                self.ops[f"c10d.{name}"] += 1
            elif not inside_dist:
                self.host += 1
                if name not in FREE:
                    self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    def step(handle, jobs, mode=None):
        unit_step(handle, jobs, reduce_op, mode)

    def counted_ops(preset):
        """Per unit: the step's Triton launches and dispatched ops (``DIMS["cuda"]``)."""
        handle, jobs = setup(preset, DIMS["cuda"])
        launches.clear()
        mode = Ops()
        for _ in range(counted):
            step(handle, jobs, mode)
        handle.remove()
        units = len(jobs)
        per = lambda c: collections.Counter(  # noqa: E731
            {k: v / counted / units for k, v in c.items()})
        return units, per(launches), per(mode.ops), mode.host / counted / units

    def python_calls(preset):
        """Per unit: the function calls of ``counted`` steps of the tiny model."""
        import cProfile
        import io
        import pstats

        handle, jobs = setup(preset, DIMS["cpu"])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(counted):
            step(handle, jobs)
        prof.disable()
        handle.remove()
        return pstats.Stats(prof, stream=io.StringIO()).total_calls / counted / len(jobs)

    def host_ms(presets):
        """Per preset (and bare step, with ``floor``): the median CPU milliseconds of this
        thread in a step of the tiny model (``DIMS["cpu"]``), the steps interleaved (a load
        drift hits them alike)."""
        runs = {p: setup(p, DIMS["cpu"]) for p in presets}
        steps = {p: lambda h=handle, j=jobs: step(h, j) for p, (handle, jobs) in runs.items()}
        if floor:
            steps.update(bare_steps(setup("none", DIMS["cpu"])[1], world))
        ms = interleaved_ms(steps, repeats)
        for handle, _ in runs.values():
            handle.remove()
        return ms

    def setup(preset, dims):
        model = tiny_llama(seed=0, **dims)
        handle = hfcompress.apply(model, preset, shard=True, ranks_per_node=per_node)
        jobs = jobs_of(handle, model, world, rank)
        for _ in range(warmup):
            step(handle, jobs)
        return handle, jobs

    def names(c):
        return " ".join(f"{k}:{round(v, 2):g}" for k, v in
                        sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    out = []
    with tempfile.TemporaryDirectory(prefix="step_ops_") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{store or tmp + '/store'}",
                                rank=rank, world_size=world)
        try:
            with compress_one_rank() if world == 1 else contextlib.nullcontext(), \
                    inline_on_cpu():
                ms = host_ms(presets)
                for preset in presets:
                    units, tri, ops, host = counted_ops(preset)
                    coll = sum(n for k, n in ops.items() if k.startswith("c10d."))
                    h2d = sum(n for k, n in ops.items() if k in H2D)
                    out.append(dict(preset=preset, units=units, triton=sum(tri.values()),
                                    aten=sum(ops.values()) - coll - h2d, collectives=coll,
                                    h2d=h2d, host_ms=ms[preset],
                                    python_calls=python_calls(preset), host_aten=host,
                                    triton_kernels=names(tri), aten_ops=names(ops)))
                    print(f"step_ops: {preset} done", file=sys.stderr, flush=True)
                out += [dict(preset=p, host_ms=t) for p, t in ms.items() if p not in presets]
        finally:
            dist.destroy_process_group()
    return out


def bare_steps(jobs: list, world: int) -> dict:
    """``--floor``'s steps (module docstring) on ``none``'s units (``_child``'s jobs, in its
    subprocess): name -> a step."""
    import torch
    import torch.distributed as dist

    from hfcompress.comm.hop import all_gather_single, reduce_scatter_single
    units = []
    for comms, shard, gathered, slot, grads, reduced in jobs:
        n, e = shard.numel(), comms.layouts.full.exact_numel
        codes = -(-(n - e) // 8) * 4 + -(-(n - e) // 128) * 4    # 4-bit codes, g128 scales
        units.append((n - e, codes, codes + 4 * e, slot, gathered, gathered.view(world, -1),
                      grads, grads.view(world, -1), reduced))

    def kernel(*tensors):
        """A stubbed launch's Python call."""

    def none():
        with torch.no_grad():
            for _, _, _, slot, gathered, _, grads, _, reduced in units:
                all_gather_single(gathered, slot, async_op=True).wait()
                reduce_scatter_single(reduced, grads)

    def sdp4bit():
        u8, f32 = torch.uint8, torch.float32
        with torch.no_grad():
            for c, codes, width, slot, _, rows, _, grads, reduced in units:
                send = torch.empty(1, width, dtype=u8)
                send[:, codes:].copy_(slot[c:].view(1, -1).view(u8))
                kernel(send, slot)                              # qWD quantize
                wire = torch.empty(world, width, dtype=u8)
                all_gather_single(wire, send, async_op=True).wait()
                kernel(wire, rows)                              # dequantize-add
                rows[:, c:].copy_(wire[:, codes:].view(f32))
                send = torch.empty(world, width, dtype=u8)
                send[:, codes:].copy_(grads[:, c:].view(u8))
                kernel(send, grads)                             # Hadamard + quantize
                wire = torch.empty_like(send)
                dist.all_to_all_single(wire, send)
                kernel(wire, reduced)                           # decode-sum
                torch.sum(wire[:, codes:].view(f32), 0, out=reduced[c:])
    return {"floor:none": none, "floor:sdp4bit": sdp4bit}


def measure(presets: list[str] | None = None, warmup: int = 3, counted: int = 2,
            repeats: int = 41, world: int = 1, ranks_per_node: int | None = None,
            floor: bool = False, op: str | None = None) -> list[dict]:
    """One dict per preset (``FIELDS``), measured in a clean subprocess per rank (rank 0's
    counts; ``world`` ranks on gloo in nodes of ``ranks_per_node``, default one node); with
    ``floor``, the bare steps' (module docstring) after them, their other fields empty.
    ``op``: the gradients' reduce op, ``"sum"`` or ``"avg"`` (default: FSDP2's, AVG over
    more than one rank, SUM over one)."""
    if presets is None:
        sys.path.insert(0, str(HERE))
        from _dist_common import FSDP_PRESETS
        presets = list(FSDP_PRESETS)
    per_node = ranks_per_node or world
    op = op or ("avg" if world > 1 else "sum")
    if op not in ("sum", "avg"):
        raise ValueError(f"step_ops: op must be 'sum' or 'avg', got {op!r}")
    if world < 1 or world % per_node:
        raise ValueError(f"step_ops: {world} ranks cannot form nodes of {per_node}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["HFCOMPRESS_COMPILE"] = "0"
    with tempfile.TemporaryDirectory(prefix="step_ops_") as tmp:
        logs = [(Path(tmp) / f"out{r}", Path(tmp) / f"err{r}") for r in range(world)]
        runs = []
        for r, (out, err) in enumerate(logs):
            with open(out, "w") as o, open(err, "w") as e:
                runs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--child",
                     json.dumps([presets, warmup, counted, repeats, r, world, per_node,
                                 f"{tmp}/store" if world > 1 else "", floor, op])],
                    env=env, stdout=o, stderr=e, text=True))
        report = _wait_all(runs, timeout=3600)
        outs = [(out.read_text(), err.read_text()) for out, err in logs]
    if report is not None:
        rank, why = report
        raise RuntimeError(f"step_ops {why} on rank {rank}:\n{outs[rank][1][-4000:]}")
    raw = json.loads(outs[0][0].split("JSON", 1)[1])
    bare = {r["preset"]: r["host_ms"] for r in raw if "units" not in r}
    raw = [r if "units" in r else {k: "" for k in FIELDS} | r for r in raw]
    none = next((r for r in raw if r["preset"] == "none"), None)
    if none and bare:
        raw.append({k: "" for k in FIELDS} | {"preset": "floor:sdp4bit+wrapper", "host_ms": (
            none["host_ms"] - bare["floor:none"] + bare["floor:sdp4bit"])})
    for r in raw:
        if r["units"] == "":
            r["host_ratio_vs_none"] = round(r["host_ms"] / none["host_ms"], 2) if none else ""
            r["host_ms"] = round(r["host_ms"], 3)
            continue
        r["ops_per_unit"] = r["triton"] + r["aten"] + r["collectives"] + r["h2d"]
        r["host_ratio_vs_none"] = r["host_ms"] / none["host_ms"] if none else ""
        r["calls_ratio_vs_none"] = r["python_calls"] / none["python_calls"] if none else ""
        for k in ("ops_per_unit", "triton", "aten", "collectives", "h2d", "host_ratio_vs_none",
                  "python_calls", "calls_ratio_vs_none", "host_aten"):
            if r[k] != "":
                r[k] = round(r[k], 2)
        r["host_ms"] = round(r["host_ms"], 3)
    return raw


def _wait_all(runs: list[subprocess.Popen], timeout: float) -> tuple[int, str] | None:
    """Wait for every rank; the first that fails (or all, past ``timeout``) stops the others
    at once, not after gloo's timeout. Returns ``(rank, "failed" / "timed out")`` to report,
    None when every rank succeeded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [r.poll() for r in runs]    # every rank polled
        if None not in codes or any(codes):
            break
        time.sleep(0.1)
    failed = next((k for k, r in enumerate(runs) if r.poll()), None)
    report = (failed, "failed") if failed is not None else \
        (0, "timed out") if any(r.poll() is None for r in runs) else None
    for r in runs:
        if r.poll() is None:
            r.kill()
            r.wait()
    return report


def print_table(rows: list[dict]) -> None:
    cols = FIELDS[:-2]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(f"{c:<{width[c]}}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r[c]):<{width[c]}}" for c in cols))


def write_csv(rows: list[dict], out: str | Path) -> Path:
    path = Path(out) / "step_ops.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="write DIR/step_ops.csv")
    ap.add_argument("--presets", default="", help="comma-separated (default: every FSDP2 one)")
    ap.add_argument("--world", type=int, default=1,
                    help="ranks (gloo processes; default 1: the one-rank switch)")
    ap.add_argument("--ranks-per-node", type=int, default=0,
                    help="ranks per node (default: all on one node)")
    ap.add_argument("--floor", action="store_true",
                    help="add the bare steps' host time (floor:none, floor:sdp4bit)")
    ap.add_argument("--op", choices=("sum", "avg"), default=None,
                    help="the gradients' reduce op (default: FSDP2's, avg with --world > 1)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("JSON" + json.dumps(_child(*json.loads(args.child))))
        return
    rows = measure(args.presets.split(",") if args.presets else None, world=args.world,
                   ranks_per_node=args.ranks_per_node or None, floor=args.floor, op=args.op)
    print_table(rows)
    if args.out:
        print(f"wrote {write_csv(rows, args.out)}")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)       # gloo threads can abort an ordinary interpreter exit (PLATFORM.md)
