"""``hfcompress compare``: the table and plot of runs, from ``summary.json`` files written by
``trainer_examples/run_summary.py`` (the functions the scripts use, fed a Trainer-shaped
log history)."""

import json
import math
import os
import sys

import pytest

from hfcompress.cli import main
from hfcompress.compare_runs import default_plot_path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "trainer_examples"))
from run_summary import LossClock, summarize  # noqa: E402


def log_history(losses, step_every, comm=None):
    """What ``hfcompress.Trainer`` leaves in ``state.log_history`` (the keys it logs)."""
    logs = [{"loss": x, "step": (i + 1) * step_every} for i, x in enumerate(losses)]
    end = {"train_runtime": 30.0, "train_steps_per_second": 0.4, "step": len(losses) * step_every}
    if comm:
        end.update({f"comm/total_{k}": v for k, v in comm.items()})
        end["comm/total_bytes_saved"] = comm["uncompressed_bytes"] - comm["bytes"]
    return logs + [end]


def write_run(root, name, preset, engine, losses, comm=None, times=True):
    clock = LossClock()
    if times:
        clock.times = {(i + 1) * 3: 2.0 * (i + 1) for i in range(len(losses))}
    summary = {"model": "LlamaForCausalLM", "n_params": 1000, "comm_compressor": preset,
               "engine": engine, "world_size": 4, "ranks_per_node": 2, "nodes": 2,
               "resumed_from_step": None, "steps": 3 * len(losses),
               **summarize(log_history(losses, 3, comm), {"eval_loss": losses[-1] + 0.1},
                           clock)}
    run = root / name
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary))
    return str(run)


NONE = {"bytes": 8 * 2**20, "uncompressed_bytes": 8 * 2**20, "inter_node_bytes": 4 * 2**20,
        "intra_node_bytes": 4 * 2**20, "time_s": 1.2, "steps": 12, "warmup_steps": 2,
        "warmup_time_s": 0.2, "steady_time_s_per_step": 0.1}
SDP = {**NONE, "bytes": 2**20, "inter_node_bytes": 0.25 * 2**20, "intra_node_bytes": 0.75 * 2**20,
       "time_s": 20.0, "warmup_time_s": 17.0, "steady_time_s_per_step": 0.3}


