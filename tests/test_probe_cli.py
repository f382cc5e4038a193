"""``hfcompress probe`` (issue 31): the links of the real data-parallel groups measured once into
a JSON that ``hfcompress plan --links`` and ``auto`` (``HFCOMPRESS_LINKS_FILE``) reuse.

One launch of 4 gloo processes (2 emulated nodes of 2 ranks) probes tp 1 (one DP group of
2 x 2) and tp 2 (two DP groups of one rank per node, timing at once), through
``probe_cluster`` and through the CLI, and lets ``auto``'s ``probe_links`` read a file; the
parent checks the files and runs ``plan --links`` on them. Plus the file's validation."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest

from hfcompress.auto.links_file import LINKS_FILE_ENV
from hfcompress.cli import main
from hfcompress.cost.codec_rates import GPU_RATES
from hfcompress.cost.links_file import KEYS, LinksFileError, load, save, validate
from hfcompress.cost.plan import LOSS_KEEPING

from dist_utils import run_distributed

SIZES = ["--hidden", "256", "--layers", "2", "--vocab", "1024"]
TP1_KEYS = {"all_gather@world", "reduce_scatter@world", "all_gather@intra",
            "all_gather@inter", "all_to_all@intra", "all_to_all@inter"}


def probe_worker(rank: int, world: int, out_dir: str) -> dict:
    """Probe tp 1 and tp 2 (function and CLI), then auto's probe_links with the files."""
    os.environ["HFCOMPRESS_COMPILE"] = "0"      # eager codecs: no compile time
    import torch
    import torch.distributed as dist

    from hfcompress.auto.cluster_probe import probe_cluster
    from hfcompress.auto.cost_model import GroupLayout, fsdp_needs
    from hfcompress.auto.probe import probe_links
    from hfcompress.comm import Topology
    from hfcompress.cost.model_shape import ModelShape

    cpu = torch.device("cpu")
    shape = ModelShape(hidden=256, layers=2, vocab=1024)
    out = {}
    for tp in (1, 2):
        data = probe_cluster(shape, tp=tp, ranks_per_node=2, presets=list(LOSS_KEEPING),
                             device=cpu, max_bytes=1 << 18, reps=1)
        if rank == 0:
            save(data, os.path.join(out_dir, f"tp{tp}.json"))
        out[f"tp{tp}"] = data
    main(["probe", "--out", os.path.join(out_dir, "cli.json"), *SIZES, "--tp", "2",
          "--ranks-per-node", "2", "--max-mib", "0.25", "--reps", "1"])
    dist.barrier()                               # the files are written
    topology = Topology(2)
    needed = fsdp_needs(GroupLayout(4, 2)) + [("all_reduce", "world")]
    for name in ("tp1", "tp2"):                  # tp2's file: another layout, not used
        os.environ[LINKS_FILE_ENV] = os.path.join(out_dir, f"{name}.json")
        links = probe_links(topology, needed, cpu, reps=1)
        out[f"auto_{name}"] = {k: (f.latency_s, f.bytes_per_s) for k, f in links.fits.items()}
    return out


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("probe"))
    return run_distributed(probe_worker, 4, out_dir, timeout=180), out_dir


