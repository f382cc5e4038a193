"""Command line: ``hfcompress list``, ``plan``, ``probe``, ``demo``, ``compare`` and ``eval``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import NoReturn

from . import __version__
from .auto.links_file import cluster_links as links_from_file
from .auto.links_file import codec_rates, describe_layout, load as load_links_file
from .compressors import get_compressor, list_compressors
from .compressors.base import ReferenceCoded
from .config import EXACT_GRAD_BITS, get_config, list_presets, preset_bits
from .cost import ENGINES, ClusterLayout, ClusterLinks, compute_from_baseline, price_step
from .cost.calibrate import fit_inter_node_gbps, load_runs
from .cost.model_shape import ModelShape
from .cost.step_model import DTYPE_BYTES
from .cost.report import plan_report, render_text


def _cmd_list(args: argparse.Namespace) -> None:
    if args.nodes is not None or args.gpus_per_node is not None or args.tp != 1:
        return _cmd_list_layout(args)
    exact = {"FSDP2": preset_bits("none")["total"], "DDP": 2.0 * EXACT_GRAD_BITS}
    print("Presets (comm_compressor=NAME, hfcompress.apply(model, NAME)): inter-node bits per "
          "parameter per training step, steady state, 2 nodes x 1 rank, bf16 weights / fp32 "
          "gradients when exact (hfcompress.config.preset_bits); x less: than the same engine "
          f"exact (FSDP2 {exact['FSDP2']:.0f}, DDP fp32 all-reduce {exact['DDP']:.0f})")
    print(f"  {'preset':<16}{'engine':>7}{'fwd AG':>8}{'bwd AG':>8}{'grads':>8}{'total':>8}"
          f"{'x less':>8}{'frozen':>8}")
    for name in list_presets():
        b = preset_bits(name)
        print(f"  {name:<16}{b['engine']:>7}{b['weights_fwd']:>8.2f}{b['weights_bwd']:>8.2f}"
              f"{b['grads']:>8.2f}{b['total']:>8.2f}{exact[b['engine']] / b['total']:>8.2f}"
              f"{_frozen_bits(name, b):>8.2f}")
    print(f"  {'auto':<16}chosen per collective at start from a probe of the links and this "
          f"device, among the loss-keeping schemes (HFCOMPRESS_AUTO pins a part)")
    print("frozen: bits per frozen parameter (requires_grad=False: a LoRA base model) per "
          "step; qWD sends them once, exactly, then never (hfcompress.comm.frozen); DDP never "
          "sends weights")
    print("Compressors (hfcompress.get_compressor(NAME, **params)): bits per value on the "
          "wire, steady state (qwd: its first send is exact, 32), and defaults")
    for name in list_compressors():
        c = get_compressor(name)
        print(f"  {name:<16}{c.steady_bits_per_value():7.3f} bits/value  "
              f"{json.dumps(c.config())}")


def _cmd_list_layout(args: argparse.Namespace) -> None:
    """``list --nodes N --gpus-per-node G [--tp T]``: every preset's inter-node bits per
    parameter per step on one node's link (one direction), by the cost model (``cost/``)."""
    shape = ModelShape(hidden=4096, layers=32)      # LLaMA-2 7B's shape: a large model
    try:
        layout = ClusterLayout(args.nodes or 2, args.gpus_per_node or 1, tp=args.tp)
        bits: dict[str, tuple | str] = {}
        for name in list_presets():
            cfg = get_config(name)
            try:
                units = shape.unit_counts(layout, cfg.exact_patterns, cfg.min_numel)
                cost = price_step(cfg, units, layout, ClusterLinks(400.0, 2400.0),
                                  compute_s=0.0)
            except ValueError as e:      # a scheme that cannot serve this many ranks
                bits[name] = str(e)
                continue
            parts = {"fwd": 0.0, "bwd": 0.0, "grads": 0.0}
            for c in cost.collectives:
                part = "fwd" if c.name.endswith("_fwd") else \
                    "bwd" if c.name.endswith("_bwd") else "grads"
                parts[part] += c.link_bytes_per_node * 8 / shape.params
            bits[name] = (parts, "DDP" if cfg.all_reduce is not None else "FSDP2")
    except ValueError as e:
        args.parser.error(str(e))
    print(f"Presets on {layout.nodes} nodes x {layout.gpus_per_node} GPUs (tp {layout.tp}: "
          f"{layout.dp_per_node} DP ranks per node, {layout.groups_per_node} DP group(s) per "
          f"node): inter-node bits per parameter per training step that one node's link "
          f"carries, one direction, by the algorithm the backend runs (ring / direct / 2-hop; "
          f"hfcompress.cost), steady state, a LLaMA-2 7B-shaped model, bf16 weights / fp32 "
          f"gradients when exact; x less: than none (exact FSDP2). Without --nodes / "
          f"--gpus-per-node: the 2 nodes x 1 rank table, counting both directions of its "
          f"one boundary")
    print(f"  {'preset':<16}{'engine':>7}{'fwd AG':>8}{'bwd AG':>8}{'grads':>8}{'total':>8}"
          f"{'x less':>8}")
    exact_total = sum(bits["none"][0].values())
    for name, row in bits.items():
        if isinstance(row, str):
            print(f"  {name:<16}cannot run here: {row}")
            continue
        parts, engine = row
        total = sum(parts.values())
        less = f"{exact_total / total:>8.2f}" if total else f"{'inf':>8}"
        print(f"  {name:<16}{engine:>7}{parts['fwd']:>8.2f}{parts['bwd']:>8.2f}"
              f"{parts['grads']:>8.2f}{total:>8.2f}{less}")


