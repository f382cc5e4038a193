"""Bad inputs to ``hfcompress plan`` / ``probe`` / ``list`` (issue 38): one line and exit 2 (rank
0's line alone under a launch, checked before any process group), never a traceback; a plan of
any depth in the time of one layer; each bandwidth labelled with where it came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hfcompress.cli import main
from hfcompress.cost.cluster import ClusterLayout
from hfcompress.cost.links import ClusterLinks
from hfcompress.cost.model_shape import ModelShape
from hfcompress.cost.step_model import price_step

from dist_utils import run_distributed

PLAN = ["--nodes", "2", "--gpu-tflops", "400"]
SIZES = ["--hidden", "256", "--layers", "2", "--vocab", "1024"]


def error_line(capsys, argv: list[str]) -> str:
    """The one error line of a refused command (exit 2, argparse's usage before it)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# -- a --model config that is not a JSON object ----------------------------------------------
@pytest.mark.parametrize("content, kind", [("[1, 2]", "array"), ("4096", "number"),
                                           ('"llama"', "string"), ("null", "null")])
def test_model_config_that_is_not_an_object_is_one_line(capsys, monkeypatch, tmp_path,
                                                         content, kind):
    path = tmp_path / "config.json"
    path.write_text(content)
    line = error_line(capsys, ["plan", "--model", str(path), *PLAN])
    assert f"is a JSON {kind}, not an object" in line and "--hidden" in line
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    line = error_line(capsys, ["probe", "--out", str(tmp_path / "links.json"), "--model",
                               str(path)])
    assert line.startswith("hfcompress probe: error:") and f"a JSON {kind}" in line


def test_model_config_with_a_wrongly_typed_expert_count_is_one_line(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 256, "num_hidden_layers": 2,
                                "num_local_experts": "8"}))
    assert "num_local_experts / num_experts='8' must be a positive integer" in error_line(
        capsys, ["plan", "--model", str(path), *PLAN])


# -- MoE top-k --------------------------------------------------------------------------------
def test_experts_per_token_above_experts_or_without_them_is_refused(capsys):
    line = error_line(capsys, ["plan", *SIZES, "--experts", "4", "--experts-per-token", "8",
                               *PLAN])
    assert "experts_per_token=8 is more than experts=4" in line and "<= 4" in line
    line = error_line(capsys, ["plan", *SIZES, "--experts-per-token", "2", *PLAN])
    assert "experts_per_token=2 needs experts > 1" in line and "--experts N" in line
    main(["plan", *SIZES, "--experts", "4", "--experts-per-token", "4", *PLAN])
    assert "4 experts (top-4)" in capsys.readouterr().out


# -- depth: identical layers priced once ------------------------------------------------------
@pytest.mark.parametrize("preset", ["none", "sdp4bit", "loco", "global_qsgd_exp", "zeropp"])
@pytest.mark.parametrize("engine", ["fsdp2", "megatron"])
def test_counted_units_price_exactly_as_one_unit_per_layer(preset, engine):
    shape = ModelShape(hidden=512, layers=7, vocab=1024)
    layout = ClusterLayout(4, 4, tp=2, pp=2)
    kw = dict(compute_s=0.01, engine=engine, grad_accum=2)
    links = ClusterLinks(100.0, 2400.0)
    assert price_step(preset, shape.unit_counts(layout), layout, links, **kw) == \
        price_step(preset, shape.units(layout), layout, links, **kw)


def test_plan_of_a_billion_layers_returns_at_once(capsys):
    """One unit per layer never returned; priced once per shape, the bytes grow linearly."""
    def link_bytes(layers: int) -> float:
        main(["plan", "--hidden", "256", "--layers", str(layers), "--vocab", "1024", *PLAN,
              "--presets", "none,sdp4bit,global_qsgd_exp", "--json"])
        presets = json.loads(capsys.readouterr().out)["presets"]
        return [presets[p]["link_bytes_per_node"] for p in presets]

    one, two, deep = link_bytes(1), link_bytes(2), link_bytes(10 ** 9)
    # DDP's bucket count rounds, and each bucket adds its scales' MAX (one per inter-node
    # group of the hierarchical all-reduce: 8 x 4 B per bucket on a node link): 5e-6
    for a, b, c in zip(one, two, deep):
        assert c == pytest.approx(a + (10 ** 9 - 1) * (b - a), rel=2e-5)


# -- where each bandwidth came from -----------------------------------------------------------
def links_file(tmp_path) -> str:
    """A probe's file that measured the network (1 Gbit/s) but nothing inside a node."""
    data = {"version": 1, "layout": {"nodes": 2, "gpus_per_node": 1, "tp": 1, "dp": 2,
                                     "dp_per_node": 1, "dp_nodes": 2, "groups_per_node": 1},
            "fits": {}, "inter_node_gbps": 1.0, "intra_node_gbps": None,
            "inter_latency_us": 20.0, "intra_latency_us": None, "codec_rates": {},
            "device": "cpu (x86_64)", "torch": "2.13.0", "probe_s": 1.0, "model": None}
    path = tmp_path / "links.json"
    path.write_text(json.dumps(data))
    return str(path)


