"""``hfcompress plan`` / ``list --nodes``: the model shapes, the arguments, the report and the
bandwidth calibration (issue 31). Pure unit tests: no processes, no network."""

from __future__ import annotations

import json

import pytest

from hfcompress import list_presets
from hfcompress.cli import main
from hfcompress.cost.calibrate import CalibrationError, fit_inter_node_gbps, load_runs
from hfcompress.cost.cluster import ClusterLayout
from hfcompress.cost.model_shape import ModelShape, ModelShapeError
from hfcompress.cost.plan import LOSS_KEEPING

# hand-written config.json dicts (the hub's, trimmed to the keys the planner reads)
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
             "intermediate_size": 11008, "vocab_size": 32000, "num_attention_heads": 32,
             "num_key_value_heads": 32, "tie_word_embeddings": False}
LLAMA2_13B = {**LLAMA2_7B, "hidden_size": 5120, "num_hidden_layers": 40,
              "intermediate_size": 13824, "num_attention_heads": 40, "num_key_value_heads": 40}
LLAMA2_70B = {**LLAMA2_7B, "hidden_size": 8192, "num_hidden_layers": 80,
              "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
                "intermediate_size": 14336, "vocab_size": 32000, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "tie_word_embeddings": False}
QWEN2_0_5B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
              "intermediate_size": 4864, "vocab_size": 151936, "num_attention_heads": 14,
              "num_key_value_heads": 2, "tie_word_embeddings": True}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "vocab_size": 151936, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "tie_word_embeddings": False}


@pytest.mark.parametrize("config, billions, tol", [
    (LLAMA2_7B, 6.74, 0.005), (LLAMA2_13B, 13.02, 0.01), (LLAMA2_70B, 68.98, 0.01),
    (MIXTRAL_8X7B, 46.70, 0.01), (QWEN2_0_5B, 0.494, 0.001), (QWEN3_30B_A3B, 30.53, 0.01)])
def test_parameter_counts_match_the_published_models(config, billions, tol):
    assert ModelShape.from_dict(config).params / 1e9 == pytest.approx(billions, abs=tol)


def test_moe_computes_with_its_top_k_but_communicates_every_expert():
    shape = ModelShape.from_dict(MIXTRAL_8X7B)
    assert shape.active_params / 1e9 == pytest.approx(12.88, abs=0.01)   # Mixtral's 12.9B
    layout = ClusterLayout(nodes=1, gpus_per_node=1)
    assert sum(u.numel + u.exact_numel for u in shape.units(layout)) == shape.params
    assert shape.train_flops(10) == 6 * shape.active_params * 10


def test_units_split_by_tp_pp_and_dp():
    shape = ModelShape.from_dict(LLAMA2_7B)
    whole = shape.units(ClusterLayout(nodes=1, gpus_per_node=1))
    # a unit per decoder layer, then the root (embeddings, final norm, head), not gathered
    # again in backward; norms sent exactly
    assert [u.name for u in whole] == [f"layers.{i}" for i in range(32)] + ["root"]
    assert [u.backward_gather for u in whole] == [True] * 32 + [False]
    assert whole[0].exact_numel == 2 * 4096 and whole[-1].exact_numel == 4096
    assert whole[0].numel == 4 * 4096 ** 2 + 3 * 4096 * 11008
    assert whole[-1].numel == 2 * 32000 * 4096
    # 16 x 8, tp 2: DP 64, each layer's matrices halved then sharded; norms replicated by TP
    units = shape.units(ClusterLayout(nodes=16, gpus_per_node=8, tp=2))
    assert units[0].numel == whole[0].numel // 2 // 64
    assert units[0].exact_numel == 2 * 4096 // 64
    # pp 4 over 16 nodes: the heaviest stage, 8 layers and the embeddings (or the head)
    units = shape.units(ClusterLayout(nodes=16, gpus_per_node=8, pp=4))
    assert len(units) == 9 and units[-1].numel == 32000 * 4096 // 32
    # exact_patterns / min_numel follow the config
    units = shape.units(ClusterLayout(nodes=1, gpus_per_node=1), exact_patterns=(),
                        min_numel=0)
    assert units[0].exact_numel == 0
    with pytest.raises(ModelShapeError, match="tp=3 must divide heads=32"):
        shape.units(ClusterLayout(nodes=1, gpus_per_node=3, tp=3))