def _frozen_bits(name: str, bits: dict) -> float:
    """Inter-node bits per frozen parameter per steady-state step: no gradient; the weight
    all-gathers, except under a reference-coded scheme (qWD: the references already hold
    them, ``comm/frozen.py``) and DDP (no gathers)."""
    weights = get_config(name).weights
    if bits["engine"] == "DDP" or (weights is not None
                                   and isinstance(weights.build(), ReferenceCoded)):
        return 0.0
    return bits["weights_fwd"] + bits["weights_bwd"]


#: presets whose training loss the benchmarks keep within 1% of ``none`` (BENCHMARKS.md "Loss
#: kept", at both learning rates): not ``zeropp`` (int4 gradients, +3.6% at lr 3e-3,
#: auto/candidates.py), ``qw`` (4-bit weights, +1.7%) nor the DDP presets (another engine)
LOSS_KEEPING = ("none", "qwd", "tlq_hs", "sdp4bit", "loco")
PLAN_DESCRIPTION = """What each preset saves on a cluster you describe (the cost model of
hfcompress.cost): the inter-node bytes per node per step of each collective by the
algorithm the backend runs (ring / direct all-to-all / 2-hop), communication, exposed
communication (FSDP2 prefetch hides the weight all-gathers behind compute; megatron exposes
everything) and codec seconds, step seconds and speedup over none, compressor state per GPU,
the full-overlap limit, and a recommendation. Bandwidths are effective, not the data sheet's:
fit them to a few measured steps with --calibrate. Example: hfcompress plan --hidden 8192
--layers 80 --ffn 28672 --heads 64 --kv-heads 8 --nodes 16 --gpus-per-node 8 --gpu-tflops 400"""
DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS = 400.0, 2400.0
SHAPE_FLAGS = ("hidden", "layers", "ffn", "vocab", "heads", "kv_heads", "experts",
               "experts_per_token", "tied_embeddings")


