"""Codec rates of a GPU (values per second) by scheme, for the planner: the H200 kernel
throughputs of BENCHMARKS.md "GPU check (one GPU)" (run 2026-11-27_h200_run3, Triton
kernels on 64 Mi float32 values), turned from GB/s (bytes read + written, as
``benchmarks/gpu_check.py`` counts them) into values/s with that script's bytes per value.

A scheme's rate key is its name and bits (``"int4"``, ``"hadamard8"``, ``"qwd"``), with
``-nearest`` for round-to-nearest ``int`` schemes and ``loco+`` in front of a hop under LoCo
error feedback. Decompression is a plain dequantize for weights and a dequantize-and-sum of
peers for gradients (each value read once either way).
"""

from __future__ import annotations

from ..config import Scheme

INT4_WIRE, INT8_WIRE = 4.25 / 8, 8.25 / 8      # bytes per value, groups of 128 (+ fp32 scale)


def _vps(gb_per_s: float, bytes_per_value: float) -> float:
    return gb_per_s * 1e9 / bytes_per_value


# compress: read 4 B (fp32), write the payload
INT4_STOCHASTIC = _vps(1269, 4 + INT4_WIRE)       # kernels/int4_g128_quantize_stochastic
INT4_NEAREST = _vps(1588, 4 + INT4_WIRE)          # kernels/int4_g128_quantize_nearest
INT8_STOCHASTIC = _vps(1923, 4 + INT8_WIRE)       # kernels/int8_g128_quantize_stochastic
INT8_NEAREST = _vps(3073, 4 + INT8_WIRE)          # kernels/int8_g128_quantize_nearest
HADAMARD4 = _vps(1028, 4 + INT4_WIRE)             # kernels/hadamard32_int4_quantize
# not measured: int8 stochastic slowed as much as the Hadamard slows int4 (1028 / 1269)
HADAMARD8 = INT8_STOCHASTIC * 1028 / 1269
QWD_DIFF = _vps(2025, 8 + 0.5 + 2 / 1024)         # kernels/qwd_int4_g2048_difference_quantize
GLOBAL_QSGD8 = _vps(539.4, 4 + 1)                 # kernels/global_qsgd_int8_quantize
# not measured: int4 nearest plus the 8-bit error read and written (2 B more per value)
LOCO_INT4 = _vps(1588, 4 + INT4_WIRE + 2)
LOCO_INT4_STOCHASTIC = _vps(1269, 4 + INT4_WIRE + 2)
# decompress: a weight decode reads the payload, writes 4 B
INT4_DEQUANT = _vps(3364, INT4_WIRE + 4)          # kernels/int4_g128_dequantize
INT8_DEQUANT = _vps(3725, INT8_WIRE + 4)          # kernels/int8_g128_dequantize
# not measured: qWD's decode at int4's dequantize GB/s, reading the codes and the bf16
# reference, writing the reference and the bf16 weights (0.5 + 3 x 2 B per value)
QWD_DECODE = _vps(3364, 0.5 + 6)
# a gradient decode sums 8 peers' payloads into one fp32 output (4 / 8 B per input value)
INT4_SUM = _vps(430.3, INT4_WIRE + 0.5)           # kernels/int4_g128_dequantize_sum_8peers
INT8_SUM = _vps(562.4, INT8_WIRE + 0.5)           # kernels/int8_g128_dequantize_sum_8peers

#: rate key -> (compress values/s, weight decode values/s, gradient decode-sum values/s)
GPU_RATES: dict[str, tuple[float, float, float]] = {
    "int4": (INT4_STOCHASTIC, INT4_DEQUANT, INT4_SUM),
    "int4-nearest": (INT4_NEAREST, INT4_DEQUANT, INT4_SUM),
    "int8": (INT8_STOCHASTIC, INT8_DEQUANT, INT8_SUM),
    "int8-nearest": (INT8_NEAREST, INT8_DEQUANT, INT8_SUM),
    "hadamard4": (HADAMARD4, INT4_DEQUANT, INT4_SUM),  # one inverse rotation per output: small
    "hadamard8": (HADAMARD8, INT8_DEQUANT, INT8_SUM),
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


def default_rates(key: str) -> tuple[float, float, float]:
    """The GPU rates of ``key``; a scheme not measured on GPU (QSDP's random shift, QSGD,
    learned levels) gets the stochastic int rates of its bits (4 when it has none): the
    same memory traffic, so a lower bound on its cost."""
    if key in GPU_RATES:
        return GPU_RATES[key]
    digits = "".join(ch for ch in key.split("-")[0] if ch.isdigit())
    return GPU_RATES["int8" if digits and int(digits) > 4 else "int4"]
