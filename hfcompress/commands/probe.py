"""``hfcompress probe``: every rank of a launch measures its data-parallel groups' links and
this device's codec rates (``auto/cluster_probe.py``); rank 0 writes the links file
(``cost/links_file.py``)."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from ..cost.links_file import describe_layout, save
from ..cost.plan import LOSS_KEEPING
from .model_args import add_model_arguments, model_shape, sizes_given

DESCRIPTION = """Measure a job's links, on every rank of it (under torchrun or accelerate
launch): the effective bandwidths and latencies of the data-parallel groups' collectives at
the model's message sizes, and this device's codec rates. Rank 0 writes them to a JSON file
that hfcompress plan --links and auto (HFCOMPRESS_LINKS_FILE) read. Example: torchrun
--nnodes N --nproc_per_node 8 -m hfcompress.cli probe --out links.json --model CONFIG"""


def probe_command_parser(subparsers) -> None:
    p = subparsers.add_parser("probe", help="under torchrun / accelerate launch: measure the "
                              "data-parallel groups' links at the model's message sizes and "
                              "this device's codec rates into a JSON for plan --links and "
                              "auto (HFCOMPRESS_LINKS_FILE)", description=DESCRIPTION)
    p.add_argument("--out", required=True, metavar="FILE", help="where rank 0 writes the JSON")
    add_model_arguments(p.add_argument_group(
        "model whose message sizes to time (default: one unit of 1 Mi values per rank)"))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: the world splits "
                   "into tp data-parallel groups, TP innermost (1)")
    p.add_argument("--ranks-per-node", type=int, help="ranks per node (default: "
                   "LOCAL_WORLD_SIZE, as torchrun sets it)")
    p.add_argument("--presets", default=",".join(LOSS_KEEPING), help="presets whose "
                   "collectives and codecs to time (default: the loss-keeping ones)")
    p.add_argument("--max-mib", type=float, default=64.0, help="largest message timed, MiB "
                   "(64; a few on CPU keeps it short)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per size (3)")
    p.set_defaults(func=probe_command, parser=p)


def _launch_rank() -> int:
    """This process's rank: the process group's, else torchrun's ``RANK`` (0 alone)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def _refuse(args: argparse.Namespace, message: str) -> NoReturn:
    """A bad input every rank of the launch finds alike: rank 0 says it in one line and
    exits 2 (argparse's way), the others exit 2 quietly."""
    if _launch_rank() == 0:
        args.parser.error(message)
    raise SystemExit(2)


def _probe_inputs(args: argparse.Namespace) -> tuple[ModelShape | None, list[str]]:
    """The probe's model (None: the stand-in unit) and presets, every argument checked
    against the launch's world before any process group is made (:func:`_refuse`)."""
    import torch.distributed as dist

    from ..auto.cluster_probe import probe_layout

    if not dist.is_initialized() and "RANK" not in os.environ:
        args.parser.error("run it on every rank of the job, e.g. torchrun --nnodes N "
                          "--nproc_per_node 8 -m hfcompress.cli probe --out links.json "
                          "--model CONFIG (or accelerate launch)")
    if not args.max_mib > 0 or args.reps < 1:
        _refuse(args, f"--max-mib {args.max_mib:g} must be > 0 and --reps {args.reps} >= 1")
    world = dist.get_world_size() if dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE", "1"))
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    try:
        shape = model_shape(args) if sizes_given(args) else None
        probe_layout(world, shape, tp=args.tp, ranks_per_node=args.ranks_per_node,
                     presets=presets)
    except ValueError as e:     # ModelShapeError, preset names, --tp, --ranks-per-node
        _refuse(args, str(e))
    return shape, presets


def _out_problem(path: str) -> str | None:
    """Why the links file cannot be written at ``path`` (None: it can): opened for
    appending, as a write would open it, and left as it was."""
    path = os.path.expanduser(path)
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        folder = os.path.dirname(os.path.abspath(path))
        fix = f"create {folder} first" if not os.path.isdir(folder) else \
            "give a file path" if os.path.isdir(path) else "choose a path you can write"
        return f"--out {path}: cannot write it ({e.strerror}): {fix}"
    if not existed:
        os.remove(path)
    return None


def _check_out(args: argparse.Namespace) -> None:
    """Rank 0, which writes --out, tries it before the probe; every rank learns the verdict."""
    import torch.distributed as dist

    verdict = [_out_problem(args.out) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        _refuse(args, verdict[0])


def _init_probe_group() -> None:
    """The launch's process group: NCCL on this rank's GPU, else gloo."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def probe_command(args: argparse.Namespace) -> None:
    """Every rank measures (``auto/cluster_probe.py``); rank 0 writes --out and prints."""
    import torch
    import torch.distributed as dist

    from ..auto.cluster_probe import probe_cluster

    shape, presets = _probe_inputs(args)
    started = not dist.is_initialized()
    if started:
        _init_probe_group()
    try:
        _check_out(args)
        device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
        try:
            result = probe_cluster(shape, tp=args.tp, ranks_per_node=args.ranks_per_node,
                                   presets=presets, device=device,
                                   max_bytes=int(args.max_mib * (1 << 20)), reps=args.reps)
        except ValueError as e:     # the node layout against the ranks' hosts: alike on all
            _refuse(args, str(e))
        if dist.get_rank() == 0:
            save(result, args.out)
            print(f"hfcompress probe: {describe_layout(result)}, {result['device']}: "
                  f"{result['inter_node_gbps'] or 0:.4g} Gbit/s per node between nodes, "
                  f"{result['intra_node_gbps'] or 0:.4g} Gbit/s per GPU inside a node "
                  f"(0: nothing measured there); {len(result['fits'])} primitives, "
                  f"{len(result['codec_rates'])} codecs; the probe cost "
                  f"{result['probe_s']:.1f} s; wrote {args.out}")
    finally:
        if started:
            dist.destroy_process_group()
