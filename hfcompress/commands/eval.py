"""``hfcompress eval``: checkpoints scored by lm-eval (``eval/cli.py``) and compared."""

from __future__ import annotations

import argparse


def eval_command_parser(subparsers) -> None:
    from ..eval.cli import EPILOG, add_arguments

    p = subparsers.add_parser("eval", help="evaluate checkpoints with lm-eval (offline "
                              "arithmetic tasks or hub tasks) and compare them", epilog=EPILOG)
    add_arguments(p)
    p.set_defaults(func=eval_command)


def eval_command(args: argparse.Namespace) -> None:
    from ..eval.cli import run

    code = run(args)
    if code:
        raise SystemExit(code)
