"""``hfcompress plan``: the arguments of the planner (``cost/plan.py``) and its report
printed, as text or JSON."""

from __future__ import annotations

import argparse
import json

from ..cost.gpus import DEFAULT_MEMORY_GB, GPUS, MEASURED_ON
from ..cost.links import DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS, NOMINAL_EFFICIENCY
from ..cost.plan import LOSS_KEEPING, plan
from ..cost.report import render_text
from ..cost.collectives import BUCKET_BYTES
from ..cost.step_model import DTYPE_BYTES, ENGINES
from .model_args import add_model_arguments, model_shape

DESCRIPTION = """What each preset saves on a cluster you describe (the cost model of
hfcompress.cost): the inter-node bytes per node per step of each collective by the
algorithm the backend runs (ring / direct all-to-all / 2-hop), communication, exposed
communication (FSDP2 hides its all-gathers and reduce-scatters behind compute, but the
last reduce-scatter; zero3 and megatron expose everything) and codec seconds, step seconds and speedup over none, compressor state per GPU,
the full-overlap limit, and a recommendation. Bandwidths are effective, not the data sheet's:
fit them to a few measured steps with --calibrate. Example: hfcompress plan --hidden 8192
--layers 80 --ffn 28672 --heads 64 --kv-heads 8 --nodes 16 --gpus-per-node 8 --gpu-tflops 400"""


def plan_command_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="what each preset saves on a cluster you describe: "
                              "bytes per node link, exposed communication, step time, "
                              "speedup", description=DESCRIPTION)
    add_model_arguments(p.add_argument_group(
        "model: --model, or its sizes (LLaMA-style decoder)"))
    r = p.add_argument_group("batch")
    r.add_argument("--seq-len", type=int, default=4096, help="tokens per sample (4096)")
    r.add_argument("--micro-batch", type=int, default=1, help="samples per DP rank per "
                   "micro-batch (1)")
    r.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer "
                   "step (1): compute for each; fsdp2 (HF Trainer / Accelerate) gathers the "
                   "weights every micro-batch and reduces the gradients once per step (no_sync: "
                   "set_requires_gradient_sync(False)), fsdp2_each_batch (FSDP2 with "
                   "sync_each_batch) and zero3 (DeepSpeed ZeRO-3) both every micro-batch, "
                   "megatron both once per step, ddp reduces once per step")
    _add_cluster_arguments(p.add_argument_group("cluster"))
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
    p.set_defaults(func=plan_command, parser=p)


