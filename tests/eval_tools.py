"""The repository's developer-only eval generators (``eval/make_data.py``, ``eval/toy.py``:
not part of the installed package), importable from the tests."""

import sys
from pathlib import Path

EVAL_DIR = Path(__file__).resolve().parents[1] / "eval"
if str(EVAL_DIR) not in sys.path:
    sys.path.insert(0, str(EVAL_DIR))

import make_data  # noqa: E402
import toy  # noqa: E402

__all__ = ["EVAL_DIR", "make_data", "toy"]
