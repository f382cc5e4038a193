"""How the benchmarks compute on this CPU: bf16 natively, or bf16 on the wire with fp32 matmuls.

CPUs of one machine kind differ (``PLATFORM.md``): with ``avx512_bf16`` / AMX a bf16 GEMM runs
at fp32 speed or better; with AVX2 only it is emulated, ~20x slower than fp32, and a
benchmark computing in bf16 (FSDP2 ``param_dtype=bf16``, DDP bf16 autocast) measures that
emulation instead of the communication it is about. ``probe()`` measures both GEMMs on the
benchmark's shapes and reads the CPU flags; ``choose("auto")`` keeps bf16 where it is native
and otherwise picks ``fp32_matmul``: every variant alike still holds bf16 parameters and
activations and puts exactly the same bytes on the wire (the all-gathers carry bf16, the
reductions fp32, as on a GPU), but ``F.linear`` and ``F.scaled_dot_product_attention`` on
bf16 operands compute in fp32 and round their result to bf16 (a GPU's bf16 GEMM
accumulates in fp32 too). ``install(mode)`` applies it in a worker process; the mode and
the measurements go into every benchmark's metadata (``run_info``).
"""

from __future__ import annotations

import time
from pathlib import Path

MODES = ("auto", "bf16", "fp32_matmul")
#: bf16 GEMM throughput below this share of fp32's counts as emulated
NATIVE_SHARE = 0.5
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """The bf16-relevant instruction-set flags of this CPU (``/proc/cpuinfo``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in _FLAGS if f in have]


def gemm_gflops(dtype, m: int = 64, k: int = 512, n: int = 1376, seconds: float = 0.3) -> float:
    """GFLOP/s of ``[m, k] @ [k, n]`` in ``dtype`` on one thread (the slow-link model's MLP)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        a @ b
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            calls += 1
        return 2 * m * k * n * calls / (time.perf_counter() - t0) / 1e9
    finally:
        torch.set_num_threads(threads)


def probe() -> dict[str, float | list[str]]:
    import torch

    return {"flags": cpu_flags(), "bf16_gflops": gemm_gflops(torch.bfloat16),
            "fp32_gflops": gemm_gflops(torch.float32)}


def choose(mode: str, measured: dict | None = None) -> tuple[str, dict]:
    """``mode`` resolved (``auto``: ``bf16`` if the bf16 GEMM reaches ``NATIVE_SHARE`` of
    fp32's throughput, else ``fp32_matmul``) and the measurements behind it."""
    if mode not in MODES:
        raise ValueError(f"compute mode {mode!r}: use one of {', '.join(MODES)}")
    measured = measured or probe()
    if mode == "auto":
        native = measured["bf16_gflops"] >= NATIVE_SHARE * measured["fp32_gflops"]
        mode = "bf16" if native else "fp32_matmul"
    return mode, measured


def describe(mode: str, measured: dict) -> str:
    """One line for the output and the metadata."""
    flags = ", ".join(measured["flags"]) or "none of " + ", ".join(_FLAGS)
    how = ("bf16 compute (native on this CPU)" if mode == "bf16" else
           "bf16 parameters and wire, matmuls / attention in fp32 (bf16 is emulated on this "
           "CPU: same bytes on the wire, compute at fp32 speed)")
    return (f"{how}; GEMM 64x512x1376 one thread: bf16 {measured['bf16_gflops']:.1f}, fp32 "
            f"{measured['fp32_gflops']:.1f} GFLOP/s; CPU flags: {flags}")


def install(mode: str) -> None:
    """In this process: with ``fp32_matmul``, ``F.linear`` / ``F.scaled_dot_product_attention``
    on bf16 operands (or under bf16 autocast) compute in fp32, the result rounded to bf16."""
    if mode != "fp32_matmul":
        return
    import torch
    import torch.nn.functional as F

    if getattr(F.linear, "_fp32_matmul", False):
        return
    low = torch.bfloat16

    def lowp(*tensors) -> bool:
        amp = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == low
        return amp or any(t is not None and t.dtype == low for t in tensors)

    def up(t):
        return t.float() if t is not None and t.is_floating_point() else t

    linear, sdpa = F.linear, F.scaled_dot_product_attention

    def fp32_linear(x, weight, bias=None):
        if not lowp(x, weight, bias):
            return linear(x, weight, bias)
        with torch.autocast("cpu", enabled=False):
            return linear(up(x), up(weight), up(bias)).to(low)

    def fp32_sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        if not lowp(query, key, value):
            return sdpa(query, key, value, attn_mask, *args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            return sdpa(up(query), up(key), up(value), up(attn_mask), *args,
                        **kwargs).to(low)

    fp32_linear._fp32_matmul = True
    F.linear, F.scaled_dot_product_attention = fp32_linear, fp32_sdpa
