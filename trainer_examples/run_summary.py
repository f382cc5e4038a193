"""The end of a ``trainer_examples`` run: ``summary.json`` (read by ``hfcompress compare``)
and the lines printed on the main process.

``summary.json`` holds what tells runs apart (model, preset, engine, world size, ranks per
node, the device mesh), the losses (each logged training loss with its step and wall-clock second), whether
the run diverged (``diverged``, ``diverged_at_step``, ``nonfinite_steps``: see
:func:`nonfinite`), the evaluation loss, time (training wall time, steps per second) and,
with a ``comm_compressor``, the communication totals ``hfcompress.Trainer`` logged: bytes
sent (intra- and inter-node), the bytes the exact collectives would have sent, the ratio,
and the time in the collectives, split into the warm-up (first steps: kernel compilation,
qWD's exact first all-gather) and the steady state.
"""

from __future__ import annotations

import math
import time

from torch.distributed.fsdp import FSDPModule
from transformers import TrainerCallback

import hfcompress
from hfcompress.trainer.accelerate_cpu import sharded_by_transformers
from mesh_args import mesh_shape


class LossClock(TrainerCallback):
    """Seconds since training (re)started at each logged training loss, and the step the
    run started from (> 0 after a resume)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.start_step = 0
        self.times: dict[int, float] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0, self.start_step = time.perf_counter(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.times[state.global_step] = time.perf_counter() - self.t0


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def nonfinite_loss(entry: dict) -> bool:
    """Whether a logged training window had NaN / Inf losses. Hugging Face's
    ``logging_nan_inf_filter`` (on by default) leaves them out of ``loss``: the window then
    logs the mean of its finite losses, and 0.0 once every loss is NaN (with a NaN
    ``grad_norm``). ``hfcompress.Trainer`` counts them (``nonfinite_losses``)."""
    loss, norm = entry["loss"], entry.get("grad_norm")
    return bool(entry.get("nonfinite_losses")) or not _finite(loss) \
        or (loss == 0 and norm is not None and not _finite(norm))


def nonfinite(logged: list[dict], eval_metrics: dict) -> dict:
    """``nonfinite_steps``: the logged steps whose window had a NaN / Inf loss or
    ``grad_norm`` (a step that fp16 loss scaling skipped has an Inf ``grad_norm`` and the
    run recovers); ``diverged``: the run ended non-finite (NaN / Inf losses in its last
    logged window, or its evaluation loss); ``diverged_at_step``: the first logged step of
    the non-finite windows it ended with."""
    bad = [nonfinite_loss(e) or ("grad_norm" in e and not _finite(e["grad_norm"]))
           for e in logged]
    eval_bad = "eval_loss" in eval_metrics and not _finite(eval_metrics["eval_loss"])
    diverged = eval_bad or bool(logged and nonfinite_loss(logged[-1]))
    at = None
    for e, b in zip(reversed(logged), reversed(bad)):
        if not diverged or not b:
            break
        at = e["step"]
    return {"diverged": diverged, "diverged_at_step": at,
            "nonfinite_steps": [e["step"] for e, b in zip(logged, bad) if b]}


def summarize(log_history: list[dict], eval_metrics: dict, clock: LossClock | None = None
              ) -> dict:
    """Losses, divergence, time and the communication totals of ``log_history`` (see the
    module docstring); ``comm_*`` keys only when ``hfcompress.Trainer`` logged them. A
    window with NaN / Inf losses records its loss as NaN (not the 0.0 or partial mean HF's
    filter logged for it)."""
    times = clock.times if clock is not None else {}
    logged = [e for e in log_history if "loss" in e]
    losses = [math.nan if nonfinite_loss(e) else e["loss"] for e in logged]
    out = {"train_losses": losses,
           "train_loss_history": [{"step": e["step"], "loss": x,
                                   **({"time_s": times[e["step"]]} if e["step"] in times
                                      else {})} for e, x in zip(logged, losses)],
           "train_loss_first": losses[0] if losses else float("nan"),
           "train_loss_last": losses[-1] if losses else float("nan"),
           **nonfinite(logged, eval_metrics),
           "eval_loss": eval_metrics.get("eval_loss", float("nan"))}
    out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
    runs = [e for e in log_history if "train_runtime" in e]
    if runs:
        out.update(train_runtime_s=runs[-1]["train_runtime"],
                   steps_per_second=runs[-1]["train_steps_per_second"])
    totals = [e for e in log_history if "comm/total_bytes" in e]
    if totals:
        t = totals[-1]
        out.update(comm_bytes=t["comm/total_bytes"],
                   comm_uncompressed_bytes=t["comm/total_uncompressed_bytes"],
                   comm_bytes_saved=t["comm/total_bytes_saved"],
                   comm_ratio=t["comm/total_uncompressed_bytes"] / max(t["comm/total_bytes"], 1),
                   comm_time_s=t["comm/total_time_s"])
        for key in ("inter_node_bytes", "intra_node_bytes", "steps", "warmup_steps",
                    "warmup_time_s", "steady_time_s_per_step"):
            if f"comm/total_{key}" in t:
                out[f"comm_{key}"] = t[f"comm/total_{key}"]
        if "comm_steady_time_s_per_step" in out:
            out["comm_steady_s_per_step"] = out.pop("comm_steady_time_s_per_step")
    return out


def describe_model(model) -> dict:
    """Class and parameter count, taken before the Trainer wraps or shards the model (the
    class under FSDP2's ``FSDP<class>`` of a model transformers sharded at load time)."""
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    return {"model": cls.__name__,
            "n_params": sum(p.numel() for p in model.parameters())}


def describe(trainer, model: dict, world: int, ranks_per_node: int, start_step: int) -> dict:
    """What tells this run apart from others (the first keys of ``summary.json``);
    ``model``: :func:`describe_model`."""
    args = trainer.args
    fsdp = trainer.is_fsdp_enabled or sharded_by_transformers(trainer.model)   # TP: the latter
    engine = "fsdp2" if fsdp else "ddp" if world > 1 else "single"
    out = {**model, "comm_compressor": args.comm_compressor, "engine": engine,
           "world_size": world, "ranks_per_node": ranks_per_node, "nodes": world // ranks_per_node,
           "mesh": mesh_shape(args.parallelism_config),
           "resumed_from_step": start_step or None, "output_dir": args.output_dir,
           "hfcompress_version": hfcompress.__version__}
    handle = trainer.compression
    if handle is not None and handle.auto is not None:   # the choice, its table, the probe
        out["comm_auto"] = handle.auto.summary()
    return out


def auto_chose_exact(summary: dict) -> bool:
    """A ``comm_compressor="auto"`` run whose every plan (the first choice, each re-probe's)
    was exact collectives: nothing was compressed."""
    auto = summary.get("comm_auto")
    if summary.get("comm_compressor") != "auto" or not auto:
        return False
    plans = [h.get("was") for h in auto.get("history") or []] + [auto.get("chosen")]
    return all(plan == "exact" for plan in plans)


def link_note(summary: dict) -> str | None:
    """The link speed above which this run's compressed collectives took longer than the
    exact ones would have (their bytes alone, at that speed, take the steady-state time);
    for an ``auto`` run that chose exact collectives, that choice and the speed they ran at."""
    steady, steps = summary.get("comm_steady_s_per_step"), summary.get("comm_steps")
    if summary.get("comm_compressor") in (None, "none") or not steady or not steps:
        return None
    per_rank = summary["comm_uncompressed_bytes"] / steps / summary["world_size"]
    gbit = 8 * per_rank / steady / 1e9
    if auto_chose_exact(summary):
        return (f"auto chose exact collectives (its probe predicted that compressing would "
                f"not pay on these links): {per_rank / 2**20:.1f} MiB per rank and step in "
                f"{steady * 1e3:.0f} ms, ~{gbit:.2g} Gbit/s; its predictions are under "
                f"comm_auto in summary.json")
    return (f"compression pays off only where each rank's link is slower than ~{gbit:.2g} "
            f"Gbit/s: there the exact collectives' {per_rank / 2**20:.1f} MiB per rank and "
            f"step would take longer than the {steady * 1e3:.0f} ms the compressed ones took "
            f"(compare with a --comm_compressor none run: hfcompress compare)")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('s') else 's'}"


