"""Wire volume: bits per parameter per training step on intra- and inter-node links, for every
preset, measured by the hfcompress wire meter during real training, next to the analytic value
and the uncompressed baseline (ZeRO++ Table 5 style).

    python benchmarks/bench_wire_volume.py                 # 2 x 1 and 2 x 2 ranks, 4 steps
    python benchmarks/bench_wire_volume.py --quick         # 2 x 2 only, 3 steps
    python benchmarks/bench_wire_volume.py --topologies 2x1 --presets none,sdp4bit

A small LLaMA (hidden 256: groups of 128 / 2048 values fill up, padding stays < 1%) trains
``--steps`` steps on emulated nodes (gloo on the loopback, ``nodes x ranks_per_node``
processes): FSDP2 presets through ``hfcompress.apply`` (bf16 parameters, fp32 gradient
reduction), ``global_qsgd`` / ``global_qsgd_exp`` through the DDP comm hook, next to DDP's exact
fp32 all-reduce (``ddp``, metered through the same hook with compression off).

Accounting (``hfcompress.comm.wire_meter``): every rank counts what it sends itself, as
direct sends to each peer; a peer on another node makes them inter-node bytes. "Bits per
parameter" = the bits all ranks together send over that class of link in one step, divided
by the model's parameter count N (steps after the first: qWD sends its first all-gather
exactly). With 2 nodes x 1 rank every byte crosses nodes once, so a bf16 all-gather is 16 and
an fp32 reduce-scatter 32 bits per parameter, as in ZeRO++ Table 5 (M per collective). With
2 x 2 each value goes to both ranks of the other node (32 / 64): still direct sends, as gloo's
all-to-all does; a ring would carry 3/4 of that across nodes.

Analytic values follow from the preset's schemes (bits + scale bits per group), the exact
parameters (norms; QSDP: < 1024 values) and the collective's fan-out: all-gather and 1-hop
reduce-scatter send every value to the X (Y - 1) ranks of other nodes and the X - 1 ranks of
its own node; the 2-hop reduce-scatter sends (X - 1) Y N values inside nodes and (Y - 1) N
across (ZeRO++ E.3); hpZ's backward all-gather sends Y (X - 1) N_layers bf16 values inside
nodes and none across; qWD (node-sharded references) sends each value's differences to the
Y - 1 other nodes and the rebuilt bf16 values of each rank's Y slots to the X - 1 ranks of
its node; its backward all-gather sends no differences (every rank rebuilds the forward's
weights from its references), only that intra-node hop and the exact columns; DDP's
all-reduce counts as reduce-scatter + all-gather (2 x the fan-out). FSDP does not re-gather the root module (embeddings, head) in backward, so the
ZeRO-3 baseline of this model is 16 (N + N_layers) + 32 N per fan-out unit; ZeRO-2's is
16 N + 32 N. The target: sdp4bit's inter-node volume <= 1/5 of the baseline.

Writes ``wire_volume.csv``, ``wire_volume.md`` (a fragment for BENCHMARKS.md),
``wire_volume_meta.csv`` and ``wire_volume.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _dist_common as dc  # noqa: E402

COLLECTIVES = ("all_gather", "all_gather_bwd", "reduce_scatter", "all_reduce")
DIMS = {"hidden": 256, "intermediate": 688, "layers": 4, "heads": 4, "vocab": 2048,
        "seq": 64, "batch": 2}
TARGET = 1 / 5
FIELDS = ["topology", "nodes", "ranks_per_node", "preset", "engine", "params",
          "layer_params", "exact_params", "steps_measured"]
for _c in COLLECTIVES:
    FIELDS += [f"{_c}_{k}_{w}" for k in ("inter", "intra") for w in ("measured", "analytic")]
FIELDS += ["inter_measured", "inter_analytic", "intra_measured", "intra_analytic",
           "baseline_zero3_inter", "ratio_zero3", "zero2_inter_measured",
           "baseline_zero2_inter", "ratio_zero2", "exact_engine_inter", "ratio_exact_engine",
           "analytic_error"]


# -- analytic volume ------------------------------------------------------------------------
def scheme_bits(scheme, exact_bits: float) -> float:
    """Bits per value on the wire of one scheme, from its parameters (None: exact)."""
    if scheme is None:
        return exact_bits
    p = scheme.params
    if scheme.name in ("int", "hadamard"):      # codes + one float32 scale per group
        return p.get("bits", 4) + 32 / p.get("group_size", 128)
    if scheme.name == "qwd":                    # int4 differences, group 2048 (SDP4Bit 3.1)
        return 4 + 32 / 2048
    if scheme.name == "random_shift":           # codes + float32 base and step per bucket
        return p.get("bits", 8) + 64 / p.get("bucket_size", 1024)
    if scheme.name == "qsgd":                   # codes + float32 norm per bucket
        return p.get("bits", 8) + 32 / p.get("bucket_size", 1024)
    if scheme.name == "learned":                # codes + float32 lo, range per bucket; the
        return p.get("bits", 5) + 64 / p.get("bucket_size", 1024)  # level table is not counted
    if scheme.name in ("global_qsgd", "global_qsgd_exp"):   # one code per value, a float32
        block = p.get("block_size")                         # scale per block (or 1 per call)
        return p.get("bits", 8) + (32 / block if block else 0)
    raise ValueError(f"no analytic wire size for scheme {scheme.name!r}")


def analytic(preset: str, n: int, n_l: int, e: int, e_l: int, x: int, y: int,
             layers: int) -> dict:
    """``{collective: (intra_bits, inter_bits)}`` all ranks send in one step (see the module
    docstring). n / n_l: parameters (all / in layers), e / e_l: of them sent exactly;
    ``layers``: decoder layers (FSDP modules re-gathered in backward)."""
    from hfcompress.config import get_config

    cfg = get_config("none" if preset == "ddp" else preset)
    fan = (x - 1, x * (y - 1))                       # peers per value: (same node, others)

    def spread(bits_total: float, f=fan) -> tuple[float, float]:
        return bits_total * f[0], bits_total * f[1]

    if preset == "ddp" or preset in dc.DDP_PRESETS:  # all-reduce = reduce-scatter + all-gather
        b = scheme_bits(cfg.all_reduce, 32)
        return {"all_reduce": spread((n - e) * b + e * 32, (2 * fan[0], 2 * fan[1]))}
    wb = scheme_bits(cfg.weights, 16)
    out = {"all_gather": spread((n - e) * wb + e * 16)}
    qwd = cfg.weights is not None and cfg.weights.name == "qwd"
    if qwd:  # differences to one rank per other node, rebuilt bf16 slots inside the node
        ex = spread(e * 16)
        out["all_gather"] = (ex[0] + (n - e) * 16 * y * (x - 1), ex[1] + (n - e) * wb * (y - 1))
    if cfg.hpz:
        out["all_gather_bwd"] = (y * (x - 1) * n_l * 16.0, 0.0) if x > 1 else (0.0, 0.0)
    elif qwd:  # no differences: the intra-node hop of the references, exact columns
        ex = spread(e_l * 16)
        out["all_gather_bwd"] = (ex[0] + (n_l - e_l) * 16 * y * (x - 1), ex[1])
    else:
        out["all_gather_bwd"] = spread((n_l - e_l) * wb + e_l * 16)
    if cfg.two_hop:
        bi, bo = scheme_bits(cfg.grad_intra, 32), scheme_bits(cfg.grad_inter, 32)
        ex = spread(e * 32)
        out["reduce_scatter"] = ((x - 1) * y * (n - e) * bi + ex[0],
                                 (y - 1) * (n - e) * bo + ex[1])
    else:
        out["reduce_scatter"] = spread((n - e) * scheme_bits(cfg.grad_inter, 32) + e * 32)
    return out


def baseline(n: int, n_l: int, x: int, y: int) -> tuple[float, float]:
    """Inter-node bits per step of bf16 weights / fp32 gradients: (ZeRO-3 as FSDP runs it,
    ZeRO-2)."""
    remote = x * (y - 1)
    return (16 * (n + n_l) + 32 * n) * remote, (16 * n + 32 * n) * remote


# -- the distributed part -------------------------------------------------------------------
def worker(payload: dict) -> dict:
    """Every variant in turn: ``steps`` steps; this rank's meter history and param counts."""
    import torch.distributed as dist

    from hfcompress.config import get_config, is_exact

    x = dc.ranks_per_node()
    out = {}
    for name in payload["variants"]:
        v = dc.Variant(name, payload["dims"], x, metered_ddp=True)
        cfg = get_config("none" if name == "ddp" else name)
        named = {n: p.numel() for n, p in v.model.named_parameters()}
        exact = {n for n, k in named.items() if is_exact(n, k, cfg.exact_patterns, cfg.min_numel)}
        t0 = time.perf_counter()
        history = [v.step(i) for i in range(payload["steps"])]
        v.close()
        out[name] = {"history": history, "seconds": time.perf_counter() - t0,
                     "params": sum(named.values()),
                     "layer_params": sum(k for n, k in named.items() if ".layers." in n),
                     "exact": sum(named[n] for n in exact),
                     "layer_exact": sum(named[n] for n in exact if ".layers." in n),
                     "layers": payload["dims"]["layers"]}
        dist.barrier()
    return out


