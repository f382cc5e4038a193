"""Bad input that used to hurt (issue 23): one clear line, fast, for a corrupt
``summary.json``, ``hfcompress eval --dtype garbage`` / ``--limit -1`` / a mistyped task name
(rejected before lm-eval is imported, close matches offline tasks first), a model name
that does not exist (no minute of hub retries), and a mistake found after parsing under
``accelerate launch``. (Resuming: ``test_trainer_differential.py``, ``test_trainer_units.py``.)"""

import json
import os
import subprocess
import sys

import pytest

from hfcompress import models
from hfcompress.compare_runs import compare
from hfcompress.eval import EvalError, TaskError, evaluate
from hfcompress.eval import task_registry
from hfcompress.eval.cli import main as eval_main
from test_example_args import clm, launch_in


def test_corrupt_summary_json_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for text in ('{"run": "x", "steps": 3', "", "[1, 2]"):
        (run / "summary.json").write_text(text)
        assert compare([str(run)], make_plot=False) == 2
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1 and out[0].startswith(f"hfcompress compare: {run}/summary.json: "
                                                   f"not a valid summary"), out


@pytest.mark.parametrize("flag, value, message", [
    ("--dtype", "garbage", "argument --dtype: invalid choice: 'garbage'"),
    ("--limit", "-1", "argument --limit: -1.0: give a number of items per task"),
    ("--limit", "2.5", "argument --limit: 2.5: give a number of items per task"),
])
def test_eval_flags_are_checked(flag, value, message, capsys):
    with pytest.raises(SystemExit) as e:
        eval_main(["some/model", flag, value])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_evaluate_checks_limit_and_dtype_before_loading(tmp_path):
    with pytest.raises(EvalError, match="limit=-1"):
        evaluate(str(tmp_path / "none"), ["arith_mmlu"], limit=-1)
    with pytest.raises(EvalError, match="dtype='garbage'; allowed: auto, float32"):
        evaluate(str(tmp_path / "none"), ["arith_mmlu"], dtype="garbage")


def test_close_matches_put_offline_tasks_first():
    known = {f"mmlu_{s}" for s in ("other", "prox_ne", "prox_lite_ne", "ofl", "flan")}
    err = task_registry.unknown_task("mmlu_ofline", known)
    assert "close matches: mmlu_offline, mmlu_offline_cloze, " in str(err), err


def test_a_mistyped_task_is_refused_before_lm_eval_is_imported(tmp_path):
    """With lm-eval's task names cached (by the first full check), ``hfcompress eval``
    refuses a mistyped name without importing lm-eval or transformers (~10 s and more)."""
    from importlib.metadata import version

    index = tmp_path / f"lm_eval_tasks-{version('lm_eval')}.json"
    index.write_text(json.dumps(["mmlu", "mmlu_other", "gsm8k"]))
    code = ("import sys; from hfcompress.cli import main\n"
            "try:\n    main(['eval', 'smollm2-135m', '--tasks', 'mmlu_ofline'])\n"
            "except SystemExit as e:\n    print('exit', e.code)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lm_eval', 'transformers'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HFCOMPRESS_CACHE": str(tmp_path)}, timeout=300)
    assert proc.stdout.splitlines()[-2:] == ["exit 2", "[]"], proc.stdout + proc.stderr
    assert "unknown task 'mmlu_ofline'; close matches: mmlu_offline," in proc.stderr
    with pytest.raises(TaskError):       # the same check in the Python API
        os.environ["HFCOMPRESS_CACHE"] = str(tmp_path)
        try:
            task_registry.check_names_fast(["mmlu_ofline"])
        finally:
            del os.environ["HFCOMPRESS_CACHE"]


def test_model_names_that_do_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(models.ModelLoadError, match="'smollm2-1.7b': did you mean "
                       "'smollm2-135m'"):
        models.check_model("smollm2-1.7b")
    for path in ("./nope", "~/no/such/model", "/no/such/model"):
        with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
            models.check_model(path)
    assert models.check_model("org/model") == "org/model"       # a hub id: checked at load
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelLoadError, match="hub is switched off"):
        models.check_hub_reachable("org/model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(models, "_hub_reachable", lambda: False)
    with pytest.raises(models.ModelLoadError, match="cannot be reached"):
        models.load_tokenizer("org/model")
    models.check_hub_reachable(str(tmp_path))                    # a local folder: fine


def test_validation_errors_are_told_apart_from_crashes():
    try:
        models.check_model("smollm2-1.7b")
    except ValueError as e:
        assert clm.validation_error(e)
    try:
        int("x")
    except ValueError as e:
        assert not clm.validation_error(e)


def test_launched_mistake_after_parsing_is_one_line(tmp_path):
    """Under ``accelerate launch`` (2 processes), a hub id that cannot be loaded offline:
    one line from rank 0 among the first of the log, no traceback of a rank, a failing exit
    status (the launcher's own report of a failed child follows it)."""
    proc = launch_in(tmp_path, "--model_name_or_path", "org/no-such-model", "--max_steps", "1")
    log = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode != 0
    first = [i for i, line in enumerate(log) if line.startswith(
        "finetune_llama.py: error: 'org/no-such-model' is not a local folder")]
    assert len(first) == 1 and first[0] < 10, log
    assert not any("ModelLoadError" in line or "hfcompress/models.py" in line
                   for line in log), log
