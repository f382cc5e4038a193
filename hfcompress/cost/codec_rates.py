"""Codec rates of a GPU (values per second) by scheme, for the planner: the H200 kernel
throughputs of BENCHMARKS.md "GPU check (one GPU)", the median of its three runs
(``benchmarks/results/gpu_check/2026-11-27_h200_run1..3``, Triton kernels on 64 Mi float32
values), turned from GB/s (bytes read + written, as ``benchmarks/gpu_check.py`` counts them)
into values/s with that script's bytes per value. Keys no run measured are derived from
measured ones and listed in :data:`ESTIMATED` with how (``hfcompress plan`` prints them).

A scheme's rate key is its name and bits (``"int4"``, ``"hadamard8"``, ``"qwd"``), with
``-nearest`` for round-to-nearest ``int`` schemes and ``loco+`` in front of a hop under LoCo
error feedback. Decompression is a plain dequantize for weights and a dequantize-and-sum of
peers for gradients (each value read once either way); the Hadamard schemes' gradient decode
runs as the 2-hop path runs it: the sum of peers, then a separate inverse rotation pass.

Besides the rate, each compressed collective call costs at least :data:`PER_CALL_S` (host
work and launches, which a small model does not hide behind its kernels): the median over
the FSDP2 presets of the same runs' collectives-only steps of a small LLaMA (5 units, world
size 1), their time beyond ``none``'s per compressed call.
"""

from __future__ import annotations

from statistics import median

from ..config import Scheme

INT4_WIRE, INT8_WIRE = 4.25 / 8, 8.25 / 8      # bytes per value, groups of 128 (+ fp32 scale)


def _vps(gb_per_s: float, bytes_per_value: float) -> float:
    return gb_per_s * 1e9 / bytes_per_value


def _serial(*rates: float) -> float:
    """The rate of passes run one after the other over the same values."""
    return 1.0 / sum(1.0 / r for r in rates)


# compress: read 4 B (fp32), write the payload (GB/s: median of runs 1-3)
INT4_STOCHASTIC = _vps(1279, 4 + INT4_WIRE)       # kernels/int4_g128_quantize_stochastic
INT4_NEAREST = _vps(1602, 4 + INT4_WIRE)          # kernels/int4_g128_quantize_nearest
INT8_STOCHASTIC = _vps(1923, 4 + INT8_WIRE)       # kernels/int8_g128_quantize_stochastic
INT8_NEAREST = _vps(3099, 4 + INT8_WIRE)          # kernels/int8_g128_quantize_nearest
HADAMARD4 = _vps(1044, 4 + INT4_WIRE)             # kernels/hadamard32_int4_quantize
ROTATE = _vps(3976, 4 + 4)                        # kernels/hadamard32_rotate
HADAMARD8 = INT8_STOCHASTIC * 1044 / 1279         # estimated (ESTIMATED)
QWD_DIFF = _vps(2034, 8 + 0.5 + 2 / 1024)         # kernels/qwd_int4_g2048_difference_quantize
GLOBAL_QSGD8 = _vps(662.5, 4 + 1)                 # kernels/global_qsgd_int8_quantize
LOCO_INT4 = _vps(1602, 4 + INT4_WIRE + 2)         # estimated (ESTIMATED)
LOCO_INT4_STOCHASTIC = _vps(1279, 4 + INT4_WIRE + 2)   # estimated (ESTIMATED)
# decompress: a weight decode reads the payload, writes 4 B
INT4_DEQUANT = _vps(3357, INT4_WIRE + 4)          # kernels/int4_g128_dequantize
INT8_DEQUANT = _vps(3751, INT8_WIRE + 4)          # kernels/int8_g128_dequantize
QWD_DECODE = _vps(3357, 0.5 + 6)                  # estimated (ESTIMATED)
# a gradient decode sums 8 peers' payloads into one fp32 output (4 / 8 B per input value)
INT4_SUM = _vps(479.6, INT4_WIRE + 0.5)           # kernels/int4_g128_dequantize_sum_8peers
INT8_SUM = _vps(555.2, INT8_WIRE + 0.5)           # kernels/int8_g128_dequantize_sum_8peers
# the sum, then the inverse rotation of its output: 1 value per 8 summed
HADAMARD4_SUM = _serial(INT4_SUM, 8 * ROTATE)
HADAMARD8_SUM = _serial(INT8_SUM, 8 * ROTATE)

