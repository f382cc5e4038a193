"""The planner's GPU (``cost/gpus.py``): a memory is always assumed and said, a preset that does
not fit is never recommended (a sweep of layouts as a new user would try them), the codec
rates scale with the GPU's HBM bandwidth; and a calibration that the runs do not determine
says so (``cost/calibrate.Fit``)."""

import itertools
import json

import pytest

from hfcompress.cli import main
from hfcompress.cost.calibrate import HIGH_GBPS, LOW_GBPS, fit_inter_node
from hfcompress.cost.gpus import DEFAULT_MEMORY_GB, assume_gpu
from hfcompress.cost.model_shape import ModelShape
from hfcompress.cost.plan import LOSS_KEEPING, plan

LLAMA2 = {"7b": ModelShape(hidden=4096, layers=32),
          "13b": ModelShape(hidden=5120, layers=40),
          "70b": ModelShape(hidden=8192, layers=80, ffn=28672, heads=64, kv_heads=8)}


def test_the_assumption_says_where_it_comes_from():
    default = assume_gpu()
    assert default.memory_gb == DEFAULT_MEMORY_GB and default.codec_scale == 1.0
    assert "assumed" in default.memory_source and "H200" in default.codec_source
    a100 = assume_gpu("a100")
    assert a100.memory_gb == 80 and a100.codec_scale == pytest.approx(2039 / 4800)
    mine = assume_gpu("A100", gpu_memory_gb=40, hbm_gbps=1555)
    assert mine.memory_gb == 40 and mine.codec_scale == pytest.approx(1555 / 4800)
    with pytest.raises(ValueError, match="not one of h200, h100"):
        assume_gpu("b300")


def test_codec_seconds_scale_with_the_gpus_bandwidth():
    """Memory-bound kernels: a V100 (900 GB/s) codes 4800 / 900 times slower than the H200."""
    kw = dict(nodes=16, gpus_per_node=8, gpu_tflops=400, inter_node_gbps=100)
    h200 = plan(LLAMA2["70b"], ["sdp4bit"], **kw)["presets"]["sdp4bit"]
    v100 = plan(LLAMA2["70b"], ["sdp4bit"], gpu="v100", **kw)["presets"]["sdp4bit"]
    assert v100["codec_s"] == pytest.approx(h200["codec_s"] * 4800 / 900, rel=1e-9)
    assert v100["link_bytes_per_node"] == h200["link_bytes_per_node"]


def test_plan_prints_the_gpu_and_its_memory(capsys):
    main(["plan", "--hidden", "4096", "--layers", "32", "--nodes", "2", "--gpu-tflops",
          "400", "--gpu", "V100-16GB"])
    out = capsys.readouterr().out
    assert "gpu: v100-16gb, 16 GB per GPU (the v100-16gb's)" in out
    assert "x 0.188" in out         # 900 / 4800
    with pytest.raises(SystemExit):
        main(["plan", "--hidden", "64", "--layers", "1", "--nodes", "2", "--gpu-tflops", "1",
              "--gpu", "b300"])
    assert "invalid choice: 'b300'" in capsys.readouterr().err


def test_no_recommendation_that_does_not_fit():
    """LLaMA-2 7B / 13B / 70B on 2-16 nodes of 8 GPUs, TP 1 / 2 / 8, 100 Gbit/s to 3.2
    Tbit/s, no memory given: whatever is recommended fits the assumed 80 GB, and where
    ``loco``'s error buffers do not fit it is shown as not fitting."""
    seen_over = 0
    for (model, shape), nodes, tp, gbps in itertools.product(
            LLAMA2.items(), (2, 4, 16), (1, 2, 8), (100, 800, 3200)):
        report = plan(shape, list(LOSS_KEEPING), nodes=nodes, gpus_per_node=8, tp=tp,
                      gpu_tflops=400, inter_node_gbps=gbps)
        presets = report["presets"]
        chosen = report["recommendation"]["preset"]
        where = (model, nodes, tp, gbps)
        assert presets[chosen]["fits_gpu_memory"] or chosen == "none", where
        for p in presets.values():
            assert p["fits_gpu_memory"] == (p["memory_bytes_per_gpu"] <= 80e9), where
        seen_over += not presets["loco"]["fits_gpu_memory"]
    assert seen_over > 0        # the sweep reaches the case it guards