def _numbers(obj, where=""):
    """Every number in a JSON value, with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numbers(v, f"{where}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield where, obj


@pytest.mark.parametrize("name, layout, keys", [
    ("tp1", {"nodes": 2, "gpus_per_node": 2, "tp": 1, "dp": 4, "dp_per_node": 2,
             "dp_nodes": 2, "groups_per_node": 1}, TP1_KEYS),
    ("tp2", {"nodes": 2, "gpus_per_node": 2, "tp": 2, "dp": 2, "dp_per_node": 1,
             "dp_nodes": 2, "groups_per_node": 2},
     {"all_gather@world", "reduce_scatter@world", "all_to_all@world", "all_gather@node"}),
])
def test_probe_writes_every_key_agreed_on_every_rank(probed, name, layout, keys):
    ranks, out_dir = probed
    data = ranks[0][name]
    assert all(r[name] == data for r in ranks)          # every rank holds the same result
    with open(os.path.join(out_dir, f"{name}.json")) as f:
        assert json.load(f) == data                     # rank 0 wrote it
    assert set(KEYS) <= set(data) and data["layout"] == layout
    assert set(data["fits"]) == keys
    for fit in data["fits"].values():
        assert fit["sizes_bytes"][0] < fit["sizes_bytes"][1] < fit["sizes_bytes"][2] <= 1 << 18
    for key in ("inter_node_gbps", "intra_node_gbps", "inter_latency_us", "intra_latency_us"):
        assert data[key] is not None, key               # 2 nodes of 2: both links measured
    assert data["codec_rates"] and set(data["codec_rates"]) <= set(GPU_RATES)
    assert "qwd" in data["codec_rates"]
    for where, value in _numbers({k: v for k, v in data.items() if k != "layout"}):
        zero_ok = "latency" in where or where.endswith(("link_bytes", "intra_bytes"))
        assert math.isfinite(value) and (value > 0 or value == 0 and zero_ok), where
    assert data["device"].startswith("cpu") and data["torch"]


def test_cli_probe_writes_the_same_layout(probed):
    ranks, out_dir = probed
    data = load(os.path.join(out_dir, "cli.json"))
    assert data["layout"] == ranks[0]["tp2"]["layout"]
    assert set(data["fits"]) == set(ranks[0]["tp2"]["fits"])


def test_auto_takes_the_files_fits_for_its_layout_and_probes_the_rest(probed):
    ranks, out_dir = probed
    file_fits = load(os.path.join(out_dir, "tp1.json"))["fits"]
    used = ranks[0]["auto_tp1"]
    for key, fit in file_fits.items():
        assert used[key] == pytest.approx((fit["latency_us"] * 1e-6, fit["MB_per_s"] * 1e6))
    assert used["all_reduce@world"][1] > 0               # not in the file: probed
    assert all(r["auto_tp1"] == used for r in ranks)
    other = ranks[0]["auto_tp2"]                         # measured on another layout: probed
    assert set(other) == set(used)
    assert other["all_gather@world"] != used["all_gather@world"]


def _plan(capsys, *extra):
    main(["plan", *SIZES, "--nodes", "4", "--gpus-per-node", "8", "--gpu-tflops", "100",
          "--json", *extra])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["tp1", "tp2"])
def test_plan_reads_the_links_file(probed, capsys, name):
    path = os.path.join(probed[1], f"{name}.json")
    data = load(path)
    report = _plan(capsys, "--links", path)
    links = report["links"]
    for key in ("inter_node_gbps", "intra_node_gbps", "inter_latency_us", "intra_latency_us"):
        assert links[key] == pytest.approx(data[key])
    assert links["measured_layout"] == data["layout"]
    assert f"tp {data['layout']['tp']}" in links["source"] and path in links["source"]
    assert data["device"] in report["codec"]["source"]
    given = _plan(capsys, "--links", path, "--inter-node-gbps", "123")["links"]
    assert given["inter_node_gbps"] == 123                  # an explicit flag wins
    assert given["intra_node_gbps"] == pytest.approx(data["intra_node_gbps"])


def test_plan_prices_the_codecs_at_the_files_rates(probed, capsys):
    path = os.path.join(probed[1], "tp1.json")
    wide = ("--hidden", "2048")     # codec work well above the per-call floor on an H200
    declared = _plan(capsys, *wide)["presets"]["qwd"]["codec_s"]
    measured = _plan(capsys, *wide, "--links", path)["presets"]["qwd"]["codec_s"]
    assert measured > 10 * declared        # this CPU's eager codecs against the H200's kernels


# -- the file's validation (no processes) ---------------------------------------------------
def _valid() -> dict:
    return {"version": 1, "layout": {"nodes": 2, "gpus_per_node": 2, "tp": 1, "dp": 4,
                                     "dp_per_node": 2, "dp_nodes": 2, "groups_per_node": 1},
            "fits": {"all_gather@world": {"latency_us": 50.0, "MB_per_s": 100.0,
                                          "sizes_bytes": [4096, 1 << 20, 4 << 20],
                                          "seconds": [5e-5, 0.01, 0.04], "steps": 3}},
            "inter_node_gbps": 1.0, "intra_node_gbps": None, "inter_latency_us": 20.0,
            "intra_latency_us": None,
            "codec_rates": {"int4": {"compress_values_per_s": 1e9,
                                     "decompress_values_per_s": 2e9, "values": 4096,
                                     "dtype": "float32"}},
            "device": "cpu", "torch": "2.13.0", "probe_s": 1.5, "model": None}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("fits"), "no key 'fits'"),
    (lambda d: d["layout"].pop("dp_nodes"), "no key layout.'dp_nodes'"),
    (lambda d: d.update(version=2), "version 2, this hfcompress reads version 1"),
    (lambda d: d["fits"]["all_gather@world"].pop("MB_per_s"),
     "no key fits.all_gather@world.'MB_per_s'"),
    (lambda d: d.update(inter_node_gbps=-1.0), "inter_node_gbps=-1.0 must be > 0"),
    (lambda d: d["codec_rates"]["int4"].update(compress_values_per_s=0),
     "codec_rates.int4.compress_values_per_s=0 must be > 0"),
])
def test_validation_names_the_problem(edit, message):
    data = _valid()
    assert validate(copy.deepcopy(data)) == data
    edit(data)
    with pytest.raises(LinksFileError, match="hfcompress probe --out") as err:
        validate(data, "links file 'x.json'")
    assert message in str(err.value) and "x.json" in str(err.value)


def test_plan_refuses_a_bad_links_file(tmp_path, capsys):
    bad = _valid()
    bad.pop("codec_rates")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(SystemExit):
        _plan(capsys, "--links", str(path))
    assert "no key 'codec_rates'" in capsys.readouterr().err
    with pytest.raises(LinksFileError, match="cannot read"):
        load(str(tmp_path / "missing.json"))


def test_save_refuses_an_invalid_result(tmp_path):
    data = _valid()
    save(data, str(tmp_path / "ok.json"))
    assert load(str(tmp_path / "ok.json")) == data
    data["version"] = 0
    with pytest.raises(LinksFileError):
        save(data, str(tmp_path / "bad.json"))


def test_probe_outside_a_launcher_says_how_to_launch(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit):
        main(["probe", "--out", "x.json", *SIZES])
    assert "torchrun" in capsys.readouterr().err