def measured(results: list[dict], name: str) -> tuple[dict, int]:
    """``{collective: (intra_bits, inter_bits)}`` summed over ranks, averaged over steps >= 1."""
    hists = [r[name]["history"][1:] for r in results]
    steps = len(hists[0])
    out = {}
    for c in COLLECTIVES:
        tot = [0, 0]
        for h in hists:
            for s in h:
                for tag, e in s["collectives"].items():
                    if tag == c or tag == f"{c}_exact":   # DDP's exact columns: all_reduce_exact
                        tot[0] += 8 * e["intra_bytes"]
                        tot[1] += 8 * e["inter_bytes"]
        if tot != [0, 0]:
            out[c] = (tot[0] / steps, tot[1] / steps)
    return out, steps


def rows_for(topology: tuple[int, int], results: list[dict], names: list[str]) -> list[dict]:
    y, x = topology
    rows = []
    for name in names:
        r = results[0][name]
        n, n_l, e, e_l = r["params"], r["layer_params"], r["exact"], r["layer_exact"]
        meas, steps = measured(results, name)
        ana = analytic(name, n, n_l, e, e_l, x, y, r["layers"])
        b3, b2 = baseline(n, n_l, x, y)
        row = {"topology": f"{y}x{x}", "nodes": y, "ranks_per_node": x, "preset": name,
               "engine": "DDP" if name == "ddp" or name in dc.DDP_PRESETS else "FSDP2",
               "params": n, "layer_params": n_l, "exact_params": e, "steps_measured": steps}
        for c in COLLECTIVES:
            for k, i in (("intra", 0), ("inter", 1)):
                row[f"{c}_{k}_measured"] = meas.get(c, (0.0, 0.0))[i] / n
                row[f"{c}_{k}_analytic"] = ana.get(c, (0.0, 0.0))[i] / n
        for k in ("inter", "intra"):
            for w in ("measured", "analytic"):
                row[f"{k}_{w}"] = sum(row[f"{c}_{k}_{w}"] for c in COLLECTIVES)
        row["baseline_zero3_inter"] = b3 / n
        row["baseline_zero2_inter"] = b2 / n
        row["ratio_zero3"] = row["inter_measured"] / row["baseline_zero3_inter"]
        if row["engine"] == "DDP":   # one all-reduce per step: ZeRO-2-like pattern
            row["zero2_inter_measured"] = row["inter_measured"]
        else:
            row["zero2_inter_measured"] = (row["all_gather_inter_measured"]
                                           + row["reduce_scatter_inter_measured"])
        row["ratio_zero2"] = row["zero2_inter_measured"] / row["baseline_zero2_inter"]
        exact = analytic("ddp" if row["engine"] == "DDP" else "none", n, n_l, e, e_l, x, y,
                         r["layers"])
        row["exact_engine_inter"] = sum(v[1] for v in exact.values()) / n
        row["ratio_exact_engine"] = row["inter_measured"] / row["exact_engine_inter"]
        tot_m = row["inter_measured"] + row["intra_measured"]
        tot_a = row["inter_analytic"] + row["intra_analytic"]
        row["analytic_error"] = tot_m / tot_a - 1 if tot_a else 0.0
        rows.append(row)
    return rows


