"""Command line: ``hfcompress list``, ``hfcompress demo`` and ``hfcompress eval``."""

from __future__ import annotations

import argparse
import json

from .compressors import get_compressor, list_compressors


def _cmd_list(args: argparse.Namespace) -> None:
    for name in list_compressors():
        c = get_compressor(name)
        print(f"{name:<18} {c.bits_per_value():6.3f} bits/value  {json.dumps(c.config())}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import compression_table, print_table

    print_table(compression_table())


def _cmd_eval(args: argparse.Namespace) -> None:
    from .eval.cli import run

    code = run(args)
    if code:
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hfcompress", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered compressors, their bits per value and defaults"
                   ).set_defaults(func=_cmd_list)
    sub.add_parser("demo", help="compress a small LLaMA's real weights and gradients with "
                   "every scheme and print the table").set_defaults(func=_cmd_demo)
    from .eval.cli import EPILOG, add_arguments

    ev = sub.add_parser("eval", help="evaluate checkpoints with lm-eval (offline arithmetic "
                        "tasks or hub tasks) and compare them", epilog=EPILOG)
    add_arguments(ev)
    ev.set_defaults(func=_cmd_eval)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
