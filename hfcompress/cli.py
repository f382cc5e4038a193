"""The ``hfcompress`` command line: one parser per command (``commands/``)."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .commands.compare import compare_command_parser
from .commands.demo import demo_command_parser
from .commands.eval import eval_command_parser
from .commands.list import list_command_parser
from .commands.plan import plan_command_parser
from .commands.probe import probe_command_parser

DESCRIPTION = "Command line: hfcompress list, plan, probe, demo, compare and eval."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hfcompress", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"hfcompress {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in (list_command_parser, plan_command_parser, probe_command_parser,
                       demo_command_parser, compare_command_parser, eval_command_parser):
        add_parser(sub)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:     # the reader left (`hfcompress list | head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + 13) from None     # as a tool killed by SIGPIPE (13)


if __name__ == "__main__":
    main()
