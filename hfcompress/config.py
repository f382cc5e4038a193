"""``CompressionConfig`` and the named presets users type (docs/architecture.md, "Presets").

A preset is only a named configuration: any weight scheme composes with any gradient scheme
and with LoCo error feedback. ``get_config("sdp4bit")`` returns a fresh, editable copy.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from .compressors import Compressor, get_compressor


@dataclass(frozen=True)
class Scheme:
    """A registered compressor name and its parameters (builds fresh instances)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Compressor:
        return get_compressor(self.name, **self.params)


def describe(scheme: Scheme | None) -> str:
    """``"hadamard 4-bit"``, ``"exact (uncompressed)"``, ... for messages."""
    if scheme is None:
        return "exact (uncompressed)"
    bits = scheme.params.get("bits")
    return f"{scheme.name} {bits}-bit" if bits is not None else scheme.name


AUTO = "auto"


@dataclass
class AutoSettings:
    """Settings of ``comm_compressor="auto"`` (``hfcompress/auto``): choose each collective's
    scheme from a start-up probe of the links and this device, among the loss-keeping ones.

    - ``pins``: collective kind -> option that is not chosen but fixed (e.g.
      ``{"weights": "qwd"}``; ``HFCOMPRESS_AUTO="weights=qwd,grad_inter=hs4"`` overrides);
    - ``reprobe_every``: probe and choose again every N optimizer steps (FSDP2; 0 = never),
      switching only at a step boundary;
    - ``overlap``: share of the wire time hidden behind compute (0: none, as measured on
      CPU / gloo); ``margin``: how much faster (relative) a plan compressing more collective
      kinds must be predicted to be; ``reps``: timed repetitions per probe measurement.
    """

    pins: dict[str, str] = field(default_factory=dict)
    reprobe_every: int = 0
    overlap: float = 0.0
    margin: float = 0.05
    reps: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.reprobe_every, bool) or not isinstance(self.reprobe_every, int) \
                or self.reprobe_every < 0:
            raise ValueError(f"reprobe_every={self.reprobe_every!r} must be an int >= 0")
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"overlap={self.overlap!r} must be in [0, 1)")
        if self.margin < 0 or self.reps < 1:
            raise ValueError(f"margin={self.margin!r} must be >= 0 and reps={self.reps!r} >= 1")


@dataclass
class CompressionConfig:
    """What each collective sends.

    - ``weights``: the all-gather scheme (FSDP forward/backward weights); None = exact.
    - ``grad_intra`` / ``grad_inter``: the reduce-scatter schemes of the intra-node and the
      inter-node all-to-all hop (``two_hop=True``, ZeRO++ B.3 / SDP4Bit 3.2); with
      ``two_hop=False`` only ``grad_inter`` is used, as a 1-hop all-to-all. None = exact.
    - ``loco``: LoCo error-feedback parameters (LoCo Alg. 1) wrapping the gradient scheme
      of the hop that leaves the rank first; None = no error feedback.
    - ``all_reduce``: the DDP / HSDP replica all-reduce scheme (Global-QSGD; e.g.
      ``Scheme("global_qsgd", {"block_size": 1024})``: one global scale per 1024 values).
    - ``hpz``: the backward all-gather stays inside the node (ZeRO++ 3.3).
    - ``exact_patterns`` / ``min_numel``: parameters whose name contains one of the patterns,
      or with fewer than ``min_numel`` values, are communicated exactly (QSDP keeps norms,
      biases and small tensors in full precision).
    - ``seed``: base seed of the stochastic schemes; each rank, module and direction draws
      its own stream from it (a scheme's own ``seed`` parameter replaces it).
    - ``auto``: not a fixed configuration but the automatic choice (``AutoSettings``):
      ``hfcompress.apply`` replaces it by the chosen one (``get_config("auto")``).
    """

    weights: Scheme | None = None
    grad_intra: Scheme | None = None
    grad_inter: Scheme | None = None
    two_hop: bool = False
    loco: dict[str, Any] | None = None
    all_reduce: Scheme | None = None
    hpz: bool = False
    exact_patterns: tuple[str, ...] = ("norm", "bias")
    min_numel: int = 0
    seed: int = 0
    name: str = "custom"
    auto: AutoSettings | None = None

    @property
    def compresses_fsdp(self) -> bool:
        """Whether anything FSDP2 sends (all-gather, reduce-scatter) is compressed."""
        return bool(self.weights or self.grad_intra or self.grad_inter or self.loco)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_INT4_W = Scheme("int", {"bits": 4, "group_size": 2048, "rounding": "nearest"})
_INT8_W = Scheme("int", {"bits": 8, "group_size": 2048, "rounding": "nearest"})
_QWD = Scheme("qwd")
_INT4_G = Scheme("int", {"bits": 4, "group_size": 128, "rounding": "stochastic"})
_INT8_G = Scheme("int", {"bits": 8, "group_size": 128, "rounding": "stochastic"})
_HS8 = Scheme("hadamard", {"bits": 8, "group_size": 128, "hadamard_size": 32})
_HS4 = Scheme("hadamard", {"bits": 4, "group_size": 128, "hadamard_size": 32})
_LOCO = {"beta": 0.2, "reset_every": 512, "error_scale": "group"}