def test_table_plot_and_note(tmp_path, capsys):
    a = write_run(tmp_path, "llama-none", "none", "fsdp2", [7.0, 6.0, 5.5, 5.0], NONE)
    b = write_run(tmp_path, "llama-sdp4bit", "sdp4bit", "fsdp2", [7.0, 6.1, 5.6, 5.1], SDP)
    c = write_run(tmp_path, "llama-plain-ddp", None, "ddp", [7.0, 6.0, 5.4, 4.9], times=False)
    png = tmp_path / "cmp.png"
    main(["compare", a, b, os.path.join(c, "summary.json"), "--plot", str(png)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["run", "preset", "engine", "world"]
    rows = {line.split()[0]: line.split() for line in out[1:4]}
    #            preset    engine   world   (2x2)  steps loss    eval    inter MiB ratio
    assert rows["llama-none"][:10] == ["llama-none", "none", "fsdp2", "4", "(2x2)", "12",
                                       "5.0000", "5.1000", "4.0", "1.00"]
    assert rows["llama-sdp4bit"][8:] == ["0.2", "8.00", "30.0", "0.400", "0.3000"]
    assert rows["llama-plain-ddp"][1:3] == ["-", "ddp"] and rows["llama-plain-ddp"][8] == "-"
    # the compressed run's collectives took longer per step than the exact ones
    assert out[4].startswith("note: llama-sdp4bit spent 0.3000 s per step") \
        and "llama-none (exact) 0.1000 s" in out[4]
    assert out[5] == f"plot: {png}" and png.stat().st_size > 10_000


def test_missing_matplotlib_and_missing_summary(tmp_path, capsys, monkeypatch):
    a = write_run(tmp_path, "r1", "sdp4bit", "fsdp2", [7.0, 6.0], SDP)
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import fails as if absent
    main(["compare", a])
    out = capsys.readouterr().out
    assert "plot skipped: matplotlib is not installed (pip install matplotlib)" in out
    assert not (tmp_path / "compare.png").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["compare", a, str(tmp_path / "nope")])
    assert exit_.value.code == 2
    assert "nope: no summary.json" in capsys.readouterr().out


def test_default_plot_path_is_next_to_the_runs(tmp_path):
    runs = [str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")]
    assert os.path.abspath(default_plot_path(runs)) == str(tmp_path / "runs" / "compare.png")
    assert os.path.abspath(default_plot_path(runs[:1])) == str(tmp_path / "runs" / "compare.png")


def test_printed_summary_wording(tmp_path, capsys):
    """The scripts' end-of-run lines: plural processes, no '1.00x less' for exact
    collectives, warm-up apart from the steady state, the break-even link speed."""
    from run_summary import report

    for name, preset, comm in (("a", "none", NONE), ("b", "sdp4bit", SDP)):
        write_run(tmp_path, name, preset, "fsdp2", [7.0, 6.0, 5.5, 5.0], comm)
        report(json.loads((tmp_path / name / "summary.json").read_text()), 3)
    out = capsys.readouterr().out
    assert "12 steps on 4 processes (fsdp2), comm_compressor=none" in out
    assert "8.0 MiB sent (4.0 MiB inter-node): exact collectives, metered, all ranks" in out
    assert "1.00x less" not in out
    assert "1.0 MiB sent (0.2 MiB inter-node) instead of 8.0 MiB (8.00x less)" in out
    assert "17.0 s warm-up (first 2 steps: kernel compilation, first sends) + 300.0 ms per " \
        "step after" in out
    # 8 MiB / 12 steps / 4 ranks = 0.1667 MiB per rank and step in 0.3 s: 4.66 Mbit/s
    assert "slower than ~0.0047 Gbit/s" in out
    assert out.count("note:") == 1          # exact collectives get no break-even note


def test_auto_runs_show_their_choice(tmp_path, capsys):
    """A ``comm_compressor="auto"`` run's row names the plan it chose (``comm_auto``)."""
    run = write_run(tmp_path, "llama-auto", "auto", "fsdp2", [7.0, 6.0], SDP)
    path = os.path.join(run, "summary.json")
    summary = json.loads(open(path).read())
    summary["comm_auto"] = {"chosen": "weights=qwd grad_inter=hs4"}
    open(path, "w").write(json.dumps(summary))
    main(["compare", run, "--no_plot"])
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:2] == ["llama-auto", "auto(weights=qwd,grad_inter=hs4)"]


def test_auto_that_chose_exact_says_so(tmp_path, capsys):
    """An ``auto`` run whose plan was exact collectives (first choice and every re-probe) is
    reported as exact, not with the compressed runs' break-even note; one that compressed at
    some point keeps that note."""
    from run_summary import report

    for name, history in (("exact", [{"was": "exact", "chose": "exact"}]),
                          ("switched", [{"was": "weights=qwd", "chose": "exact"}])):
        write_run(tmp_path, name, "auto", "fsdp2", [7.0, 6.0, 5.5, 5.0], NONE)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        summary["comm_auto"] = {"chosen": "exact", "history": history}
        report(summary, 3)
        out = capsys.readouterr().out
        if name == "exact":
            assert "1.00x less" not in out
            assert "8.0 MiB sent (4.0 MiB inter-node): exact collectives (auto's choice), " \
                "metered, all ranks" in out
            # 8 MiB / 12 steps / 4 ranks = 0.1667 MiB per rank and step in 0.1 s: 14 Mbit/s
            assert "note:       auto chose exact collectives (its probe predicted that " \
                "compressing would not pay on these links): 0.2 MiB per rank and step in " \
                "100 ms, ~0.014 Gbit/s" in out
            assert "compressed ones" not in out
        else:
            assert "the compressed ones took" in out and "auto's choice" not in out


def diverged_history():
    """What the Trainer logs when NaN reaches the weights after step 4 (logging every 2
    steps): HF's ``logging_nan_inf_filter`` logs the window mean of its finite losses, then
    0.0; ``grad_norm`` is NaN; ``hfcompress.Trainer`` counts the NaN losses."""
    nan = float("nan")
    return [{"loss": 7.0, "grad_norm": 2.0, "step": 2}, {"loss": 6.0, "grad_norm": 1.5, "step": 4},
            {"loss": 5.9, "grad_norm": nan, "nonfinite_losses": 1, "step": 6},
            {"loss": 0.0, "grad_norm": nan, "nonfinite_losses": 2, "step": 8},
            {"train_runtime": 30.0, "train_steps_per_second": 0.4, "step": 8}]


def test_a_diverged_run_is_shown_as_diverged(tmp_path, capsys):
    """F4: after a NaN the summary says diverged (from the first non-finite window), the
    printed line says DIVERGED instead of '-> 0.0000', and ``hfcompress compare`` shows
    'diverged' in the loss column and 'nan' as the evaluation loss, with a note."""
    from run_summary import report

    summary = summarize(diverged_history(), {"eval_loss": float("nan")})
    assert summary["diverged"] is True and summary["diverged_at_step"] == 6
    assert summary["nonfinite_steps"] == [6, 8]
    assert math.isnan(summary["train_loss_last"])
    assert summary["train_losses"][:2] == [7.0, 6.0]
    assert all(math.isnan(x) for x in summary["train_losses"][2:])
    summary.update({"model": "LlamaForCausalLM", "n_params": 1000, "comm_compressor": "sdp4bit",
                    "engine": "fsdp2", "world_size": 2, "ranks_per_node": 1, "nodes": 2,
                    "resumed_from_step": None, "steps": 8})
    report(summary, 2)
    out = capsys.readouterr().out
    assert "train loss: 7.0000 -> DIVERGED (NaN / Inf from step 6)" in out, out
    assert "0.0000" not in out and "-> 0.0" not in out
    run = tmp_path / "llama-diverged"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary))     # NaN as JSON's NaN
    ok = write_run(tmp_path, "llama-ok", "none", "fsdp2", [7.0, 6.0, 5.5, 5.0], NONE)
    main(["compare", str(run), ok, "--no_plot"])
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[1:3]}
    assert rows["llama-diverged"][6:8] == ["diverged", "nan"], out
    assert rows["llama-ok"][6] == "5.0000"
    assert any(line.startswith("note: llama-diverged diverged (NaN / Inf from step 6)")
               for line in out), out


