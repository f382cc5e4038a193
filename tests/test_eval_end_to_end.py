"""Offline end-to-end: train a tiny LLaMA on arithmetic word problems, evaluate it through
lm-eval (HFLM, in memory and from save_pretrained checkpoints) on the MMLU- and GSM8K-format
offline tasks, and compare two checkpoints with the CLI.

What the toy can show in 150 CPU steps (eval/toy.py): it is trained on the test
items' arithmetic restated with other names and things (never a test question's text), in the
``arith_mmlu_cont`` and ``arith_gsm8k`` prompts. On ``arith_mmlu_cont`` (4 choices scored by
likelihood, answer rank uniform: chance 0.25) it scores ~0.46 (0.45-0.48 over seeds 0-2;
0.47-0.54 after the toy's default 300 steps, twice the time); the test requires >= 0.35,
i.e. 4 standard errors above chance (sd of the accuracy of a guesser over 300 items =
sqrt(0.25 * 0.75 / 300) = 0.025). MMLU's letter format (``arith_mmlu``) and GSM8K exact
match stay near chance / near 0 for this toy: they are only checked to be valid scores.
It has memorized sums; it is no measure of generalization.
"""

import csv
import json
import math

import pytest
import torch
import yaml

from hfcompress.cli import main as cli_main
from eval_tools import toy
from hfcompress.eval import (CHANCE, OFFLINE_TASKS, comparison_rows, evaluate, format_table,
                             offline_config, score_rows)

pytest.importorskip("lm_eval", reason="the eval harness needs pip install 'hfcompress[eval]'")

THRESHOLD = 0.35  # arith_mmlu_cont acc; chance 0.25 + 4 sd (see module docstring)
STEPS = 150       # training steps of the toy (see module docstring)