def report(summary: dict, logging_steps: int) -> None:
    """The end-of-run lines of the main process."""
    s = summary
    print(f"\n{s['model']}: {s['n_params'] / 1e6:.2f}M parameters, {s['steps']} steps on "
          f"{_plural(s['world_size'], 'process')} ({s['engine']}), "
          f"comm_compressor={s['comm_compressor']}"
          + (f", resumed at step {s['resumed_from_step']}" if s["resumed_from_step"] else ""))
    every = f"(every {logging_steps} steps: {' '.join(f'{x:.3f}' for x in s['train_losses'])})"
    if s.get("diverged"):
        at = s.get("diverged_at_step")
        print(f"train loss: {s['train_loss_first']:.4f} -> DIVERGED (NaN / Inf "
              + (f"from step {at}" if at is not None else "evaluation loss") + f") {every}")
    else:
        print(f"train loss: {s['train_loss_first']:.4f} -> {s['train_loss_last']:.4f} {every}")
        if s.get("nonfinite_steps"):
            print(f"            NaN / Inf loss or grad_norm at steps "
                  f"{', '.join(map(str, s['nonfinite_steps']))}; the run recovered")
    print(f"eval loss:  {s['eval_loss']:.4f} (perplexity {s['eval_perplexity']:.1f})")
    if "train_runtime_s" in s:
        print(f"time:       {s['train_runtime_s']:.1f} s training, "
              f"{s['steps_per_second']:.2f} steps/s")
    if "comm_bytes" in s:
        mib = {k: s[k] / 2**20 for k in ("comm_bytes", "comm_uncompressed_bytes",
                                         "comm_bytes_saved")}
        inter = f" ({s['comm_inter_node_bytes'] / 2**20:.1f} MiB inter-node)" \
            if "comm_inter_node_bytes" in s else ""
        covered = s.get("comm_steps", s["steps"])
        span = f" (the last {covered} of {s['steps']} steps: the checkpoint held no totals)" \
            if covered < s["steps"] else ""
        if s["comm_compressor"] == "none":
            what = ": exact collectives, metered"
        elif auto_chose_exact(s):
            what = ": exact collectives (auto's choice), metered"
        else:
            what = (f" instead of {mib['comm_uncompressed_bytes']:.1f} MiB "
                    f"({s['comm_ratio']:.2f}x less)")
        print(f"wire:       {mib['comm_bytes']:.1f} MiB sent{inter}{what}, all ranks{span}")
        if "comm_steady_s_per_step" in s:
            print(f"comm time:  {s['comm_warmup_time_s']:.1f} s warm-up (first "
                  f"{_plural(s['comm_warmup_steps'], 'step')}: kernel compilation, first "
                  f"sends) + {s['comm_steady_s_per_step'] * 1e3:.1f} ms per step after, "
                  f"per rank; {s['comm_time_s']:.1f} s in all")
        else:
            print(f"comm time:  {s['comm_time_s']:.1f} s in communication per rank")
        print(f"bytes saved: {s['comm_bytes_saved']:.0f} ({mib['comm_bytes_saved']:.1f} MiB)")
        note = link_note(s)
        if note:
            print(f"note:       {note}")
    elif s["comm_compressor"] is None:
        print("bytes saved: not measured (pass --comm_compressor; 'none' meters the exact "
              "collectives)")
    else:
        print("bytes saved: none (one process: nothing was communicated)")
