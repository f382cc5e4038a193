"""The papers' transcribed measurements (``benchmarks/data/plan_papers/``) and the benchmark
that feeds them to the planner (``benchmarks/bench_plan_papers.py``): every row parses, cites
a line of its paper that holds its number (the cited lines are in ``cited_lines.json``
there), and pairs with a baseline of the same setting; the
benchmark's main runs on one paper's rows; its rows are ``hfcompress plan --calibrate`` runs
(the bandwidth it fits is the one the CLI fits to them)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from hfcompress.cost.calibrate import HIGH_GBPS, LOW_GBPS

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "plan_papers"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_plan_papers", REPO / "benchmarks" / "bench_plan_papers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PAPERS = ("zeropp", "loco", "sdp4bit")
SAME_SETTING = ("paper", "model", "hidden", "layers", "seq_len", "micro_batch", "accum",
                "global_batch", "nodes", "gpus_per_node", "tp", "pp", "cluster", "engine",
                "unit")


@pytest.mark.parametrize("paper", PAPERS)
def test_rows_parse_and_pair_with_a_baseline(bench, paper):
    rows = bench.load_rows(paper)
    assert rows and len({r["row_id"] for r in rows}) == len(rows)
    by_id = {r["row_id"]: r for r in rows}
    benchmarked = [r for r in rows if r["benchmark"] == "yes"]
    assert benchmarked
    for r in rows:
        assert r["paper"] == paper and float(r["value"]) > 0, r["row_id"]
        assert r["benchmark"] == "yes" or r["benchmark"].startswith("no: "), r["row_id"]
        assert r["engine"] in ("zero3", "megatron") and r["assumptions"], r["row_id"]
    for r in benchmarked:
        shape, layout = bench.shape_of(r), bench.layout_of(r)     # valid model and layout
        assert layout.nodes * layout.gpus_per_node == layout.dp * layout.tp * layout.pp
        assert int(r["global_batch"]) == layout.dp * int(r["micro_batch"]) * int(r["accum"])
        assert bench.step_seconds(r, shape) > 0
        if r["preset"] == "none":
            assert not r["baseline_row"]
            continue
        bench.config_of(r["preset"])                               # a preset we price
        base = by_id[r["baseline_row"]]
        assert base["preset"] == "none", r["row_id"]
        assert all(base[k] == r[k] for k in SAME_SETTING), r["row_id"]


@pytest.mark.parametrize("paper", PAPERS)
def test_every_row_cites_the_line_holding_its_number(bench, paper):
    cited = json.loads((DATA / "cited_lines.json").read_text())[paper]["lines"]
    for r in bench.load_rows(paper):
        line = cited[str(int(r["line"]))]
        assert r["value"] in line.split(), (r["row_id"], line)
        for setup in r["setup_lines"].split(";"):
            assert cited[str(int(setup))].strip(), (r["row_id"], setup)


def test_main_runs_on_one_paper(bench, tmp_path):
    results, fits = bench.main(["--papers", "sdp4bit", "--out", str(tmp_path)])
    expected = [r for r in bench.load_rows("sdp4bit")
                if r["benchmark"] == "yes" and r["baseline_row"]]
    assert [r["row_id"] for r in results] == [r["row_id"] for r in expected]
    for r in results:
        assert r["measured_speedup"] > 1
        if r["fit_scope"] == "n/a":
            continue
        assert LOW_GBPS < r["fitted_gbps"] < HIGH_GBPS and not r["fit_problem"]
        assert math.isfinite(r["predicted_speedup"]) and r["predicted_speedup"] > 0
        assert r["error"] == pytest.approx(r["predicted_speedup"] / r["measured_speedup"] - 1)
    assert {f["layout"] for f in fits} >= {"16x4 tp1 pp1", "16x8 tp8 pp1"}
    for name in ("plan_papers.csv", "plan_papers_fits.csv", "plan_papers.md",
                 "plan_papers_meta.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_a_layouts_rows_as_calibration_runs_fit_what_the_cli_fits(bench, tmp_path, capsys):
    """SDP4Bit's 16 x 4 A100 layout (Megatron, bf16 weights / fp32 gradients): the
    benchmark's fit equals ``hfcompress plan --calibrate`` on the rows written as JSON."""
    from hfcompress.cli import main

    cases = [c for c in bench.load_cases(["sdp4bit"])
             if c.group == ("sdp4bit", "A100 Slingshot-10", "16x4 tp1 pp1")]
    assert len(cases) == 2
    rows = list({r["row_id"]: r for c in cases for r in (c.base, c.row)}.values())
    runs = [bench.run_of(r) for r in rows]
    assert {(r["weight_bytes"], r["grad_bytes"]) for r in runs} == {(2, 4)}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    main(["plan", "--hidden", "2048", "--layers", "24", "--nodes", "16", "--gpus-per-node",
          "4", "--gpu-tflops", "100", "--engine", "megatron", "--intra-node-gbps",
          rows[0]["intra_node_gbps"], "--calibrate", str(path), "--json"])
    fitted = json.loads(capsys.readouterr().out)["fitted_inter_node_gbps"]
    assert fitted == pytest.approx(bench.fit_gbps(cases).gbps, rel=1e-9)
