"""``--resume_from_checkpoint True`` / ``latest`` in the examples (issue 38): the newest
checkpoint of ``--output_dir``, as Hugging Face's example scripts resume (it failed with
``'True/trainer_state.json'``)."""

import json

from test_examples import finetune_local, local_model_and_texts


def test_resume_from_checkpoint_true_and_latest(tmp_path):
    pretrained, texts, _ = local_model_and_texts(tmp_path)
    out = tmp_path / "out"
    proc = finetune_local(pretrained, texts, out, "--max_steps", "2", "--save_strategy", "steps",
                          "--save_steps", "2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for word, steps, start in (("True", 3, 2), ("latest", 4, 3)):
        proc = finetune_local(pretrained, texts, out, "--max_steps", str(steps),
                              "--save_strategy", "steps", "--save_steps", "2",
                              "--resume_from_checkpoint", word)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["resumed_from_step"], summary["steps"]) == (start, steps), summary
