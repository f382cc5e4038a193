"""In-process A/B of the host time per step of two trees of hfcompress (issue 35): this one
and ``BASE``, a checkout of another commit imported beside it as the package
``hfcompress_base``, their steps and ``none``'s interleaved in one process (a load drift hits
them alike; separate runs of ``step_ops.py`` move +-10% on this shared machine).

    git worktree add /tmp/base <rev>
    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 \\
        python benchmarks/host_ab_trees.py /tmp/base [--preset sdp4bit] [--rounds 10]

The machine is ``step_ops.py``'s and ``host_ab.py``'s: the small LLaMA's FSDP units
(``gpu_check``'s CPU ``DIMS``) at world size 1 under the one-rank switch, the GPU's code
path with the launches stubbed, in both trees. Prints the median thread-CPU ms per step of
``rounds`` rounds of ``repeats`` steps each and each tree's ratio to ``none`` (this tree's).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import hfcompress
from host_ab import make_step
from step_ops import gpu_code_path, interleaved_ms


def import_tree(root: str, name: str = "hfcompress_base"):
    """The ``hfcompress`` package of the checkout at ``root`` as the package ``name``."""
    pkg = Path(root) / "hfcompress"
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="a checkout of the other commit (its repository root)")
    ap.add_argument("--preset", default="sdp4bit")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args()
    base = import_tree(args.base)
    torch.set_num_threads(1)
    stub = lambda self, *a, grid, warmup, **k: None  # noqa: E731
    for package in (hfcompress, base):
        gpu_code_path(stub, package.__name__)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store",
                            rank=0, world_size=1)
    with contextlib.ExitStack() as ctx:
        for package in (hfcompress, base):
            comm = f"{package.__name__}.comm"
            ctx.enter_context(importlib.import_module(f"{comm}.one_rank").compress_one_rank())
            ctx.enter_context(importlib.import_module(f"{comm}.futures").inline_on_cpu())
        steps = {"none": make_step("none"), "base": make_step(args.preset, package=base),
                 "this": make_step(args.preset)}
        res: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, ms in interleaved_ms(steps, args.repeats).items():
                res[name].append(ms)
    dist.destroy_process_group()
    print(f"{args.preset}: base {args.base} vs this tree, ms per step (median of "
          f"{args.rounds} rounds of {args.repeats})")
    for name, ms in res.items():
        print(name, round(statistics.median(ms), 3), [round(x, 2) for x in ms])
    for name in ("base", "this"):
        ratios = [a / b for a, b in zip(res[name], res["none"])]
        print(f"{name} / none", round(statistics.median(ratios), 3))


if __name__ == "__main__":
    main()
