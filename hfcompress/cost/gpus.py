"""The GPU the planner assumes: its memory (what a preset's state must fit beside the training
state) and its HBM bandwidth, which scales the codec rates measured on one H200
(``codec_rates.py``): the codec kernels are memory-bound when fast (BENCHMARKS.md, "GPU
check": 10-49% of the H200's roofline, bytes read + written per value fixed by the scheme),
so another GPU runs them at its bandwidth's share of the H200's. Data-sheet figures (SXM
parts, dense HBM bandwidth); ``hfcompress probe`` measures the real rates on the user's GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

#: name -> (memory GB, HBM GB/s), from the vendors' data sheets
GPUS: dict[str, tuple[float, float]] = {
    "h200": (141, 4800), "h100": (80, 3350), "h800": (80, 3350),
    "a100": (80, 2039), "a100-40gb": (40, 1555), "a800": (80, 2039),
    "v100": (32, 900), "v100-16gb": (16, 900), "l40s": (48, 864), "mi300x": (192, 5300),
}
MEASURED_ON = "h200"          # the GPU of the codec rates in codec_rates.py
DEFAULT_MEMORY_GB = 80.0      # no --gpu / --gpu-memory-gb: an 80 GB part (H100, A100 80GB)


@dataclass(frozen=True)
class GpuAssumption:
    """Memory and codec-rate scale of the planner's GPU, with where each comes from."""

    name: str | None
    memory_gb: float
    codec_scale: float        # the H200's measured codec rates times this
    memory_source: str
    codec_source: str


def assume_gpu(gpu: str | None = None, gpu_memory_gb: float | None = None,
               hbm_gbps: float | None = None) -> GpuAssumption:
    """The GPU of ``gpu`` (a name of :data:`GPUS`), its memory replaced by ``gpu_memory_gb``
    and its bandwidth by ``hbm_gbps`` when given; without ``gpu``: :data:`DEFAULT_MEMORY_GB`
    and the H200's codec rates, each said so. ValueError on an unknown name."""
    if gpu is not None and gpu.lower() not in GPUS:
        raise ValueError(f"--gpu {gpu!r} is not one of {', '.join(GPUS)}: give the closest, or "
                         f"--gpu-memory-gb and --hbm-gbps")
    memory, hbm = GPUS[gpu.lower()] if gpu is not None else (None, None)
    h200 = GPUS[MEASURED_ON][1]
    if gpu_memory_gb is not None:
        memory_gb, memory_source = gpu_memory_gb, "given: --gpu-memory-gb"
    elif memory is not None:
        memory_gb, memory_source = memory, f"the {gpu}'s"
    else:
        memory_gb = DEFAULT_MEMORY_GB
        memory_source = "assumed, an 80 GB part: set --gpu or --gpu-memory-gb"
    if hbm_gbps is not None:
        bandwidth, what = hbm_gbps, f"--hbm-gbps {hbm_gbps:g}"
    elif hbm is not None:
        bandwidth, what = hbm, f"the {gpu}'s {hbm:g} GB/s"
    else:
        return GpuAssumption(gpu, memory_gb, 1.0, memory_source,
                             "an H200's Triton kernels, median of 3 runs (cost/codec_rates.py; "
                             "--gpu or --hbm-gbps scales them to yours)")
    scale = bandwidth / h200
    return GpuAssumption(gpu, memory_gb, scale, memory_source,
                         f"an H200's Triton kernels x {scale:.3g} ({what} of HBM against the "
                         f"H200's {h200:g}: memory-bound kernels, cost/gpus.py)")