# -- reporting ------------------------------------------------------------------------------
def fmt(v: float) -> str:
    return f"{v:.2f}"


def table(rows: list[dict]) -> str:
    header = ["preset", "engine", "fwd AG", "bwd AG", "RS / AR", "inter total",
              "inter analytic", "x ZeRO-3 base", "ZeRO-2 inter", "x ZeRO-2 base",
              "x exact same engine", "intra total", "intra analytic"]
    body = []
    for r in rows:
        rs = r["reduce_scatter_inter_measured"] + r["all_reduce_inter_measured"]
        body.append([r["preset"], r["engine"], fmt(r["all_gather_inter_measured"]),
                     fmt(r["all_gather_bwd_inter_measured"]), fmt(rs), fmt(r["inter_measured"]),
                     fmt(r["inter_analytic"]), f"{r['ratio_zero3']:.3f}",
                     fmt(r["zero2_inter_measured"]), f"{r['ratio_zero2']:.3f}",
                     f"{r['ratio_exact_engine']:.3f}", fmt(r["intra_measured"]),
                     fmt(r["intra_analytic"])])
    return dc.markdown_table(header, body)


def verdicts(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if r["preset"] != "sdp4bit":
            continue
        ok3, ok2 = r["ratio_zero3"] <= TARGET, r["ratio_zero2"] <= TARGET
        lines.append(f"{r['topology']}: sdp4bit inter-node volume = {r['ratio_zero3']:.3f} of the "
                     f"ZeRO-3 baseline ({'met' if ok3 else 'NOT met'}), {r['ratio_zero2']:.3f} of "
                     f"the ZeRO-2 baseline ({'met' if ok2 else 'NOT met'}); target <= "
                     f"{TARGET:.2f}.")
    worst = max(rows, key=lambda r: abs(r["analytic_error"]))
    lines.append(f"largest |measured / analytic - 1| over all rows: "
                 f"{abs(worst['analytic_error']) * 100:.2f}% ({worst['topology']} "
                 f"{worst['preset']}; padding to whole groups, qsdp_learned's level tables).")
    return lines


def plot(rows: list[dict], path: Path) -> bool:
    made = dc.plot_per_topology(rows, 4.5)
    if made is None:
        return False
    plt, fig, panels = made
    parts = [("all_gather", "fwd all-gather"), ("all_gather_bwd", "bwd all-gather"),
             ("reduce_scatter", "reduce-scatter"), ("all_reduce", "all-reduce (DDP)")]
    for topo, ax in panels:
        sub = [r for r in rows if r["topology"] == topo]
        names = [r["preset"] for r in sub]
        bottom = [0.0] * len(sub)
        for key, label in parts:
            vals = [r[f"{key}_inter_measured"] for r in sub]
            ax.bar(names, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        base = sub[0]["baseline_zero3_inter"]
        ax.axhline(base, color="k", ls="--", lw=1, label="bf16 / fp32 ZeRO-3 baseline")
        ax.axhline(base * TARGET, color="r", ls=":", lw=1, label="1/5 of the baseline")
        ax.set_title(f"{topo} (nodes x ranks): inter-node bits / parameter / step")
        ax.tick_params(axis="x", rotation=60)
        ax.legend(fontsize=7, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def parse_topologies(text: str) -> list[tuple[int, int]]:
    out = []
    for t in text.split(","):
        y, x = t.lower().split("x")
        out.append((int(y), int(x)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="2x1,2x2",
                    help="nodes x ranks per node, comma-separated (default 2x1,2x2)")
    ap.add_argument("--presets", default=",".join(dc.FSDP_PRESETS + ["ddp"] + dc.DDP_PRESETS))
    ap.add_argument("--steps", type=int, default=4, help="training steps (the first is not "
                    "counted)")
    ap.add_argument("--hidden", type=int, default=DIMS["hidden"])
    ap.add_argument("--quick", action="store_true", help="2x2 only, 3 steps")
    ap.add_argument("--out", type=Path, default=dc.RESULTS)
    a = ap.parse_args()
    if a.quick:
        a.topologies, a.steps = "2x2", 3
    if a.steps < 2:
        ap.error("--steps must be >= 2 (the first step is not counted)")
    names = [p.strip() for p in a.presets.split(",") if p.strip()]
    bad = [p for p in names if p not in dc.FSDP_PRESETS + ["ddp"] + dc.DDP_PRESETS]
    if bad:
        ap.error(f"unknown presets {bad}; known: {dc.FSDP_PRESETS + ['ddp'] + dc.DDP_PRESETS}")
    dims = dict(DIMS, hidden=a.hidden, intermediate=int(a.hidden * 2.6875) // 16 * 16,
                heads=max(1, a.hidden // 64))
    info = dc.run_info(("python benchmarks/bench_wire_volume.py " + " ".join(sys.argv[1:])).strip(),
                       dc.describe(dims),
                       f"topologies {a.topologies}, {a.steps} steps (first not counted), "
                       f"bf16 parameters / fp32 gradient reduction (FSDP2), DDP exact fp32 "
                       f"all-reduce, HFCOMPRESS_COMPILE=0 (eager kernels: volume only)")
    rows = []
    t0 = time.perf_counter()
    for topo in parse_topologies(a.topologies):
        y, x = topo
        print(f"== {y} nodes x {x} ranks: {len(names)} presets, {a.steps} steps each", flush=True)
        results = dc.launch("bench_wire_volume", "worker",
                            {"variants": names, "dims": dims, "steps": a.steps}, y, x,
                            env={"HFCOMPRESS_COMPILE": "0"})
        sub = rows_for(topo, results, names)
        rows += sub
        print(table(sub), flush=True)
    info["wall_time"] = f"{time.perf_counter() - t0:.0f} s"
    info["load_average_end"] = dc.load_average()
    lines = verdicts(rows)
    print("\n".join(lines))
    a.out.mkdir(parents=True, exist_ok=True)
    dc.write_csv(a.out / "wire_volume.csv", rows, FIELDS)
    dc.write_meta(a.out / "wire_volume_meta.csv", info)
    plotted = plot(rows, a.out / "wire_volume.png")
    md = ["### Wire volume (bits per parameter per step)", "", dc.info_block(info), "",
          "Inter-node bits per parameter per step summed over all ranks (measured by the wire "
          "meter, steps after the first); `x ZeRO-3 base` / `x ZeRO-2 base`: measured inter-node "
          "volume over the bf16-weights / fp32-gradients baseline (ZeRO-3: forward + backward "
          "all-gather + reduce-scatter; ZeRO-2: one all-gather + reduce-scatter; DDP rows: their "
          "all-reduce over the same baselines); `x exact same engine`: over the same engine "
          "with compression off (FSDP2 `none`, DDP fp32 all-reduce `ddp`, analytic). "
          "Accounting: direct sends (see the script's docstring).", ""]
    for topo in sorted({r["topology"] for r in rows}):
        sub = [r for r in rows if r["topology"] == topo]
        md += [f"**{topo} (nodes x ranks per node)**, N = {sub[0]['params']:,} parameters, "
               f"ZeRO-3 baseline {sub[0]['baseline_zero3_inter']:.2f}, ZeRO-2 baseline "
               f"{sub[0]['baseline_zero2_inter']:.2f} inter-node bits / parameter", "",
               table(sub), ""]
    md += [f"- {line}" for line in lines]
    if plotted:
        md += ["", "![wire volume](wire_volume.png)"]
    (a.out / "wire_volume.md").write_text("\n".join(md) + "\n")
    print(f"wrote {a.out / 'wire_volume.csv'}, wire_volume.md, wire_volume_meta.csv"
          + (", wire_volume.png" if plotted else ""))


if __name__ == "__main__":
    main()