@pytest.fixture(scope="module")
def one_thread():
    """A 128-wide model gains nothing from intra-op threads; 2 threads on a busy 2-core
    machine were 4x slower per step than 1."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def trained(one_thread):
    return toy.train(steps=STEPS, batch_size=32, seed=0)


@pytest.fixture(scope="module")
def checkpoints(trained, tmp_path_factory):
    """(untrained, trained) checkpoint directories, both with the tokenizer."""
    model, tok = trained
    root = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(1)
    for name, m in (("init", toy.tiny_model(tok)), ("trained", model)):
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return str(root / "init"), str(root / "trained")


def _valid(rows):
    for r in rows:
        assert math.isfinite(r["value"]) and 0.0 <= r["value"] <= 1.0, r
        assert math.isfinite(r["stderr"]) and r["stderr"] >= 0.0, r


def test_offline_end_to_end_in_memory(trained):
    model, tok = trained
    model.train()  # as at the end of training: evaluate must hand it back in train mode
    result = evaluate(model, list(OFFLINE_TASKS), tokenizer=tok, num_fewshot=0, batch_size=32)
    assert model.training
    model.eval()
    rows = score_rows(result)
    print("\n" + format_table(comparison_rows([result])))
    assert {(r["task"], r["metric"], r["filter"]) for r in rows} == {
        ("arith_mmlu", "acc", "none"), ("arith_mmlu_cont", "acc", "none"),
        ("arith_mmlu_cont", "acc_norm", "none"), ("arith_gsm8k", "exact_match", "strict-match"),
        ("arith_gsm8k", "exact_match", "flexible-extract")}
    _valid(rows)
    assert all(r["n"] == 300 for r in rows)
    acc = {(r["task"], r["metric"]): r["value"] for r in rows}
    assert acc[("arith_mmlu_cont", "acc")] >= THRESHOLD > CHANCE["arith_mmlu_cont"], acc
    json.dumps(result)  # JSON-able


def test_compare_two_checkpoints_cli(checkpoints, tmp_path, monkeypatch, capsys):
    """``hfcompress eval INIT TRAINED``: HFLM loads each save_pretrained directory from disk
    (device / dtype knobs), from an unrelated working directory."""
    init, trained = checkpoints
    monkeypatch.chdir(tmp_path)
    cli_main(["eval", init, trained, "--names", "init,trained", "--tasks",
              "arith_mmlu_cont,arith_gsm8k", "--limit", "100", "--num-fewshot", "0",
              "--batch-size", "32", "--device", "cpu", "--dtype", "float32",
              "--output", "cmp.json", "--output", "out/cmp.csv"])
    out = capsys.readouterr().out
    print(out)
    header = out.splitlines()[0].split()
    assert header[:4] == ["task", "metric", "init", "trained"] and "trained" in header[-1]
    assert "Δ" in out and "±" in out
    rows = json.load(open("cmp.json"))
    with open("out/cmp.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(rows) == len(csv_rows) == 2 * 4  # 2 models x (acc, acc_norm, 2 exact_match)
    for r, c in zip(rows, csv_rows):
        assert c["model"] == r["model"] and float(c["value"]) == r["value"]
    _valid(rows)
    by = {(r["model"], r["task"], r["metric"], r["filter"]): r for r in rows}
    for (model, task, metric, filt), r in by.items():
        b = by[("init", task, metric, filt)]
        assert r["baseline"] == "init" and r["n"] == 100
        assert r["delta"] == r["value"] - b["value"]
        assert r["delta_stderr"] == pytest.approx(math.hypot(r["stderr"], b["stderr"]))
    gain = by[("trained", "arith_mmlu_cont", "acc", "none")]
    # 100 items: sd of each accuracy <= 0.05, of the difference <= 0.071; trained ~0.46 vs
    # ~0.25
    assert gain["delta"] > 2 * gain["delta_stderr"] > 0, gain


def test_fewshot_defaults_and_limit(checkpoints):
    """Task defaults (MMLU 0-shot from ``dev``, GSM8K 5-shot from ``train``) and an explicit
    few-shot count both run; ``limit`` caps the items."""
    _, trained = checkpoints
    for shots in (None, 3):
        result = evaluate(trained, ["arith_mmlu", "arith_gsm8k"], num_fewshot=shots, limit=6,
                          batch_size=8, device="cpu")
        rows = score_rows(result)
        _valid(rows)
        assert {r["task"] for r in rows} == {"arith_mmlu", "arith_gsm8k"}
        assert all(r["n"] == 6 for r in rows)


def test_own_yaml_group_and_tag(checkpoints, tmp_path):
    """Names from an ``include_path`` folder go through lm-eval's TaskManager like ``mmlu``
    (a group) or ``ai2_arc`` (a tag) do online: the same code path, with local data."""
    _, trained = checkpoints
    for name, base in (("my_letters", "arith_mmlu"), ("my_cont", "arith_mmlu_cont")):
        cfg = {**offline_config(base), "task": name, "tag": "my_tag"}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "group.yaml").write_text(yaml.safe_dump({
        "group": "my_group", "task": ["my_letters", "my_cont"],
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
        "metadata": {"version": 1}}))
    result = evaluate(trained, ["my_group"], include_path=str(tmp_path), limit=5,
                      num_fewshot=0, device="cpu")
    rows = {(r["task"], r["metric"]): r for r in score_rows(result)}
    assert set(rows) == {("my_letters", "acc"), ("my_cont", "acc"), ("my_cont", "acc_norm"),
                         ("my_group", "acc")}
    group = rows[("my_group", "acc")]
    assert group["n"] == 10  # the aggregate of 2 x 5 items, weighted by size
    assert group["value"] == pytest.approx(
        (rows[("my_letters", "acc")]["value"] + rows[("my_cont", "acc")]["value"]) / 2)
    result = evaluate(trained, ["my_tag"], include_path=str(tmp_path), limit=5, num_fewshot=0)
    assert {r["task"] for r in score_rows(result)} == {"my_letters", "my_cont"}