def test_shape_from_dims_defaults_to_llama_proportions():
    shape = ModelShape(hidden=4096, layers=32)
    assert shape.mlp_width == 11008 and shape.n_heads == 32
    assert shape.params == ModelShape.from_dict(LLAMA2_7B).params
    assert shape.train_flops(100, seq_len=4096) == \
        100 * (6 * shape.params + 12 * 32 * 4096 * 4096)


def test_config_from_a_file_or_directory_and_an_uncached_hub_id_fails_offline(
        tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_70B))
    assert ModelShape.from_config(str(tmp_path)).params == \
        ModelShape.from_config(str(tmp_path / "config.json")).params
    import socket

    from huggingface_hub import constants

    # a cached hub id: the cache's layout (refs/main -> snapshots/<commit>/config.json)
    repo = tmp_path / "hub" / "models--org--llama-70b"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(LLAMA2_70B))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def no_network(*a, **k):
        raise AssertionError("the planner touched the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    assert ModelShape.from_config("org/llama-70b").params == \
        ModelShape.from_dict(LLAMA2_70B).params
    with pytest.raises(ModelShapeError, match="local Hugging Face cache"):
        ModelShape.from_config("meta-llama/Llama-2-7b-hf")


# -- hfcompress plan -------------------------------------------------------------------------
LLAMA70B_DIMS = ["--hidden", "8192", "--layers", "80", "--ffn", "28672", "--heads", "64",
                 "--kv-heads", "8"]
CLUSTER_16X8 = ["--nodes", "16", "--gpus-per-node", "8"]


def plan_json(capsys, *args: str) -> dict:
    main(["plan", *args, "--json"])
    return json.loads(capsys.readouterr().out)


def plan_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", *args])
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_plan_json_is_consistent_and_sdp4bit_sends_less_than_none(capsys):
    report = plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400")
    assert report["layout"] == {"nodes": 16, "gpus_per_node": 8, "tp": 1, "pp": 1, "cp": 1,
                                "dp": 128, "dp_per_node": 8, "groups_per_node": 1,
                                "dp_nodes": 16}
    assert report["model"]["params"] == ModelShape.from_dict(LLAMA2_70B).params
    presets = report["presets"]
    assert list(presets) == list(LOSS_KEEPING)          # the default: the loss-keeping ones
    none = presets["none"]
    for name, p in presets.items():
        assert p["speedup"] == pytest.approx(none["step_s"] / p["step_s"])
        assert p["step_s"] == pytest.approx(p["compute_s"] + p["exposed_s"] + p["codec_s"])
        assert p["full_overlap_s"] == pytest.approx(max(p["compute_s"], p["wire_s"])
                                                    + p["codec_s"])
        assert p["exposed_s"] <= p["wire_s"] + 1e-12
        assert p["link_bytes_per_node"] == pytest.approx(
            sum(c["link_bytes_per_node"] for c in p["collectives"]))
        assert {"name", "algorithm", "link_bytes_per_node", "meter_bytes_per_node",
                "wire_s", "codec_s"} <= set(p["collectives"][0])
    assert presets["sdp4bit"]["link_bytes_per_node"] < none["link_bytes_per_node"] / 4
    assert presets["sdp4bit"]["state_bytes_per_gpu"] > 0 == none["state_bytes_per_gpu"]
    # the ring collectives put far less on a node's link than the meter's direct sends
    assert none["meter_bytes_per_node"] > 5 * none["link_bytes_per_node"]
    algorithms = {c["name"]: c["algorithm"] for c in presets["sdp4bit"]["collectives"]}
    assert algorithms["grads"] == "2-hop" and none["collectives"][0]["algorithm"] == "ring"
    rec = report["recommendation"]
    assert rec["preset"] in LOSS_KEEPING and rec["preset"] != "none"
    assert rec["preset"] == max(presets, key=lambda k: presets[k]["speedup"])
    assert report["inputs"]["gpu_tflops"] == 400
    # 2 micro-batches per step: compute twice; fsdp2 (the Trainer's no_sync) gathers the
    # weights every micro-batch and reduces once, zero3 both twice, megatron both once
    for engine, weights, grads in (("fsdp2", 2, 1), ("zero3", 2, 2), ("megatron", 1, 1)):
        one, two = (plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400",
                              "--engine", engine, "--presets", "sdp4bit", "--grad-accum", ga)
                    for ga in ("1", "2"))
        assert two["compute_s"] == pytest.approx(2 * one["compute_s"])
        before = {c["name"]: c for c in one["presets"]["sdp4bit"]["collectives"]}
        for c in two["presets"]["sdp4bit"]["collectives"]:
            times = weights if c["part"] == "weights" else grads
            assert c["times_per_step"] == times
            assert c["link_bytes_per_node"] == pytest.approx(
                times * before[c["name"]]["link_bytes_per_node"])
        assert two["presets"]["sdp4bit"]["state_bytes_per_gpu"] == \
            one["presets"]["sdp4bit"]["state_bytes_per_gpu"]
    # tp 2: two DP groups of 4 ranks per node share the link
    lay = plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--tp", "2", "--gpu-tflops",
                    "400", "--presets", "sdp4bit")["layout"]
    assert (lay["dp_per_node"], lay["groups_per_node"], lay["dp"]) == (4, 2, 64)