def _add_model_arguments(m) -> None:
    """``--model`` or the sizes of :data:`SHAPE_FLAGS` (``plan``, ``probe``: ``_plan_shape``)."""
    m.add_argument("--model", metavar="NAME_OR_PATH", help="an HF config.json, a folder with "
                   "one, or a hub id already in the local HF cache (never downloaded)")
    m.add_argument("--hidden", type=int, help="hidden size")
    m.add_argument("--layers", type=int, help="decoder layers")
    m.add_argument("--ffn", type=int, help="MLP width (default: LLaMA's, 8/3 x hidden rounded "
                   "up to 256)")
    m.add_argument("--vocab", type=int, help="vocabulary (default 32000)")
    m.add_argument("--heads", type=int, help="attention heads (default hidden / 128)")
    m.add_argument("--kv-heads", type=int, help="key / value heads (GQA; default: heads)")
    m.add_argument("--experts", type=int, help="MoE experts per layer (all communicated)")
    m.add_argument("--experts-per-token", type=int, help="MoE top-k (compute only; default: "
                   "every expert computes)")
    m.add_argument("--tied-embeddings", action="store_true", default=None,
                   help="the LM head shares the embedding matrix")


def _add_plan_arguments(p: argparse.ArgumentParser) -> None:
    _add_model_arguments(p.add_argument_group(
        "model: --model, or its sizes (LLaMA-style decoder)"))
    r = p.add_argument_group("batch")
    r.add_argument("--seq-len", type=int, default=4096, help="tokens per sample (4096)")
    r.add_argument("--micro-batch", type=int, default=1, help="samples per DP rank per "
                   "micro-batch (1)")
    r.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer "
                   "step (1): compute for each; fsdp2 (HF Trainer / Accelerate) gathers the "
                   "weights every micro-batch and reduces the gradients once per step (no_sync: "
                   "set_requires_gradient_sync(False)), zero3 (DeepSpeed ZeRO-3, or FSDP2 with "
                   "sync_each_batch) both every micro-batch, megatron both once per step")
    c = p.add_argument_group("cluster")
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--gpus-per-node", type=int, default=8, help="(8)")
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel size, inside a node (1)")
    c.add_argument("--pp", type=int, default=1, help="pipeline stages, whole nodes each (1)")
    c.add_argument("--cp", type=int, default=1, help="context-parallel size, inside a node (1)")
    c.add_argument("--inter-node-gbps", type=float, help="effective Gbit/s of "
                   "one node's network link, all its NICs, one direction; wins over --links "
                   "(default: the --links file's, else 400: about what "
                   "SDP4Bit's H800 nodes, 8 x 400 Gbit/s NICs, gave their data-parallel "
                   "collectives, 0.13-0.16 of the sum; fit yours: --calibrate)")
    c.add_argument("--intra-node-gbps", type=float, help="effective Gbit/s per GPU inside a "
                   "node; wins over --links (default: the --links file's, else 2400: two "
                   "thirds of H100 NVLink's 450 GB/s a direction)")
    c.add_argument("--links", metavar="FILE", help="the JSON of `hfcompress probe`: the "
                   "measured effective bandwidths and latencies (per node link / per GPU, so "
                   "usable on another layout than the one it was measured on) and codec "
                   "rates, in place of the defaults and the H200's rates; --inter-node-gbps "
                   "/ --intra-node-gbps given explicitly still win")
    c.add_argument("--engine", choices=ENGINES, default="fsdp2", help="fsdp2 / zero3: "
                   "prefetch hides the weight all-gathers (forward and backward) behind "
                   "compute; megatron: nothing hidden, weights gathered once per step; see "
                   "--grad-accum (fsdp2)")
    c.add_argument("--gather-dtype", choices=DTYPE_BYTES, default="bf16", help="dtype of the "
                   "exact weight all-gathers (bf16: FSDP2 mixed precision; fp16: DeepSpeed on "
                   "V100; fp32: no mixed precision)")
    c.add_argument("--reduce-dtype", choices=DTYPE_BYTES, default="fp32", help="dtype of the "
                   "exact gradient reduction (fp32: FSDP2's reduce_dtype; bf16 / fp16: "
                   "DeepSpeed ZeRO-3, Megatron's default)")
    c.add_argument("--gpu-memory-gb", type=float, metavar="GB", help="GPU memory: a preset "
                   "whose compressor state plus the model's sharded training state (18 B per "
                   "parameter a GPU holds: bf16 + fp32 master + 2 fp32 Adam moments + fp32 "
                   "gradient; activations not counted) exceeds it is marked ! and not "
                   "recommended")
    t = p.add_argument_group("compute: exactly one of")
    t.add_argument("--step-time", type=float, metavar="S", help="measured seconds per "
                   "optimizer step of the exact baseline (none) on this cluster and batch")
    t.add_argument("--gpu-tflops", type=float, metavar="T", help="TFLOP/s one GPU achieves "
                   "(compute = 6 x params x tokens + attention, / (tp x pp x cp) / T)")
    p.add_argument("--presets", default=",".join(LOSS_KEEPING), help="comma-separated presets "
                   f"(default: the loss-keeping ones, {','.join(LOSS_KEEPING)}; none is "
                   "always priced: the baseline)")
    p.add_argument("--calibrate", metavar="FILE", help="JSON list of runs measured on this "
                   "cluster (hidden, layers, seq_len, micro_batch, nodes, gpus_per_node, tp, "
                   "pp, preset, step_s per optimizer step; optional ffn, vocab, heads, "
                   "kv_heads, experts, cp, grad_accum, weight_bytes and grad_bytes: 2 or 4 "
                   "bytes per value of the exact gather / reduction, default those of "
                   "--gather-dtype / --reduce-dtype): fit the effective inter-node "
                   "bandwidth to them and use it instead of --inter-node-gbps")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="FILE", help="where rank 0 writes the JSON")
    _add_model_arguments(p.add_argument_group(
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


def _plan_shape(args: argparse.Namespace) -> ModelShape:
    """The model of ``--model`` or of the size flags; ValueError naming the fix."""
    given = [f"--{k.replace('_', '-')}" for k in SHAPE_FLAGS if getattr(args, k) is not None]
    if args.model is not None:
        if given:
            raise ValueError(f"--model {args.model} and {' '.join(given)}: give the model "
                             f"either as --model or as its sizes, not both")
        return ModelShape.from_config(args.model)
    if args.hidden is None or args.layers is None:
        raise ValueError("no model: give --model NAME_OR_PATH (an HF config.json, a folder, "
                         "or a cached hub id) or --hidden H --layers L [--ffn F --vocab V]")
    sizes = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    return ModelShape(**sizes, name="LLaMA-style decoder")


def _links_sources(args: argparse.Namespace, measured: dict | None) -> dict[str, str]:
    """Where the plan's inter- and intra-node bandwidths come from (``source`` /
    ``intra_source`` of the report's links): the flag, the --links file, or the default."""
    def source(key: str, default: float) -> str:
        flag = f"--{key.replace('_', '-')}"
        if getattr(args, key) is not None:
            return f"given: {flag}"
        if measured is not None and measured[key] is not None:
            return f"measured by hfcompress probe ({args.links}) on " \
                   f"{describe_layout(measured)}, {measured['device']}"
        unmeasured = "" if measured is None else f", {args.links} measured none"
        return f"the default {default:g}{unmeasured}: set {flag} or --links"

    return {"source": source("inter_node_gbps", DEFAULT_INTER_GBPS),
            "intra_source": source("intra_node_gbps", DEFAULT_INTRA_GBPS)}


def _plan_links(args: argparse.Namespace, measured: dict | None) -> ClusterLinks:
    """--inter-node-gbps / --intra-node-gbps, else the --links file's, else the defaults."""
    given = ClusterLinks(args.inter_node_gbps or DEFAULT_INTER_GBPS,
                         args.intra_node_gbps or DEFAULT_INTRA_GBPS)
    if measured is None:
        return given
    return links_from_file(measured, given, inter_node_gbps=args.inter_node_gbps,
                           intra_node_gbps=args.intra_node_gbps)


def _check_plan_numbers(args: argparse.Namespace) -> None:
    """Exactly one of --step-time / --gpu-tflops, and every number given > 0."""
    if (args.step_time is None) == (args.gpu_tflops is None):
        args.parser.error("give exactly one of --step-time S (the measured step of the exact "
                          "baseline, none: compute = it minus none's exposed communication) "
                          "or --gpu-tflops T (compute from 6 x params x tokens)" +
                          (", not both" if args.step_time is not None else ""))
    for flag in ("seq_len", "micro_batch", "grad_accum", "step_time", "gpu_tflops",
                 "inter_node_gbps", "intra_node_gbps", "gpu_memory_gb"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            args.parser.error(f"--{flag.replace('_', '-')} {value:g} must be > 0")


def _plan_compute(args: argparse.Namespace, shape: ModelShape, layout: ClusterLayout,
                  links: ClusterLinks, dtypes: dict) -> tuple[float, str]:
    """Compute seconds per optimizer step and where they come from: the measured --step-time
    minus none's exposed communication, or 6 x params x tokens at --gpu-tflops."""
    if args.step_time is not None:
        none = get_config("none")
        compute = compute_from_baseline(
            args.step_time, shape.unit_counts(layout, none.exact_patterns, none.min_numel),
            layout, links, engine=args.engine, grad_accum=args.grad_accum, **dtypes)
        return compute, f"the measured none step, {args.step_time:g} s, minus its exposed " \
                        f"communication"
    compute = args.grad_accum * shape.compute_seconds(layout, args.micro_batch, args.seq_len,
                                                      args.gpu_tflops)
    return compute, f"6 x params x tokens + attention at {args.gpu_tflops:g} TFLOP/s per GPU"


def _cmd_plan(args: argparse.Namespace) -> None:
    _check_plan_numbers(args)
    try:
        shape = _plan_shape(args)
        presets = [p.strip() for p in args.presets.split(",") if p.strip()]
        for name in presets:
            get_config(name)
        layout = ClusterLayout(args.nodes, args.gpus_per_node, tp=args.tp, pp=args.pp,
                               cp=args.cp)
        measured = load_links_file(args.links) if args.links else None
        links = _plan_links(args, measured)
        fitted = runs = None
        dtypes = dict(weight_bytes=DTYPE_BYTES[args.gather_dtype],
                      grad_bytes=DTYPE_BYTES[args.reduce_dtype])
        if args.calibrate:
            runs = load_runs(args.calibrate)
            fitted = fit_inter_node_gbps(runs, intra_node_gbps=links.intra_node_gbps,
                                         engine=args.engine, gpu_tflops=args.gpu_tflops,
                                         **dtypes)
            links = dataclasses.replace(links, inter_node_gbps=fitted)
        compute, source = _plan_compute(args, shape, layout, links, dtypes)
        report = plan_report(shape, layout, links, presets=presets, compute_s=compute,
                             compute_source=source, engine=args.engine, seq_len=args.seq_len,
                             micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                             gpu_memory_gb=args.gpu_memory_gb, loss_keeping=LOSS_KEEPING,
                             codec_rates=None if measured is None else codec_rates(measured),
                             **dtypes)
    except ValueError as e:     # ModelShapeError, CalibrationError, layout, preset names
        args.parser.error(str(e))
    report = {"inputs": {k: v for k, v in vars(args).items() if k not in ("func", "parser")},
              **report}
    report["links"].update(_links_sources(args, measured))
    if measured is not None:
        report["links"]["measured_layout"] = measured["layout"]
        report["codec"]["source"] = f"measured by hfcompress probe on {measured['device']}"
    if fitted is not None:
        report["links"]["source"] = f"fitted to {len(runs)} runs of {args.calibrate}"
        report["fitted_inter_node_gbps"] = fitted
        report["calibration_runs"] = len(runs)
    if args.step_time is not None:
        predicted = report["presets"]["none"]["step_s"]
        if predicted > args.step_time * 1.01:
            report["warning"] = (f"on these links none's step would take {predicted:.4g} s, "
                                 f"more than the measured {args.step_time:g} s: the links "
                                 f"are faster than {links.inter_node_gbps:g} Gbit/s per node; "
                                 f"fit them to measured runs with --calibrate")
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(render_text(report))
    if "warning" in report:
        print(f"warning: {report['warning']}")


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

    from .auto.cluster_probe import probe_layout

    if not dist.is_initialized() and "RANK" not in os.environ:
        args.parser.error("run it on every rank of the job, e.g. torchrun --nnodes N "
                          "--nproc_per_node 8 -m hfcompress.cli probe --out links.json "
                          "--model CONFIG (or accelerate launch)")
    if not args.max_mib > 0 or args.reps < 1:
        _refuse(args, f"--max-mib {args.max_mib:g} must be > 0 and --reps {args.reps} >= 1")
    world = dist.get_world_size() if dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE", "1"))
    sized = args.model is not None or any(getattr(args, k) is not None for k in SHAPE_FLAGS)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    try:
        shape = _plan_shape(args) if sized else None
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


def _cmd_probe(args: argparse.Namespace) -> None:
    """Every rank measures (``auto/cluster_probe.py``); rank 0 writes --out and prints."""
    import torch
    import torch.distributed as dist

    from .auto.cluster_probe import probe_cluster
    from .auto.links_file import save

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


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import compression_table, print_table

    print_table(compression_table(progress=lambda line: print(line, flush=True)))


def _cmd_compare(args: argparse.Namespace) -> None:
    from .compare_runs import compare

    code = compare(args.runs, args.plot, make_plot=not args.no_plot)
    if code:
        raise SystemExit(code)


def _cmd_eval(args: argparse.Namespace) -> None:
    from .eval.cli import run

    code = run(args)
    if code:
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hfcompress", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hfcompress {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="presets with their inter-node bits per parameter per "
                        "step, compressors with their bits per value and defaults")
    ls.add_argument("--nodes", type=int, default=None,
                    help="price the presets on this many nodes (cost model; default: the 2 "
                    "nodes x 1 rank table)")
    ls.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (with "
                    "--nodes; default 1)")
    ls.add_argument("--tp", type=int, default=1, help="tensor-parallel size (inside a node)")
    ls.set_defaults(func=_cmd_list, parser=ls)
    pl = sub.add_parser("plan", help="what each preset saves on a cluster you describe: bytes "
                        "per node link, exposed communication, step time, speedup",
                        description=PLAN_DESCRIPTION)
    _add_plan_arguments(pl)
    pl.set_defaults(func=_cmd_plan, parser=pl)
    pr = sub.add_parser("probe", help="under torchrun / accelerate launch: measure the "
                        "data-parallel groups' links at the model's message sizes and this "
                        "device's codec rates into a JSON for plan --links and auto "
                        "(HFCOMPRESS_LINKS_FILE)")
    _add_probe_arguments(pr)
    pr.set_defaults(func=_cmd_probe, parser=pr)
    sub.add_parser("demo", help="compress a small LLaMA's real weights and gradients with "
                   "every scheme and print the table").set_defaults(func=_cmd_demo)
    cmp = sub.add_parser("compare", help="table of training runs (their summary.json) and a "
                         "plot of loss vs step and vs wall-clock")
    cmp.add_argument("runs", nargs="+", metavar="RUN",
                     help="output directories of trainer_examples runs (or summary.json files)")
    cmp.add_argument("--plot", default=None, metavar="PNG",
                     help="where to save the plot (default: compare.png next to the runs)")
    cmp.add_argument("--no_plot", action="store_true", help="print the table only")
    cmp.set_defaults(func=_cmd_compare)
    from .eval.cli import EPILOG, add_arguments

    ev = sub.add_parser("eval", help="evaluate checkpoints with lm-eval (offline arithmetic "
                        "tasks or hub tasks) and compare them", epilog=EPILOG)
    add_arguments(ev)
    ev.set_defaults(func=_cmd_eval)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:     # the reader left (`hfcompress list | head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + 13) from None     # as a tool killed by SIGPIPE (13)


if __name__ == "__main__":
    main()