#: rate keys no run measured (in part), and how they are derived
ESTIMATED = {
    "hadamard8": "compress: int8 stochastic slowed as much as the Hadamard slows int4",
    "loco+int4": "compress: int4 quantize GB/s with the 8-bit error read and written",
    "loco+int4-nearest": "compress: int4 quantize GB/s with the 8-bit error read and written",
    "qwd": "decode: int4 dequantize GB/s over the codes and the bf16 reference read, the "
           "reference and the weights written",
}

#: collectives-only ms per step of the FSDP2 presets (medians of runs 1-3: 5 units, world
#: size 1) and their compressed calls per unit (all-gather, reduce-scatter)
STEP_MS = {"none": 2.236, "qw": 6.28, "qwd": 6.168, "ulq": 6.856, "tlq": 6.51,
           "tlq_hs": 7.766, "sdp4bit": 12.0, "zeropp": 8.568, "qsdp": 9.005,
           "qsdp_learned": 18.3, "loco": 6.459, "loco_zeropp": 9.499}
CALLS = {"qw": 1, "qwd": 1, "ulq": 1, "tlq": 1, "tlq_hs": 1, "sdp4bit": 2, "zeropp": 2,
         "qsdp": 2, "qsdp_learned": 2, "loco": 1, "loco_zeropp": 2}
#: seconds a compressed collective call costs at least (module docstring)
PER_CALL_S = median((STEP_MS[p] - STEP_MS["none"]) / (5 * n) for p, n in CALLS.items()) / 1e3

#: rate key -> (compress values/s, weight decode values/s, gradient decode-sum values/s)
GPU_RATES: dict[str, tuple[float, float, float]] = {
    "int4": (INT4_STOCHASTIC, INT4_DEQUANT, INT4_SUM),
    "int4-nearest": (INT4_NEAREST, INT4_DEQUANT, INT4_SUM),
    "int8": (INT8_STOCHASTIC, INT8_DEQUANT, INT8_SUM),
    "int8-nearest": (INT8_NEAREST, INT8_DEQUANT, INT8_SUM),
    "hadamard4": (HADAMARD4, INT4_DEQUANT, HADAMARD4_SUM),
    "hadamard8": (HADAMARD8, INT8_DEQUANT, HADAMARD8_SUM),
    "qwd": (QWD_DIFF, QWD_DECODE, QWD_DECODE),
    "loco+int4-nearest": (LOCO_INT4, INT4_DEQUANT, INT4_SUM),
    "loco+int4": (LOCO_INT4_STOCHASTIC, INT4_DEQUANT, INT4_SUM),
    "global_qsgd8": (GLOBAL_QSGD8, INT8_DEQUANT, INT8_SUM),
    "global_qsgd_exp8": (GLOBAL_QSGD8, INT8_DEQUANT, INT8_SUM),
}


def rate_key(scheme: Scheme, loco: bool = False) -> str:
    """``"int4"``, ``"int8-nearest"``, ``"hadamard8"``, ``"qwd"``, ``"loco+int4-nearest"``..."""
    bits = scheme.params.get("bits", "")
    nearest = scheme.name == "int" and scheme.params.get("rounding") == "nearest"
    return f"{'loco+' if loco else ''}{scheme.name}{bits}{'-nearest' if nearest else ''}"


def estimated(key: str) -> str | None:
    """How the rates of ``key`` were estimated, or None when every one was measured."""
    if key in ESTIMATED:
        return ESTIMATED[key]
    if key not in GPU_RATES:
        return f"not measured: the {_fallback(key)} rates (the same memory traffic)"
    return None


def _fallback(key: str) -> str:
    digits = "".join(ch for ch in key.split("-")[0] if ch.isdigit())
    return "int8" if digits and int(digits) > 4 else "int4"


def default_rates(key: str) -> tuple[float, float, float]:
    """The GPU rates of ``key``; a scheme not measured on GPU (QSDP's random shift, QSGD,
    learned levels) gets the stochastic int rates of its bits (4 when it has none): the
    same memory traffic, so a lower bound on its cost."""
    return GPU_RATES.get(key) or GPU_RATES[_fallback(key)]
