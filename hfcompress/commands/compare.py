"""``hfcompress compare``: training runs side by side, a table and a loss plot."""

from __future__ import annotations

import argparse


def compare_command_parser(subparsers) -> None:
    p = subparsers.add_parser("compare", help="table of training runs (their summary.json) "
                              "and a plot of loss vs step and vs wall-clock")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="output directories of trainer_examples runs (or summary.json files)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="where to save the plot (default: compare.png next to the runs)")
    p.add_argument("--no_plot", action="store_true", help="print the table only")
    p.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> None:
    from ..compare_runs import compare

    code = compare(args.runs, args.plot, make_plot=not args.no_plot)
    if code:
        raise SystemExit(code)