PRESETS: dict[str, dict[str, Any]] = {
    "none": {},
    "qw": {"weights": _INT4_W},
    "qwd": {"weights": _QWD},
    "ulq": {"grad_intra": _INT4_G, "grad_inter": _INT4_G, "two_hop": True},
    "tlq": {"grad_intra": _INT8_G, "grad_inter": _INT4_G, "two_hop": True},
    "tlq_hs": {"grad_intra": _HS8, "grad_inter": _HS4, "two_hop": True},
    "sdp4bit": {"weights": _QWD, "grad_intra": _HS8, "grad_inter": _HS4, "two_hop": True},
    "zeropp": {"weights": _INT8_W, "hpz": True, "grad_intra": _INT4_G, "grad_inter": _INT4_G,
               "two_hop": True},
    "qsdp": {"weights": Scheme("random_shift", {"bits": 8, "bucket_size": 1024}),
             "grad_inter": Scheme("qsgd", {"bits": 8, "bucket_size": 1024}), "min_numel": 1024},
    "qsdp_learned": {"weights": Scheme("learned", {"bits": 5, "bucket_size": 1024}),
                     "grad_inter": Scheme("learned", {"bits": 4, "bucket_size": 1024}),
                     "min_numel": 1024},
    "global_qsgd": {"all_reduce": Scheme("global_qsgd", {"bits": 8})},
    "global_qsgd_exp": {"all_reduce": Scheme("global_qsgd_exp", {"bits": 8})},
    "loco": {"grad_inter": Scheme("int", {"bits": 4, "group_size": 128, "rounding": "nearest"}),
             "loco": _LOCO},
    "loco_zeropp": {"weights": _INT8_W, "hpz": True, "grad_intra": _INT4_G,
                    "grad_inter": _INT4_G, "two_hop": True, "loco": _LOCO},
}


def list_presets() -> list[str]:
    """The fixed presets ``comm_compressor=`` / ``hfcompress.apply(model, name)`` take
    (``get_config``); ``"auto"`` (:data:`AUTO`) is accepted too and chooses among them."""
    return list(PRESETS)


EXACT_WEIGHT_BITS, EXACT_GRAD_BITS = 16, 32   # bf16 weights, fp32 gradient reduction


def preset_bits(preset: str | CompressionConfig) -> dict[str, Any]:
    """Inter-node bits per parameter per training step, steady state, ZeRO++ Table 5 style.

    For 2 nodes x 1 rank (each value crosses the node boundary once per collective), a large
    model (every parameter in a decoder layer FSDP re-gathers in backward; the exactly sent
    norms and biases a negligible share), bf16 weights and fp32 gradient reduction when
    exact, and steady state (qWD after its first, exact send). Keys: ``engine`` ("FSDP2",
    or "DDP" for the all-reduce presets), ``weights_fwd`` / ``weights_bwd`` (the forward /
    backward all-gather: hpZ keeps the backward one inside the node, qWD sends a flag only),
    ``grads`` (reduce-scatter, or DDP's all-reduce = reduce-scatter + all-gather), ``total``.
    Measured values for a small model: BENCHMARKS.md "Wire volume".
    """
    from .compressors.registry import steady_bits_per_value

    cfg = get_config(preset)

    def bits(scheme: Scheme | None, exact: float) -> float:
        return exact if scheme is None else steady_bits_per_value(scheme.build())

    if cfg.all_reduce is not None:
        row = {"engine": "DDP", "weights_fwd": 0.0, "weights_bwd": 0.0,
               "grads": 2 * bits(cfg.all_reduce, EXACT_GRAD_BITS)}
    else:
        fwd = bits(cfg.weights, EXACT_WEIGHT_BITS)
        qwd = cfg.weights is not None and cfg.weights.name == "qwd"
        row = {"engine": "FSDP2", "weights_fwd": fwd,
               "weights_bwd": 0.0 if cfg.hpz or qwd else fwd,
               "grads": bits(cfg.grad_inter, EXACT_GRAD_BITS)}
    row["total"] = row["weights_fwd"] + row["weights_bwd"] + row["grads"]
    return row


def get_config(preset: str | CompressionConfig | AutoSettings) -> CompressionConfig:
    """The :class:`CompressionConfig` of a preset name (a config passes through); ``"auto"``
    or ``AutoSettings`` give a config whose ``auto`` field asks ``apply`` to choose."""
    if isinstance(preset, CompressionConfig):
        return preset
    if isinstance(preset, AutoSettings):
        return CompressionConfig(name=AUTO, auto=preset)
    if preset == AUTO:
        return CompressionConfig(name=AUTO, auto=AutoSettings())
    if preset not in PRESETS:
        close = difflib.get_close_matches(str(preset), [*PRESETS, AUTO], n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown comm_compressor preset {preset!r}.{hint} "
                         f"Valid presets: {', '.join(PRESETS)}, or {AUTO!r} (chosen from the "
                         f"measured links)")
    return CompressionConfig(name=preset, **PRESETS[preset])
