"""Backend choice for every kernel: Triton on CUDA tensors when Triton is usable, torch
otherwise. ``backend="triton"`` forces Triton (on CPU tensors this needs
``TRITON_INTERPRET=1`` set before hfcompress is imported, as the tests do)."""

from __future__ import annotations

import functools
import importlib.util
import os

from types import ModuleType

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """Triton is importable and not disabled with ``HFCOMPRESS_DISABLE_TRITON=1``."""
    if os.environ.get("HFCOMPRESS_DISABLE_TRITON", "0") == "1":
        return False
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(t: torch.Tensor, backend: str = "auto") -> bool:
    """Whether a kernel on tensor ``t`` runs its Triton version."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' but Triton is not installed (pip install triton)")
        if not t.is_cuda and not triton_interpreted():
            raise RuntimeError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 set "
                               "before hfcompress is imported")
        return True
    return t.is_cuda and triton_available()


def pick(t: torch.Tensor, backend: str, twin: ModuleType, triton_module: str) -> ModuleType:
    """The module implementing an op for tensor ``t``: the Triton module
    ``hfcompress.kernels.<triton_module>`` or the torch ``twin`` (same function names and
    signatures in both)."""
    if use_triton(t, backend):
        return importlib.import_module(f"{__package__}.{triton_module}")
    return twin
