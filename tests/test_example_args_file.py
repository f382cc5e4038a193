"""trainer_examples: Hugging Face's ``script.py args.json`` / ``args.yaml`` form."""

import json
import os
import sys

import pytest
import yaml

from test_examples import ROOT

sys.path.insert(0, os.path.join(ROOT, "trainer_examples"))
import clm  # noqa: E402
from finetune_mixtral import MixtralArguments  # noqa: E402

ARGS = {"max_steps": 7, "learning_rate": 0.001, "comm_compressor": "sdp4bit",
        "ranks_per_node": 1, "report_to": ["none"], "num_local_experts": 8, "bf16": False,
        "fsdp_config": {"version": 2}, "tokenizer_name": None}


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_args_file_gives_the_flags(tmp_path, suffix):
    """The file's keys as flags (lists, dicts, booleans; null keeps the default), the
    examples' defaults below them and later flags over them."""
    path = tmp_path / f"args.{suffix}"
    path.write_text(json.dumps(ARGS) if suffix == "json" else yaml.safe_dump(ARGS))
    margs, dargs, targs = clm.parse_args(MixtralArguments, clm.TRAINING_DEFAULTS,
                                         [str(path), "--max_steps", "9"], name="mixtral")
    assert (targs.max_steps, targs.learning_rate, targs.comm_compressor) == (9, 1e-3, "sdp4bit")
    assert targs.ranks_per_node == 1 and targs.report_to == [] and not targs.bf16
    assert targs.fsdp_config["version"] == 2
    assert margs.num_local_experts == 8 and margs.tokenizer_name is None
    assert targs.output_dir == "runs/mixtral-sdp4bit-1proc"           # default naming
    assert targs.lr_scheduler_type == "cosine"                        # example default


def test_args_file_mistakes(tmp_path):
    with pytest.raises(clm.ArgumentError, match="not found"):
        clm.parse_args(MixtralArguments, clm.TRAINING_DEFAULTS, [str(tmp_path / "no.json")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- max_steps\n")
    with pytest.raises(clm.ArgumentError, match="mapping of argument names"):
        clm.parse_args(MixtralArguments, clm.TRAINING_DEFAULTS, [str(bad)])
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"max_step": 3}))
    with pytest.raises(clm.ArgumentError, match="did you mean --max_steps"):
        clm.parse_args(MixtralArguments, clm.TRAINING_DEFAULTS, [str(typo)])
