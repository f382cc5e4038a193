"""``hfcompress demo``: every scheme on a small LLaMA's real weights and gradients."""

from __future__ import annotations

import argparse


def demo_command_parser(subparsers) -> None:
    subparsers.add_parser("demo", help="compress a small LLaMA's real weights and gradients "
                          "with every scheme and print the table").set_defaults(
                              func=demo_command)


def demo_command(args: argparse.Namespace) -> None:
    from ..demo import compression_table, print_table

    print_table(compression_table(progress=lambda line: print(line, flush=True)))
