"""A diverged example run (issue 29 F4), end to end: ``finetune_llama.py`` with a learning
rate that sends the weights to NaN in a few steps. Hugging Face logs the loss as 0 after a
NaN (``logging_nan_inf_filter``); the printed summary says DIVERGED (not ``-> 0.0000``),
``summary.json`` records it, and ``hfcompress compare`` shows ``diverged`` in the loss
column."""

import json
import math
import re

from hfcompress.cli import main
from test_examples import finetune_local, local_model_and_texts


def test_a_diverged_example_run_says_so(tmp_path, capsys):
    pretrained, texts, _ = local_model_and_texts(tmp_path)
    out = tmp_path / "llama-diverged"
    proc = finetune_local(pretrained, texts, out, "--max_steps", "6", "--learning_rate", "1e30")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] is True and summary["diverged_at_step"] is not None
    assert math.isnan(summary["train_loss_last"]) and math.isnan(summary["eval_loss"])
    assert "-> DIVERGED (NaN / Inf from step" in proc.stdout, proc.stdout
    assert "-> 0.0000" not in proc.stdout
    assert re.search(r"hfcompress: \d+ training loss(es)? up to step \d+ (was|were) NaN / Inf",
                     log), log[-4000:]
    main(["compare", str(out), "--no_plot"])
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[0] == "llama-diverged"
    assert "diverged" in table[1].split() and "0.0000" not in table[1], table
    assert table[2].startswith("note: llama-diverged diverged (NaN / Inf from step")
