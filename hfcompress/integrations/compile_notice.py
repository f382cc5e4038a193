"""One line on rank 0 before the CPU kernels compile: the first steps of a compressed run
otherwise sit silent for a minute or more (the torch twins compile on first use, once per
process; Inductor caches them on disk). Said by the Trainer and by ``hfcompress.apply``,
whichever comes first, once per process."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..config import AutoSettings, CompressionConfig
from ..kernels.dispatch import compile_enabled

logger = logging.getLogger(__name__)

#: seconds the first steps spend compiling the CPU kernels with a cold Inductor cache on a
#: 2-core AVX2 machine (``trainer_examples/finetune_llama.py``, sdp4bit, FSDP2, 2 processes:
#: 93.7 s of communication warm-up, 2.7 s with HFCOMPRESS_COMPILE=0)
COMPILE_SECONDS = 90
_noticed = False


def compiles_kernels(config: CompressionConfig | AutoSettings | None, fsdp: bool) -> bool:
    """Whether ``config`` runs compressor kernels: ``auto`` (its probe times them), or a
    preset that compresses a collective of this engine (FSDP2: weights or gradients, or the
    HSDP replica all-reduce; DDP: the all-reduce). ``none`` runs exact collectives only."""
    if isinstance(config, AutoSettings):
        return True
    if not isinstance(config, CompressionConfig):
        return False
    if fsdp:
        return config.compresses_fsdp or config.all_reduce is not None
    return config.all_reduce_scheme is not None


def compile_notice(device: Any, config: CompressionConfig | AutoSettings | None = None,
                   fsdp: bool = True) -> None:
    """The line, on global rank 0 (``RANK``), once per process, only where kernels compile:
    the torch twins on CPU (``compile_enabled``), for a ``config`` that runs compressor
    kernels (``compiles_kernels``); on GPU, Triton's."""
    global _noticed
    if _noticed or torch.device(device).type != "cpu" \
            or not compiles_kernels(config, fsdp) or not compile_enabled():
        return
    _noticed = True
    if int(os.environ.get("RANK", "0")) == 0:
        logger.warning(f"hfcompress: compiling the compression kernels, about "
                       f"{COMPILE_SECONDS} s on a 2-core CPU (first steps only; later runs "
                       f"reuse the compile cache; HFCOMPRESS_COMPILE=0 runs them eagerly)")