def test_nan_filter_zero_without_the_count_and_a_recovered_step():
    """A plain Trainer's log (no ``nonfinite_losses``): a 0.0 loss with a NaN grad_norm is
    HF's filter, not a loss; an Inf grad_norm mid-run that recovers (fp16 loss scaling
    skipped a step) is recorded, not called a divergence; the filter off logs NaN itself."""
    nan, inf = float("nan"), float("inf")
    plain = [{"loss": 7.0, "grad_norm": 1.0, "step": 1}, {"loss": 0.0, "grad_norm": nan,
                                                           "step": 2}]
    s = summarize(plain, {"eval_loss": nan})
    assert s["diverged"] and s["diverged_at_step"] == 2 and math.isnan(s["train_loss_last"])
    skipped = [{"loss": 7.0, "grad_norm": inf, "step": 1}, {"loss": 6.5, "grad_norm": 1.0,
                                                            "step": 2}]
    s = summarize(skipped, {"eval_loss": 6.4})
    assert not s["diverged"] and s["nonfinite_steps"] == [1] and s["train_loss_last"] == 6.5
    unfiltered = [{"loss": 7.0, "step": 1}, {"loss": nan, "step": 2}]
    s = summarize(unfiltered, {})
    assert s["diverged"] and s["diverged_at_step"] == 2
    s = summarize([{"loss": 7.0, "step": 1}], {"eval_loss": nan})   # only the eval is NaN
    assert s["diverged"] and s["diverged_at_step"] is None
