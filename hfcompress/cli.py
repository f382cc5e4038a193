"""Command line: ``hfcompress list``, ``demo``, ``compare`` and ``eval``."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .compressors import get_compressor, list_compressors
from .compressors.base import ReferenceCoded
from .config import EXACT_GRAD_BITS, get_config, list_presets, preset_bits


def _cmd_list(args: argparse.Namespace) -> None:
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


def _frozen_bits(name: str, bits: dict) -> float:
    """Inter-node bits per frozen parameter per steady-state step: no gradient; the weight
    all-gathers, except under a reference-coded scheme (qWD: the references already hold
    them, ``comm/frozen.py``) and DDP (no gathers)."""
    weights = get_config(name).weights
    if bits["engine"] == "DDP" or (weights is not None
                                   and isinstance(weights.build(), ReferenceCoded)):
        return 0.0
    return bits["weights_fwd"] + bits["weights_bwd"]


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
    sub.add_parser("list", help="presets with their inter-node bits per parameter per step, "
                   "compressors with their bits per value and defaults"
                   ).set_defaults(func=_cmd_list)
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
    args.func(args)


if __name__ == "__main__":
    main()
