"""What ``comm_compressor="auto"`` may choose: per collective, the options whose training loss
the benchmarks show within 1% of exact communication (BENCHMARKS.md "Loss kept" and
"Fine-tuning"), and how a choice becomes a :class:`CompressionConfig`.

A :class:`Plan` names one option per collective kind: the FSDP2 weight all-gather, the
gradient reduce-scatter's intra-node and inter-node hops (ZeRO++ B.3 / SDP4Bit Alg. 3), and
the DDP / HSDP replica all-reduce. The weight options include hpZ (ZeRO++ 3.3: the layers
keep the weights the forward gathered for the backward; :data:`HPZ_OPTIONS`), which adds no
error but holds every layer's weights from forward to backward: it is a candidate only where
FSDP2 can switch it on an already sharded model and the weights fit
(``choose.hpz_available``).
Options that lose loss for speed (4-bit weights ``qw``:
+1.7% and +32% after one fine-tuning step; ``global_qsgd`` linear dithering per bucket:
+4.0%; PowerSGD: +5.9%) are never candidates; neither are options whose loss was measured
within 1% at one learning rate but not at the other (``zeropp``'s int4 gradients: -0.5% at
lr 1e-3, +3.6% at 3e-3).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass

from ..config import DDP_ROLES, FSDP_ROLES, PRESETS, CompressionConfig, Scheme

#: Environment variable that pins (part of) the choice, e.g. ``weights=qwd,grad_inter=hs4``
#: or ``weights=exact``; unpinned collectives are still chosen by the cost model.
PIN_ENV = "HFCOMPRESS_AUTO"

HS8, HS4 = PRESETS["tlq_hs"]["grad_intra"], PRESETS["tlq_hs"]["grad_inter"]   # TLq-HS's hops
QWZ = PRESETS["zeropp"]["weights"]     # ZeRO++ 3.1 qwZ: int8 blocks of 2048, nearest
QWZ_EVIDENCE = ("zeropp's weights alone (int8 blocks of 2048 + hpZ, exact gradients): "
                "-0.03% [-0.15, +0.14] (lr 1e-3), +0.61% [-0.76, +2.16] (lr 3e-3) over 4 "
                "seeds")
#: weight options with hpZ -> the all-gather option whose forward they run (and keep)
HPZ_OPTIONS = {"hpz": "exact", "qwz_hpz": "qwz"}

#: per collective kind: option name -> (scheme or None = exact, the loss evidence)
OPTIONS: dict[str, dict[str, tuple[Scheme | None, str]]] = {
    "weights": {
        "exact": (None, "exact"),
        "qwd": (PRESETS["qwd"]["weights"], "qwd: +0.01% [-0.09, +0.09] over 4 seeds (lr 1e-3), "
                               "+0.03% held-out after fine-tuning SmolLM2-135M"),
        "qwz": (QWZ, QWZ_EVIDENCE),
        "hpz": (None, "hpZ: the backward uses the weights the forward gathered (bitwise the "
                      "same values): no error"),
        "qwz_hpz": (QWZ, QWZ_EVIDENCE + "; hpZ adds no error"),
    },
    "grad_intra": {
        "exact": (None, "exact"),
        "hs8": (HS8, "tlq_hs (8-bit intra / 4-bit inter Hadamard): +0.12% [-0.35, +0.79] "
                     "over 8 seeds (lr 1e-3)"),
    },
    "grad_inter": {
        "exact": (None, "exact"),
        "hs4": (HS4, "tlq_hs / sdp4bit: +0.12% over 8 seeds (lr 1e-3); an exact intra hop "
                     "adds no error to it"),
    },
    "all_reduce": {
        "exact": (None, "exact"),
        "global_qsgd_exp": (PRESETS["global_qsgd_exp"]["all_reduce"],
                            "global_qsgd_exp: -0.10% vs exact DDP (seed 0, lr 1e-3)"),
        "global_qsgd_block": (Scheme("global_qsgd", {"bits": 8, "block_size": 1024}),
                              "global_qsgd, one scale per 1024 values: +0.12% vs exact DDP "
                              "(seed 0, lr 1e-3)"),
    },
}


@dataclass(frozen=True)
class Plan:
    """One option per collective kind (names from :data:`OPTIONS`)."""

    weights: str = "exact"
    grad_intra: str = "exact"
    grad_inter: str = "exact"
    all_reduce: str = "exact"

    @property
    def label(self) -> str:
        """``"weights=qwd grad_intra=hs8 grad_inter=hs4"``-style, compressed kinds only
        (``"exact"`` when nothing is compressed)."""
        parts = [f"{k}={v}" for k, v in asdict(self).items() if v != "exact"]
        return " ".join(parts) or "exact"

    def option(self, kind: str) -> str:
        """The option of ``kind`` whose collective runs (a weight option with hpZ: its
        all-gather's, :data:`HPZ_OPTIONS`): what the probe times and the codec rates key."""
        value = getattr(self, kind)
        return HPZ_OPTIONS.get(value, value) if kind == "weights" else value

    @property
    def hpz(self) -> bool:
        return self.weights in HPZ_OPTIONS

    def config(self, base: CompressionConfig = CompressionConfig()) -> CompressionConfig:
        """The :class:`CompressionConfig` that runs this plan (named ``auto: <label>``), with
        ``base``'s exactly sent parameters and seed (default: the defaults)."""
        scheme = {k: OPTIONS[k][v][0] for k, v in asdict(self).items()}
        two_hop = scheme["grad_intra"] is not None or scheme["grad_inter"] is not None
        return dataclasses.replace(
            base, weights=scheme["weights"], grad_intra=scheme["grad_intra"],
            grad_inter=scheme["grad_inter"], two_hop=two_hop, all_reduce=scheme["all_reduce"],
            loco=None, hpz=self.hpz, name=f"auto: {self.label}")

    def evidence(self) -> list[str]:
        return [OPTIONS[k][v][1] for k, v in asdict(self).items() if v != "exact"]


def candidates(kind: str, ranks_per_node: int, num_nodes: int,
               pins: dict[str, str] | None = None, hpz: bool = False) -> list[Plan]:
    """Every plan for ``kind`` ("fsdp2", or "ddp" / "hsdp": the all-reduce) that differs on
    this layout (no intra-node hop with one rank per node, no inter-node hop on one node),
    restricted to ``pins``; the hpZ options only if ``hpz`` (``choose.hpz_available``)."""
    pins = pins or {}
    kinds = FSDP_ROLES if kind == "fsdp2" else DDP_ROLES
    choices = {k: ([pins[k]] if k in pins else list(OPTIONS[k])) for k in kinds}
    if kind == "fsdp2":
        if not hpz and "weights" not in pins:
            choices["weights"] = [o for o in choices["weights"] if o not in HPZ_OPTIONS]
        if ranks_per_node == 1 and "grad_intra" not in pins:
            choices["grad_intra"] = ["exact"]
        if num_nodes == 1 and "grad_inter" not in pins:
            choices["grad_inter"] = ["exact"]
    plans = [{}]
    for k in kinds:
        plans = [{**p, k: v} for p in plans for v in choices[k]]
    return [Plan(**p) for p in plans]


def parse_pins(text: str | None) -> dict[str, str]:
    """``"weights=qwd,grad_inter=hs4"`` -> ``{"weights": "qwd", "grad_inter": "hs4"}``;
    ValueError naming the valid kinds and options."""
    pins: dict[str, str] = {}
    for part in (text or "").replace(" ", ",").split(","):
        if not part:
            continue
        kind, sep, option = part.partition("=")
        if not sep or kind not in OPTIONS or option not in OPTIONS[kind]:
            valid = "; ".join(f"{k}={'|'.join(v)}" for k, v in OPTIONS.items())
            raise ValueError(f"{PIN_ENV} / auto pin {part!r} is not KIND=OPTION with one of: "
                             f"{valid}")
        pins[kind] = option
    return pins


def pins_from_env() -> dict[str, str]:
    return parse_pins(os.environ.get(PIN_ENV))