def test_plan_dtypes_of_the_exact_collectives(capsys):
    """--reduce-dtype bf16 halves none's gradient bytes (ZeRO-3, LoCo's baselines),
    --gather-dtype fp32 doubles its weight bytes."""
    def link(*flags):
        report = plan_json(capsys, "--hidden", "4096", "--layers", "32", *CLUSTER_16X8,
                           "--gpu-tflops", "400", "--presets", "none", *flags)
        return {c["name"]: c["link_bytes_per_node"]
                for c in report["presets"]["none"]["collectives"]}
    default = link()
    assert link("--reduce-dtype", "bf16")["grads"] == default["grads"] / 2
    assert link("--reduce-dtype", "fp16")["weights_fwd"] == default["weights_fwd"]
    assert link("--gather-dtype", "fp32")["weights_fwd"] == 2 * default["weights_fwd"]
    assert "invalid choice" in plan_error(capsys, "--hidden", "4096", "--layers", "32",
                                          "--nodes", "2", "--gpu-tflops", "400",
                                          "--reduce-dtype", "int8")


def test_plan_gpu_memory_marks_presets_that_do_not_fit(capsys):
    """LoCo's 8-bit error of the whole gradient a rank sends is 69 GB per GPU at 70B: with
    the sharded training state (18 B per parameter a GPU holds) it exceeds 80 GB: marked,
    never recommended; too little memory even for none says what to do."""
    args = [*LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400", "--presets",
            "sdp4bit,loco"]
    default = plan_json(capsys, *args)     # no --gpu / --gpu-memory-gb: 80 GB, said so
    assert default["gpu_memory_gb"] == 80 and "assumed" in default["gpu_memory_source"]
    assert not default["presets"]["loco"]["fits_gpu_memory"]
    assert default["recommendation"]["preset"] != "loco"
    report = plan_json(capsys, *args, "--gpu-memory-gb", "80")
    presets = report["presets"]
    train = report["train_state_bytes_per_gpu"]
    assert train == pytest.approx(18 * ModelShape.from_dict(LLAMA2_70B).params / 128, rel=1e-3)
    for p in presets.values():
        assert p["memory_bytes_per_gpu"] == train + p["state_bytes_per_gpu"]
        assert p["fits_gpu_memory"] == (p["memory_bytes_per_gpu"] <= 80e9)
    assert presets["loco"]["state_bytes_per_gpu"] > 60e9
    assert presets["none"]["fits_gpu_memory"] and presets["sdp4bit"]["fits_gpu_memory"]
    assert not presets["loco"]["fits_gpu_memory"]
    assert report["recommendation"]["preset"] == "sdp4bit"
    # loco alone: faster than none but over the memory, so not recommended
    alone = plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400",
                      "--presets", "loco", "--gpu-memory-gb", "80")
    assert alone["presets"]["loco"]["speedup"] > 1.03
    assert alone["recommendation"]["preset"] == "none"
    assert "fits the GPU's memory" in alone["recommendation"]["why"]
    main(["plan", *args, "--gpu-memory-gb", "80"])
    out = capsys.readouterr().out
    assert "loco!" in out and "never recommended" in out and "memory GB/GPU" in out
    assert "! loco does not fit: 89.7 GB per GPU" in out
    assert "shard it over more GPUs" in plan_json(capsys, *args, "--gpu-memory-gb",
                                                  "5")["memory_warning"]
    ddp = plan_json(capsys, *args, "--gpu-memory-gb", "5", "--engine", "ddp")["memory_warning"]
    assert "more nodes do not shrink it" in ddp and "--nodes" not in ddp, ddp