def _add_cluster_arguments(c) -> None:
    c.add_argument("--nodes", type=int, required=True)
    c.add_argument("--gpus-per-node", type=int, default=8, help="(8)")
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel size, inside a node (1)")
    c.add_argument("--pp", type=int, default=1, help="pipeline stages, whole nodes each (1)")
    c.add_argument("--cp", type=int, default=1, help="context-parallel size, inside a node (1)")
    c.add_argument("--inter-node-gbps", type=float, help="effective Gbit/s of "
                   "one node's network link, all its NICs, one direction; wins over --links "
                   f"(default: the --links file's, else {DEFAULT_INTER_GBPS:g}: about what "
                   "SDP4Bit's H800 nodes, 8 x 400 Gbit/s NICs, gave their data-parallel "
                   "collectives, 0.13-0.14 of the sum; fit yours: --calibrate)")
    c.add_argument("--nominal-inter-node-gbps", type=float, metavar="GBPS", help="instead "
                   "of --inter-node-gbps when you know only the data sheet's (NICs x rate): "
                   f"priced at x {NOMINAL_EFFICIENCY[1]:g}, the median effective / stated of "
                   "the papers' fitted clusters, with the answers at their extremes "
                   f"(x {NOMINAL_EFFICIENCY[0]:g} .. x {NOMINAL_EFFICIENCY[2]:g}) printed")
    c.add_argument("--intra-node-gbps", type=float, help="effective Gbit/s per GPU inside a "
                   "node; wins over --links (default: the --links file's, else "
                   f"{DEFAULT_INTRA_GBPS:g}: two thirds of H100 NVLink's 450 GB/s a "
                   "direction)")
    c.add_argument("--links", metavar="FILE", help="the JSON of hfcompress probe: the "
                   "measured effective bandwidths and latencies (per node link / per GPU, so "
                   "usable on another layout than the one it was measured on) and codec "
                   "rates, in place of the defaults and the H200's rates; --inter-node-gbps "
                   "/ --intra-node-gbps given explicitly still win")
    c.add_argument("--engine", choices=ENGINES, default="fsdp2", help="fsdp2 / "
                   "fsdp2_each_batch: prefetch hides the weight all-gathers (forward and "
                   "backward) and backward hides the reduce-scatters but the last, all on one "
                   "link; zero3 (DeepSpeed ZeRO-3, as the ZeRO++ paper measured it) and "
                   "megatron: nothing hidden, megatron gathering the weights once per step; "
                   "ddp: DistributedDataParallel, each preset's all-reduce form, its buckets "
                   "hidden behind backward but the last (--bucket-mb); see --grad-accum")
    c.add_argument("--bucket-mb", type=float, default=BUCKET_BYTES / 2 ** 20, help="DDP's "
                   f"bucket_cap_mb (--engine ddp and the DDP presets; {BUCKET_BYTES >> 20})")
    c.add_argument("--gather-dtype", choices=DTYPE_BYTES, default="bf16", help="dtype of the "
                   "exact weight all-gathers (bf16: FSDP2 mixed precision; fp16: DeepSpeed on "
                   "V100; fp32: no mixed precision)")
    c.add_argument("--reduce-dtype", choices=DTYPE_BYTES, default="fp32", help="dtype of the "
                   "exact gradient reduction (fp32: FSDP2's reduce_dtype; bf16 / fp16: "
                   "DeepSpeed ZeRO-3, Megatron's default)")
    c.add_argument("--gpu", choices=GPUS, type=str.lower, help="the GPU: its memory (see "
                   "--gpu-memory-gb) and its HBM bandwidth, which scales the codec rates "
                   f"measured on an {MEASURED_ON.upper()} (memory-bound kernels; without it: "
                   "the H200's rates)")
    c.add_argument("--gpu-memory-gb", type=float, metavar="GB", help="GPU memory (default: "
                   f"the --gpu's, else {DEFAULT_MEMORY_GB:g}, as printed): a preset whose "
                   "compressor state plus the model's sharded training state (18 B per "
                   "parameter a GPU holds: bf16 + fp32 master + 2 fp32 Adam moments + fp32 "
                   "gradient; activations not counted) exceeds it does not fit (marked !) and "
                   "is never recommended")
    c.add_argument("--hbm-gbps", type=float, metavar="GB/S", help="the GPU's memory "
                   "bandwidth in GB/s, instead of the --gpu's: codec rates = the H200's x "
                   "this / 4800")


def _check_numbers(args: argparse.Namespace) -> None:
    """Exactly one of --step-time / --gpu-tflops, and every number given > 0."""
    if (args.step_time is None) == (args.gpu_tflops is None):
        args.parser.error("give exactly one of --step-time S (the measured step of the exact "
                          "baseline, none: compute = it minus none's exposed communication) "
                          "or --gpu-tflops T (compute from 6 x params x tokens)" +
                          (", not both" if args.step_time is not None else ""))
    for flag in ("seq_len", "micro_batch", "grad_accum", "step_time", "gpu_tflops",
                 "inter_node_gbps", "nominal_inter_node_gbps", "intra_node_gbps", "bucket_mb",
                 "gpu_memory_gb", "hbm_gbps"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            args.parser.error(f"--{flag.replace('_', '-')} {value:g} must be > 0")


def plan_command(args: argparse.Namespace) -> None:
    """The planner on the parsed arguments; a bad input: one line, exit 2."""
    _check_numbers(args)
    try:
        report = plan(
            model_shape(args), [p.strip() for p in args.presets.split(",") if p.strip()],
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, tp=args.tp, pp=args.pp,
            cp=args.cp, engine=args.engine, seq_len=args.seq_len,
            micro_batch=args.micro_batch, grad_accum=args.grad_accum,
            gather_dtype=args.gather_dtype, reduce_dtype=args.reduce_dtype,
            step_time=args.step_time, gpu_tflops=args.gpu_tflops,
            inter_node_gbps=args.inter_node_gbps,
            nominal_inter_node_gbps=args.nominal_inter_node_gbps,
            intra_node_gbps=args.intra_node_gbps,
            links_file=args.links, calibrate=args.calibrate, gpu=args.gpu,
            gpu_memory_gb=args.gpu_memory_gb, hbm_gbps=args.hbm_gbps,
            bucket_bytes=int(args.bucket_mb * 2 ** 20))
    except ValueError as e:     # ModelShapeError, LinksFileError, CalibrationError, layout
        args.parser.error(str(e))
    report = {"inputs": {k: v for k, v in vars(args).items() if k not in ("func", "parser")},
              **report}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(render_text(report))
    if "warning" in report:
        print(f"warning: {report['warning']}")
