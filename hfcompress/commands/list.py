"""``hfcompress list``: the presets' inter-node bits per parameter per step, by the cost model
(``hfcompress.cost``: the 2 nodes x 1 rank table, or a layout given), and the compressors'
bits per value."""

from __future__ import annotations

import argparse
import json

from ..compressors import get_compressor, list_compressors
from ..compressors.base import ReferenceCoded
from ..config import CompressionConfig, get_config, list_presets
from ..cost import ClusterLayout, ClusterLinks, price_step
from ..cost.links import DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS
from ..cost.model_shape import ModelShape
from ..cost.units import Unit

LINKS = ClusterLinks(DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS)   # bytes do not depend on them
#: the 2 nodes x 1 rank table's model: one FSDP unit (every value re-gathered in backward, no
#: exact columns) of a 1 Mi-value shard per rank (``Compressor.bits_per_value``'s size)
PAIR, SHARD = ClusterLayout(2, 1), 1 << 20
PARTS = ("fwd", "bwd", "grads")


def list_command_parser(subparsers) -> None:
    p = subparsers.add_parser("list", help="presets with their inter-node bits per parameter "
                              "per step, compressors with their bits per value and defaults")
    p.add_argument("--nodes", type=int, default=None,
                   help="price the presets on this many nodes (cost model; default: the 2 "
                   "nodes x 1 rank table)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (with "
                   "--nodes; default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (inside a node)")
    p.set_defaults(func=list_command, parser=p)


def list_command(args: argparse.Namespace) -> None:
    """The 2 nodes x 1 rank table and the compressors, or the presets on a layout."""
    if args.nodes is not None or args.gpus_per_node is not None or args.tp != 1:
        return _list_layout(args)
    _list_pair()
    print("Compressors (hfcompress.get_compressor(NAME, **params)): bits per value on the "
          "wire, steady state (qwd: its first send is exact, 32), and defaults")
    for name in list_compressors():
        c = get_compressor(name)
        print(f"  {name:<16}{c.steady_bits_per_value():7.3f} bits/value  "
              f"{json.dumps(c.config())}")


def bits_per_param(config: CompressionConfig, units: list[Unit], layout: ClusterLayout,
                   params: float) -> dict[str, float]:
    """Bits one node's link carries per step (one direction, steady state, by the algorithm
    the backend runs) over ``params`` parameters: ``fwd`` / ``bwd`` (the weight all-gathers),
    ``grads`` (the reduce-scatter, or DDP's all-reduce)."""
    cost = price_step(config, units, layout, LINKS, compute_s=0.0)
    parts = dict.fromkeys(PARTS, 0.0)
    for c in cost.collectives:
        part = "fwd" if c.name.endswith("_fwd") else \
            "bwd" if c.name.endswith("_bwd") else "grads"
        parts[part] += c.link_bytes_per_node * 8 / params
    return parts


def engine(config: CompressionConfig) -> str:
    return "DDP" if config.all_reduce is not None else "FSDP2"


def pair_bits(config: CompressionConfig, exact: bool = False) -> dict[str, float]:
    """Bits per parameter crossing the one node boundary of :data:`PAIR`, both directions
    (both nodes' links over both shards); ``exact``: every value sent exactly."""
    unit = Unit("layer", 0, SHARD) if exact else Unit("layer", SHARD)
    return bits_per_param(config, [unit], PAIR, SHARD)


def _list_pair() -> None:
    """The presets on 2 nodes x 1 rank (ZeRO++ Table 5's accounting), with frozen parameters'
    bits, against each engine's exact collectives."""
    configs = {name: get_config(name) for name in list_presets()}
    ddp = next(c for c in configs.values() if engine(c) == "DDP")
    exact = {"FSDP2": sum(pair_bits(configs["none"]).values()),
             "DDP": sum(pair_bits(ddp, exact=True).values())}
    print("Presets (comm_compressor=NAME, hfcompress.apply(model, NAME)): inter-node bits per "
          "parameter per training step, steady state, 2 nodes x 1 rank, bf16 weights / fp32 "
          "gradients when exact (hfcompress.cost); x less: than the same engine "
          f"exact (FSDP2 {exact['FSDP2']:.0f}, DDP fp32 all-reduce {exact['DDP']:.0f})")
    print(f"  {'preset':<16}{'engine':>7}{'fwd AG':>8}{'bwd AG':>8}{'grads':>8}{'total':>8}"
          f"{'x less':>8}{'frozen':>8}")
    for name, cfg in configs.items():
        b = pair_bits(cfg)
        total = sum(b.values())
        print(f"  {name:<16}{engine(cfg):>7}{b['fwd']:>8.2f}{b['bwd']:>8.2f}"
              f"{b['grads']:>8.2f}{total:>8.2f}{exact[engine(cfg)] / total:>8.2f}"
              f"{_frozen_bits(cfg, b):>8.2f}")
    print(f"  {'auto':<16}chosen per collective at start from a probe of the links and this "
          f"device, among the loss-keeping schemes (HFCOMPRESS_AUTO pins a part)")
    print("frozen: bits per frozen parameter (requires_grad=False: a LoRA base model) per "
          "step; qWD sends them once, exactly, then never (hfcompress.comm.frozen); DDP never "
          "sends weights")


def _list_layout(args: argparse.Namespace) -> None:
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
                bits[name] = (bits_per_param(cfg, units, layout, shape.params), engine(cfg))
            except ValueError as e:      # a scheme that cannot serve this many ranks
                bits[name] = str(e)
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
        parts, kind = row
        total = sum(parts.values())
        less = f"{exact_total / total:>8.2f}" if total else f"{'inf':>8}"
        print(f"  {name:<16}{kind:>7}{parts['fwd']:>8.2f}{parts['bwd']:>8.2f}"
              f"{parts['grads']:>8.2f}{total:>8.2f}{less}")


def _frozen_bits(config: CompressionConfig, bits: dict[str, float]) -> float:
    """Inter-node bits per frozen parameter per steady-state step: no gradient; the weight
    all-gathers, except under a reference-coded scheme (qWD: the references already hold
    them, ``comm/frozen.py``) and DDP (no gathers)."""
    weights = config.weights
    if engine(config) == "DDP" or (weights is not None
                                   and isinstance(weights.build(), ReferenceCoded)):
        return 0.0
    return bits["fwd"] + bits["bwd"]