def test_plan_table_prints_layout_bytes_meter_and_recommendation(capsys):
    main(["plan", *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400", "--presets",
          "sdp4bit,zeropp"])
    out = capsys.readouterr().out
    assert "DP size 128 = 8 DP ranks per node (x) x 16 nodes per DP group (y)" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split()[:1] and
            line.split()[0].rstrip("*") in ("none", "sdp4bit", "zeropp") and "x" in line]
    assert rows[:3] == ["none", "sdp4bit", "zeropp*"]      # not loss-keeping: marked
    assert "WireMeter counts direct sends" in out and "(2-hop)" in out
    assert "recommendation: sdp4bit" in out


def test_plan_step_time_and_when_not_to_compress(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    # a compute-bound step: an hour of compute hides everything
    report = plan_json(capsys, "--model", str(tmp_path), *CLUSTER_16X8, "--step-time", "3600")
    none = report["presets"]["none"]
    assert none["step_s"] == pytest.approx(3600) and none["speedup"] == 1.0
    assert report["recommendation"]["preset"] == "none"
    assert "don't compress" in report["recommendation"]["why"]
    assert "compute-bound" in report["recommendation"]["why"]
    # a step shorter than none's communication on these links: said, with the fix
    main(["plan", "--model", str(tmp_path), *CLUSTER_16X8, "--step-time", "0.01",
          "--inter-node-gbps", "10"])
    assert "--calibrate" in capsys.readouterr().out.split("warning:")[1]


def test_plan_argument_errors_say_what_to_do(capsys, monkeypatch, tmp_path):
    assert "exactly one of --step-time" in plan_error(capsys, "--hidden", "4096", "--layers",
                                                      "32", "--nodes", "2")
    err = plan_error(capsys, "--hidden", "4096", "--layers", "32", "--nodes", "2",
                     "--step-time", "1", "--gpu-tflops", "400")
    assert "exactly one of --step-time" in err and "not both" in err
    err = plan_error(capsys, "--hidden", "4096", "--layers", "32", *CLUSTER_16X8, "--tp", "3",
                     "--gpu-tflops", "400")
    assert "must divide gpus_per_node=8" in err and "[1, 2, 4, 8]" in err
    assert "--seq-len 0 must be > 0" in plan_error(capsys, "--hidden", "4096", "--layers", "32",
                                                   "--nodes", "2", "--gpu-tflops", "400",
                                                   "--seq-len", "0")
    assert "no model" in plan_error(capsys, "--nodes", "2", "--gpu-tflops", "400")
    assert "not both" in plan_error(capsys, "--model", "x", "--hidden", "1", "--nodes", "2",
                                    "--gpu-tflops", "400")
    assert "Did you mean 'sdp4bit'" in plan_error(
        capsys, "--hidden", "4096", "--layers", "32", "--nodes", "2", "--gpu-tflops", "400",
        "--presets", "sdp4bt")
    # a hub id that is not cached: at once, offline
    import socket

    from huggingface_hub import constants

    def no_network(*a, **k):
        raise AssertionError("the planner touched the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    err = plan_error(capsys, "--model", "meta-llama/Llama-2-70b-hf", "--nodes", "2",
                     "--gpu-tflops", "400")
    assert "local Hugging Face cache" in err and "--hidden H --layers L" in err


def test_calibration_recovers_the_bandwidth_that_made_the_runs(capsys, tmp_path):
    runs = []
    for dims, nodes in ((["--hidden", "4096", "--layers", "32"], 16),
                        (["--hidden", "2048", "--layers", "24"], 4)):
        report = plan_json(capsys, *dims, "--nodes", str(nodes), "--gpu-tflops", "100",
                           "--inter-node-gbps", "150", "--presets", "none,sdp4bit,tlq_hs")
        for preset, p in report["presets"].items():
            runs.append({"hidden": int(dims[1]), "layers": int(dims[3]), "seq_len": 4096,
                         "micro_batch": 1, "nodes": nodes, "gpus_per_node": 8, "tp": 1,
                         "pp": 1, "preset": preset, "step_s": p["step_s"]})
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    report = plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400",
                       "--calibrate", str(path), "--inter-node-gbps", "5")
    assert report["fitted_inter_node_gbps"] == pytest.approx(150, rel=0.01)
    assert report["links"]["inter_node_gbps"] == report["fitted_inter_node_gbps"]
    # compute from --gpu-tflops when a run has no none baseline
    compressed = [r for r in runs if r["preset"] != "none"]
    assert fit_inter_node_gbps(compressed, intra_node_gbps=2400.0, gpu_tflops=100) == \
        pytest.approx(150, rel=0.01)


