"""Shipped offline eval data (eval/make_data.py, hfcompress/eval/task_registry.py): deterministic, checkable
answers, no test leakage into few-shot rows, paths independent of the working directory, and
shipped in a non-editable install (the wheel)."""

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eval_tools import make_data
from hfcompress.eval import task_registry as tasks

ROOT = Path(__file__).resolve().parents[1]
FILES = ["arith_mmlu_test.jsonl", "arith_mmlu_dev.jsonl", "arith_gsm8k_test.jsonl",
         "arith_gsm8k_train.jsonl"]


def _rows(name):
    return [json.loads(x) for x in Path(tasks.data_file(name)).read_text().splitlines()]


def test_shipped_files_equal_a_fresh_generation(tmp_path):
    assert make_data.main(["--check"]) == 0
    assert make_data.main(["--out", str(tmp_path)]) == 0
    for f in FILES:  # a second generation is byte-identical (deterministic)
        assert (tmp_path / f).read_bytes() == Path(tasks.data_file(f)).read_bytes()
    (tmp_path / FILES[0]).write_text("{}\n")
    assert make_data.main(["--check", "--out", str(tmp_path)]) == 1


def _check_gsm8k_answer(answer: str) -> int:
    """Every <<expr=value>> evaluates to value; the final '#### n' is the last value."""
    calcs = re.findall(r"<<([0-9+\-*]+)=(-?\d+)>>", answer)
    assert calcs, answer
    for expr, value in calcs:
        assert eval(expr) == int(value), answer  # digits and + - * only (regex above)
    final = int(answer.rsplit("#### ", 1)[1])
    assert final == int(calcs[-1][1])
    return final


def test_formats_and_checkable_answers():
    mmlu, gsm = _rows("arith_mmlu_test.jsonl"), _rows("arith_gsm8k_test.jsonl")
    assert len(mmlu) == len(gsm) == 300
    for m, g in zip(mmlu, gsm):
        assert set(m) == {"question", "subject", "choices", "answer"}  # cais/mmlu columns
        assert set(g) == {"question", "answer"}  # openai/gsm8k columns
        assert m["question"] == g["question"]
        assert len(m["choices"]) == 4 == len(set(m["choices"])) and m["answer"] in range(4)
        assert int(m["choices"][m["answer"]]) == _check_gsm8k_answer(g["answer"])
        assert [int(c) for c in m["choices"]] == sorted(int(c) for c in m["choices"])
    assert len({m["question"] for m in mmlu}) == 300
    # the answer letter is uniform: 300 draws, expected 75 per letter, sd sqrt(300*.25*.75)=7.5;
    # 4 sd = 30 (rank of the answer among sorted choices drawn uniformly in make_data.mmlu_row)
    counts = [sum(m["answer"] == i for m in mmlu) for i in range(4)]
    assert all(abs(c - 75) <= 30 for c in counts), counts


def test_fewshot_rows_are_disjoint_from_test_and_toy_data_is_reworded():
    test_q = {r["question"] for r in _rows("arith_mmlu_test.jsonl")}
    shots = _rows("arith_mmlu_dev.jsonl") + _rows("arith_gsm8k_train.jsonl")
    assert len(shots) == 105 and not test_q & {r["question"] for r in shots}
    for r in _rows("arith_gsm8k_train.jsonl"):
        _check_gsm8k_answer(r["answer"])
    facts = {(p["kind"], p["nums"]) for p in make_data.test_problems()}
    rew = make_data.reworded_test_problems(500, seed=3)
    assert not test_q & {p["question"] for p in rew}  # never a test question's text
    assert {(p["kind"], p["nums"]) for p in rew} <= facts  # only the test arithmetic


def test_task_configs_use_absolute_paths_from_any_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in tasks.OFFLINE_TASKS:
        cfg = tasks.offline_config(name)
        assert cfg["task"] == name and cfg["dataset_path"] == "json"
        for path in cfg["dataset_kwargs"]["data_files"].values():
            assert Path(path).is_absolute() and Path(path).is_file()
    assert tasks.offline_equivalents("mmlu_anatomy") == ["mmlu_offline", "mmlu_offline_cloze",
                                                         "arith_mmlu", "arith_mmlu_cont"]
    assert tasks.offline_equivalents("gsm8k_cot") == ["arith_gsm8k"]
    assert tasks.offline_equivalents("arc_easy") == ["arith_mmlu_cont"]
    assert tasks.task_names(" arith_mmlu, arith_gsm8k,") == ["arith_mmlu", "arith_gsm8k"]


def test_wheel_ships_the_data(tmp_path):
    """A non-editable install gets the jsonl files ([tool.setuptools.package-data])."""
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    shutil.copytree(ROOT / "hfcompress", src / "hfcompress",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("hfcompress-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in FILES:
        assert f"hfcompress/eval/data/{f}" in names
    assert "hfcompress/eval/task_registry.py" in names
