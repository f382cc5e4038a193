"""Bad input that used to hurt (issue 23): one clear line, fast, for a corrupt
``summary.json``, ``hfcompress eval --dtype garbage`` / ``--limit -1`` / a mistyped task name
(rejected before lm-eval is imported, close matches offline tasks first),
``--resume_from_checkpoint True``, a model name that does not exist (no minute of hub
retries), and a mistake found after parsing under ``accelerate launch``."""

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

import hfcompress
from hfcompress import models
from hfcompress.compare_runs import compare
from hfcompress.eval import EvalError, TaskError, evaluate
from hfcompress.eval import task_registry
from hfcompress.eval.cli import main as eval_main
from hfcompress.testing import tiny_llama
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


def test_resume_from_checkpoint_true_as_a_string(tmp_path, monkeypatch, caplog):
    """``--resume_from_checkpoint True`` (a string from the command line) is HF's True: the
    newest complete checkpoint in output_dir (``trainer_state.json``, HF's last file, reads
    with its step); a missing folder, no checkpoint or an incomplete one is one clear error."""
    monkeypatch.setattr(transformers.Trainer, "train", lambda self, resume, *a, **k: resume)
    args = hfcompress.TrainingArguments(output_dir=str(tmp_path), report_to=[], max_steps=1)
    trainer = hfcompress.Trainer(model=tiny_llama(), args=args)
    with pytest.raises(ValueError, match="no checkpoint-\\* folder in output_dir"):
        trainer.train(resume_from_checkpoint="True")
    with pytest.raises(ValueError, match="resume_from_checkpoint='nope': no such folder"):
        trainer.train(resume_from_checkpoint="nope")
    for step in (2, 10, 9):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step}))
    assert trainer.train(resume_from_checkpoint="True") == str(tmp_path / "checkpoint-10")
    assert trainer.train(resume_from_checkpoint=True) == str(tmp_path / "checkpoint-10")
    assert trainer.train(resume_from_checkpoint="False") is None
    # a run stopped while saving: step 10's state file cut short, step 11's never written
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 1')
    (tmp_path / "checkpoint-11").mkdir()
    with caplog.at_level("WARNING"):
        assert trainer.train(resume_from_checkpoint=True) == str(tmp_path / "checkpoint-9")
    skipped = [r.getMessage() for r in caplog.records if "not resuming from" in r.getMessage()]
    assert len(skipped) == 2 and "checkpoint-11: it has no trainer_state.json" in skipped[0] \
        and "checkpoint-10: its trainer_state.json is unreadable" in skipped[1], skipped
    with pytest.raises(ValueError, match="checkpoint-10.* is incomplete: its trainer_state"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))
    (tmp_path / "checkpoint-9" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    with pytest.raises(ValueError, match="checkpoint-9.* is incomplete: .* of step 2"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-9"))
    for step in (2, 9, 10):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match="no complete checkpoint in output_dir.*checkpoint-11"):
        trainer.train(resume_from_checkpoint=True)


def test_resume_skips_a_checkpoint_cut_short_while_saving(tmp_path):
    """A real run stopped while writing checkpoint-4 (its weights cut short, no
    ``trainer_state.json``): ``True`` resumes from checkpoint-2 and reaches the same weights
    as the run that never stopped (HF's own True took checkpoint-4 and failed reading it)."""
    def run(out, resume=None):
        args = hfcompress.TrainingArguments(
            output_dir=str(out), max_steps=4, save_steps=2, per_device_train_batch_size=2,
            report_to=[], use_cpu=True, seed=0, data_seed=0, learning_rate=1e-2,
            disable_tqdm=True, logging_steps=1)
        ids = torch.randint(0, 256, (8, 8), generator=torch.Generator().manual_seed(0))
        trainer = hfcompress.Trainer(model=tiny_llama(), args=args,
                                     train_dataset=[{"input_ids": x, "labels": x} for x in ids])
        trainer.train(resume_from_checkpoint=resume)
        return trainer.state.global_step, [p.detach().clone() for p in trainer.model.parameters()]

    steps, full = run(tmp_path)
    assert steps == 4
    cut = tmp_path / "checkpoint-4"
    (cut / "trainer_state.json").unlink()
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    steps, resumed = run(tmp_path, resume=True)
    assert steps == 4 and all(torch.equal(a, b) for a, b in zip(full, resumed))


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