@pytest.mark.parametrize("engine", ["fsdp2", "megatron"])
def test_calibration_prices_accumulation_and_dtypes_of_each_run(capsys, tmp_path, engine):
    """Runs of 4 micro-batches with bf16 gradient reductions (run keys grad_accum,
    grad_bytes), made at 150 Gbit/s: fitted back to 150, whether the dtype comes from the
    run or from --reduce-dtype; priced with fp32 reductions instead, the fit goes wrong."""
    runs = []
    for preset in ("none", "sdp4bit", "tlq_hs"):
        p = plan_json(capsys, "--hidden", "4096", "--layers", "32", *CLUSTER_16X8,
                      "--gpu-tflops", "100", "--inter-node-gbps", "150", "--engine", engine,
                      "--grad-accum", "4", "--reduce-dtype", "bf16",
                      "--presets", preset)["presets"][preset]
        runs.append({"hidden": 4096, "layers": 32, "seq_len": 4096, "micro_batch": 1,
                     "grad_accum": 4, "nodes": 16, "gpus_per_node": 8, "tp": 1, "pp": 1,
                     "preset": preset, "step_s": p["step_s"]})
    fit = {}
    for name, data, flags in (
            ("keys", [{**r, "grad_bytes": 2} for r in runs], []),
            ("flag", runs, ["--reduce-dtype", "bf16"]),
            ("wrong", runs, [])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        fit[name] = plan_json(capsys, *LLAMA70B_DIMS, *CLUSTER_16X8, "--gpu-tflops", "400",
                              "--engine", engine, "--calibrate", str(path),
                              *flags)["fitted_inter_node_gbps"]
    assert fit["keys"] == pytest.approx(150, rel=0.01)
    assert fit["flag"] == pytest.approx(150, rel=0.01)
    assert not fit["wrong"] == pytest.approx(150, rel=0.05)
    with pytest.raises(CalibrationError, match="grad_bytes=3"):
        fit_inter_node_gbps([{**runs[0], "grad_bytes": 3}], intra_node_gbps=2400.0)


def test_calibration_errors_name_the_run_and_the_fix(tmp_path):
    run = {"hidden": 4096, "layers": 32, "seq_len": 4096, "micro_batch": 1, "nodes": 2,
           "gpus_per_node": 8, "tp": 1, "pp": 1, "preset": "sdp4bit", "step_s": 1.0}
    with pytest.raises(CalibrationError, match="non-empty JSON list"):
        fit_inter_node_gbps([], intra_node_gbps=2400.0)
    bad = {k: v for k, v in run.items() if k != "step_s"}
    with pytest.raises(CalibrationError, match="run 1 has no 'step_s'"):
        fit_inter_node_gbps([run, bad], intra_node_gbps=2400.0)
    with pytest.raises(CalibrationError, match="run 0 .*no 'none' run.*--gpu-tflops"):
        fit_inter_node_gbps([run], intra_node_gbps=2400.0)
    with pytest.raises(CalibrationError, match="only 'none' runs"):
        fit_inter_node_gbps([{**run, "preset": "none"}], intra_node_gbps=2400.0)
    path = tmp_path / "runs.json"
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match="cannot read"):
        load_runs(str(path))


def test_list_prices_the_presets_on_any_layout(capsys):
    main(["list", "--nodes", "16", "--gpus-per-node", "8"])
    out = capsys.readouterr().out.splitlines()
    assert "16 nodes x 8 GPUs" in out[0]
    rows = {line.split()[0]: line.split() for line in out[2:]}
    assert list(rows) == list_presets()
    # a ring all-gather of bf16 weights over 128 ranks: one edge leaves each node, 127 of
    # the 128 shards cross it
    assert float(rows["none"][2]) == pytest.approx(16 * 127 / 128, abs=0.02)
    # hierarchical: int8 codes summed over the 16 nodes, twice across (reduce + gather)
    assert float(rows["global_qsgd"][4]) == pytest.approx(2 * 8 * 15 / 16, abs=0.1)
    assert "cannot run here" not in " ".join(rows["global_qsgd"])
    assert float(rows["sdp4bit"][5]) < float(rows["none"][5]) / 4
