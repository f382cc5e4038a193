"""Evaluation harness: lm-eval benchmarks (MMLU, GSM8K, ... from the hub; offline, the real
MMLU test set as ``mmlu_offline`` / ``mmlu_offline_cloze`` and arithmetic twins shipped with
hfcompress) for checkpoints, GGUF files, short names (``smollm2-135m``) or in-memory models,
checkpoint comparison tables, and a Trainer callback. Needs ``pip install 'hfcompress[eval]'``
(lm-eval).
"""

import os

from .compare_models import compare_models, comparison_rows, format_table, save, score_rows
from .harness import evaluate
from .errors import EvalError, TaskError
from .task_registry import CHANCE, OFFICIAL_NAMES, OFFLINE_TASKS, offline_config

#: the offline tasks as lm-eval YAML files: ``lm_eval --include_path TASKS_DIR --tasks ...``
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")

__all__ = ["CHANCE", "TASKS_DIR", "OFFICIAL_NAMES", "OFFLINE_TASKS", "EvalError", "TaskError",
           "offline_config", "evaluate", "compare_models", "comparison_rows", "format_table",
           "save", "score_rows", "LMEvalCallback"]


def __getattr__(name):  # lazy: the callback imports transformers (seconds)
    if name == "LMEvalCallback":
        from .callback import LMEvalCallback
        return LMEvalCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
