"""Bad input to the eval harness: missing / wrong checkpoint paths, unknown task names (with
close matches), and a hub task while the hub is switched off (names the offline tasks)."""

import math
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from eval_tools import toy
from hfcompress.eval import EvalError, TaskError, compare_models, evaluate
from hfcompress.eval.harness import check_checkpoint
from hfcompress.eval.task_registry import check_names

pytest.importorskip("lm_eval", reason="the eval harness needs pip install 'hfcompress[eval]'")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained tiny LLaMA with its tokenizer, saved with save_pretrained."""
    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = toy.train_tokenizer([p + a for p, a in toy.training_pairs(200)])
    toy.tiny_model(tok).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_missing_checkpoint_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in (str(tmp_path / "nope"), "./nope", "~/no/such/ckpt", "out/run1"):
        if path == "out/run1":
            os.mkdir("out")  # "out" exists locally: out/run1 is a path, not a hub id
        with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
            evaluate(path, ["arith_mmlu"])
    with pytest.raises(FileNotFoundError, match="not found"):
        compare_models([str(tmp_path / "gone"), str(tmp_path / "gone2")], "arith_mmlu")


def test_eval_script_reports_a_missing_checkpoint(tmp_path, monkeypatch, capsys):
    """eval/recipes.py (the repository's script) exits 2 with a one-line error."""
    monkeypatch.setattr(sys, "argv", ["recipes.py", "arith", "--model", str(tmp_path / "none"),
                                      "--limit", "5", "--output", str(tmp_path / "r.csv")])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "eval" / "recipes.py"), run_name="__main__")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"hfcompress eval: error: checkpoint directory not found: '{tmp_path / 'none'}'"


def test_hub_id_while_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hub is switched off"):
        check_checkpoint("EleutherAI/pythia-70m", need_tokenizer=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    # online, a hub id is passed through to transformers (no hub here: not loaded)
    assert check_checkpoint("EleutherAI/pythia-70m", need_tokenizer=True) == "EleutherAI/pythia-70m"


def test_directory_that_is_not_a_checkpoint(tmp_path, checkpoint):
    for sub in ("checkpoint-100", "checkpoint-200"):
        (tmp_path / sub).mkdir()
    with pytest.raises(EvalError, match="no config.json.*checkpoint-100, checkpoint-200"):
        evaluate(str(tmp_path), ["arith_mmlu"])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(open(os.path.join(checkpoint, "config.json")).read())
    with pytest.raises(EvalError, match="no tokenizer.*tokenizer="):
        evaluate(str(bare), ["arith_mmlu"])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    with pytest.raises(EvalError, match="needs tokenizer="):
        evaluate(model, ["arith_mmlu"])
    with pytest.raises(EvalError, match="device / dtype apply when loading a checkpoint"):
        evaluate(model, ["arith_mmlu"], tokenizer=AutoTokenizer.from_pretrained(checkpoint),
                 device="cpu")


def test_unknown_task_lists_close_matches():
    with pytest.raises(TaskError) as e:
        check_names(["arith_mmlu_cnt"])
    assert "unknown task 'arith_mmlu_cnt'" in str(e.value) and "arith_mmlu_cont" in str(e.value)
    with pytest.raises(TaskError) as e:  # a misspelt lm-eval task: lm-eval's own names
        check_names(["arith_gsm8k", "hellaswg"])
    assert "'hellaswg'" in str(e.value) and "hellaswag" in str(e.value)
    check_names(["arith_mmlu", "mmlu", "gsm8k", "hellaswag", "arc_easy"])  # all known
    with pytest.raises(TaskError, match="no tasks"):
        check_names([])


def test_hub_task_while_offline_names_offline_equivalents(checkpoint):
    """Through the CLI, as a user would: HF_HUB_OFFLINE=1, `hfcompress eval CKPT --tasks gsm8k`.

    A subprocess, because `datasets` reads HF_DATASETS_OFFLINE when it is imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "hfcompress.cli", "eval", checkpoint,
                           "--tasks", "gsm8k", "--limit", "2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.splitlines()[-1]
    assert err.startswith("hfcompress eval: error: task 'gsm8k' could not load its dataset"), err
    assert "The hub is switched off" in err and "Offline equivalents" in err
    assert err.rstrip().endswith("arith_gsm8k"), err


def test_cli_accepts_lm_eval_flag_names():
    """``hfcompress eval`` takes lm-eval's own spellings next to the dashed ones."""
    import argparse

    from hfcompress.eval.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    for flags in (["--num_fewshot", "3", "--batch_size", "4", "--output_path", "out"],
                  ["--num-fewshot", "3", "--batch-size", "4", "--output-path", "out"]):
        a = p.parse_args(["model", *flags])
        assert (a.num_fewshot, a.batch_size, a.output_path) == (3, 4, "out")


def test_scores_at_chance_level_get_a_note():
    """A score within two standard errors of guessing is named as such (it cannot tell
    compressors apart); a clear score, or a metric without a known chance, is not."""
    from hfcompress.eval.compare_models import chance_notes

    rows = [dict(model="m", task="mmlu_offline_stem", metric="acc", filter="none", value=0.26,
                 stderr=0.02),
            dict(model="m", task="arith_mmlu", metric="acc", filter="none", value=0.61,
                 stderr=0.02),
            dict(model="m", task="arith_gsm8k", metric="exact_match", filter="strict-match",
                 value=0.0, stderr=0.0),
            dict(model="m", task="wikitext", metric="word_perplexity", filter="none",
                 value=0.25, stderr=math.nan)]
    notes = chance_notes(rows)
    assert len(notes) == 2
    assert "mmlu_offline_stem (acc), chance level 0.25" in notes[0]
    assert "arith_gsm8k (exact_match), chance level 0" in notes[1]