def plan_links(capsys, *flags: str) -> dict:
    main(["plan", *SIZES, *PLAN, "--json", *flags])
    return json.loads(capsys.readouterr().out)["links"]


def test_each_bandwidth_names_its_source(capsys, tmp_path):
    path = links_file(tmp_path)
    links = plan_links(capsys, "--links", path)
    assert links["source"].startswith(f"measured by hfcompress probe ({path})")
    assert links["intra_source"] == f"the default 2400, {path} measured none: set " \
                                    f"--intra-node-gbps or --links"
    links = plan_links(capsys, "--links", path, "--inter-node-gbps", "123")
    assert links["inter_node_gbps"] == 123 and links["source"] == "given: --inter-node-gbps"
    links = plan_links(capsys, "--intra-node-gbps", "900")
    assert links["source"] == "the default 400: set --inter-node-gbps or --links"
    assert links["intra_source"] == "given: --intra-node-gbps"
    main(["plan", *SIZES, *PLAN])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("links"))
    assert "400 Gbit/s per node between nodes (the default 400: set --inter-node-gbps" in line
    assert "measured" not in line


# -- probe: the arguments checked before any process group ------------------------------------
@pytest.fixture
def launched(monkeypatch):
    """A rank of a launch of 4 (2 per node) whose process group must not be made."""
    import torch.distributed as dist

    def made(*args, **kwargs):
        raise AssertionError("a process group was made before the arguments were checked")

    monkeypatch.setattr(dist, "init_process_group", made)
    for key, value in {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


@pytest.mark.parametrize("flags, message", [
    (["--tp", "3"], "tp=3 must divide the 2 ranks per node (TP stays inside a node): one of "
                    "1, 2"),
    (["--tp", "0"], "tp=0 must divide the 2 ranks per node"),
    (["--ranks-per-node", "3"], "world size 4 cannot be split into nodes of ranks_per_node=3"),
    (["--presets", "sdp4bit,nope"], "unknown comm_compressor preset 'nope'"),
    (["--presets", ","], "no preset to probe"),
    (["--reps", "0"], "--reps 0 >= 1"),
    (["--tp", "2", "--hidden", "256", "--layers", "2", "--heads", "1", "--kv-heads", "1"],
     "tensor parallelism tp=2 must divide heads=1"),
])
def test_probe_refuses_bad_arguments_before_any_process_group(capsys, launched, tmp_path,
                                                              flags, message):
    argv = ["probe", "--out", str(tmp_path / "links.json"), *flags]
    line = error_line(capsys, argv)
    assert line.startswith("hfcompress probe: error:") and message in line
    launched.setenv("RANK", "1")            # the other ranks: the same exit, silently
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and capsys.readouterr().err == ""


def probe_out_worker(rank: int, world: int, out_dir: str) -> list:
    """--out that rank 0 cannot write, before the probe; a --ranks-per-node that puts the
    two hosts' ranks in one node: refused on rank 0 in one line, every rank exits 2."""
    import contextlib
    import io

    from hfcompress.auto import cluster_probe

    real = cluster_probe.probe_cluster

    def probed(*args, **kwargs):
        raise AssertionError("probed before --out was checked")

    out = []
    for path, probe in ((os.path.join(out_dir, "missing", "links.json"), probed),
                        (out_dir, probed), (os.path.join(out_dir, "links.json"), real)):
        cluster_probe.probe_cluster = probe
        os.environ["HFCOMPRESS_HOSTNAME"] = "ab"[rank]       # two hosts
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            main(["probe", "--out", path, *SIZES, "--ranks-per-node", "2", "--reps", "1",
                  "--max-mib", "0.25"])
        out.append((exit_.value.code, err.getvalue().strip().splitlines()[-1:]))
    return out


def test_probe_checks_out_before_probing_and_says_a_bad_layout_once(tmp_path):
    ranks = run_distributed(probe_out_worker, 2, str(tmp_path))
    assert all(code == 2 for r in ranks for code, _ in r)
    assert all(lines == [] for r in ranks[1:] for _, lines in r)     # rank 0 speaks
    (missing,), (folder,), (layout,) = (lines for _, lines in ranks[0])
    assert "links.json: cannot write it (No such file or directory): create" in missing
    assert f"--out {tmp_path}: cannot write it (Is a directory): give a file path" in folder
    assert "node layout ranks_per_node=2 puts ranks 0..1 in node 0, but they run on hosts " \
           "['a', 'b']" in layout and "set ranks_per_node=1" in layout
    assert os.listdir(tmp_path) == []         # nothing written


# -- list | head ----------------------------------------------------------------------------
def test_list_into_a_closed_pipe_ends_quietly():
    """The reader is gone before the first line (`hfcompress list | head`): no traceback,
    the exit of a tool killed by SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "hfcompress.cli", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
