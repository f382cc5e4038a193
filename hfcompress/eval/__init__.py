"""Evaluation harness: lm-eval benchmarks (MMLU, GSM8K, ... or their offline twins on shipped
arithmetic data) for checkpoints or in-memory models, checkpoint comparison tables, and a
Trainer callback. Needs ``pip install 'hfcompress[eval]'`` (lm-eval).
"""

from .compare import compare_models, comparison_rows, format_table, save, score_rows
from .harness import evaluate
from .tasks import CHANCE, OFFICIAL_NAMES, OFFLINE_TASKS, EvalError, TaskError, offline_config

__all__ = ["CHANCE", "OFFICIAL_NAMES", "OFFLINE_TASKS", "EvalError", "TaskError",
           "offline_config", "evaluate", "compare_models", "comparison_rows", "format_table",
           "save", "score_rows", "LMEvalCallback"]


def __getattr__(name):  # lazy: the callback imports transformers (seconds)
    if name == "LMEvalCallback":
        from .callback import LMEvalCallback
        return LMEvalCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