class Slope:
    """A stand-in prediction: ``seconds(gbps)`` for every run."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, run, gbps):
        return self.seconds(gbps)


RUNS = [{"hidden": 64, "layers": 2, "seq_len": 8, "micro_batch": 1, "nodes": 2,
         "gpus_per_node": 1, "tp": 1, "pp": 1, "preset": "sdp4bit", "step_s": 1.0}]


@pytest.mark.parametrize("seconds,bound,flat", [
    (lambda g: 0.5 + 50.0 / g, None, False),        # = the measured 1 s at 100 Gbit/s
    (lambda g: 2.0 + 1.0 / g, "high", False),       # slower than measured at any bandwidth
    (lambda g: 0.5 + 0.4 / (1 + g), "low", False),  # faster than measured at any bandwidth
    (lambda g: 3.0, None, True),                    # the bandwidth changes nothing
])
def test_a_fit_says_when_the_runs_do_not_determine_it(seconds, bound, flat):
    fit = fit_inter_node(RUNS, intra_node_gbps=2400.0, predict=Slope(seconds))
    assert (fit.bound, fit.flat) == (bound, flat)
    assert (fit.problem is None) == (bound is None and not flat)
    if bound is None and not flat:
        assert fit.gbps == pytest.approx(100, rel=1e-3)
    elif bound == "high":
        assert fit.gbps == pytest.approx(HIGH_GBPS, rel=1e-2) and "upper bound" in fit.problem
    elif bound == "low":
        assert fit.gbps == pytest.approx(LOW_GBPS, rel=1e-2) and "lower bound" in fit.problem
    else:
        assert "cannot identify" in fit.problem


def test_plan_marks_an_undetermined_calibration(tmp_path, capsys):
    """A run measured faster than its codec alone allows (1 us; each compressed call costs
    at least ~0.8 ms) is slower predicted at every bandwidth: the fit ends on the upper
    bound, plan prints the warning and --json marks it."""
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([dict(RUNS[0], step_s=1e-6)]))
    args = ["plan", "--hidden", "64", "--layers", "2", "--seq-len", "8", "--nodes", "2",
            "--gpus-per-node", "1", "--gpu-tflops", "100", "--calibrate", str(path)]
    main(args + ["--json"])
    report = json.loads(capsys.readouterr().out)
    assert "upper bound" in report["calibration_problem"]
    assert report["fitted_inter_node_gbps"] == pytest.approx(HIGH_GBPS, rel=1e-2)
    assert "calibration the runs do not determine" in report["recommendation"]["why"]
    main(args)
    assert "warning: calibration not determined" in capsys.readouterr().out


def test_a_nominal_bandwidth_shows_the_range_of_answers(capsys):
    """A data-sheet 200 Gbit/s: priced at the papers' median effective / stated (1.12), with
    every preset's speedup and the recommendation at their lowest (0.134) and highest (4.95);
    the answer at the low end is the 26.8 Gbit/s plan's."""
    kw = dict(nodes=16, gpus_per_node=8, gpu_tflops=400)
    report = plan(LLAMA2["70b"], list(LOSS_KEEPING), nominal_inter_node_gbps=200, **kw)
    links = report["links"]
    assert links["inter_node_gbps"] == pytest.approx(200 * 1.12)
    assert "--nominal-inter-node-gbps 200 x 1.12" in links["source"]
    low, high = links["nominal_range"]["low"], links["nominal_range"]["high"]
    assert low["inter_node_gbps"] == pytest.approx(26.8) and high["efficiency"] == 4.95
    direct = plan(LLAMA2["70b"], list(LOSS_KEEPING), inter_node_gbps=26.8, **kw)
    assert low["speedups"] == {k: p["speedup"] for k, p in direct["presets"].items()}
    assert low["speedups"]["sdp4bit"] > report["presets"]["sdp4bit"]["speedup"] \
        > high["speedups"]["sdp4bit"]
    with pytest.raises(ValueError, match="not both"):
        plan(LLAMA2["7b"], ["sdp4bit"], inter_node_gbps=100, nominal_inter_node_gbps=200, **kw)
    main(["plan", "--hidden", "4096", "--layers", "32", "--nodes", "4", "--gpu-tflops", "400",
          "--nominal-inter-node-gbps", "100"])
    out = capsys.readouterr().out
    assert "nominal 100 Gbit/s: priced at x 1.12" in out and "x 0.134 (13.4 Gbit/s)" in out
