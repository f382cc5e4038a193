"""hfcompress: ~4-bit communication for sharded data-parallel LLM training.

Implements SDP4Bit, ZeRO++, QSDP, Global-QSGD and LoCo as composable compressors.
"""

from .compressors import (Compressor, Packed, get_compressor, list_compressors,
                          register_compressor)
from .api import apply
from .config import list_presets
from .integrations.handle import Compression

__version__ = "0.1.0"
__all__ = ["Compression", "CompressionMixin", "Compressor", "Packed", "Trainer",
           "TrainingArguments", "apply", "get_compressor", "list_compressors", "list_presets",
           "optim", "register_compressor"]

_LAZY = {"CompressionMixin": ".trainer", "Trainer": ".trainer", "TrainingArguments": ".trainer",
         "optim": ".optim"}


def __getattr__(name: str):
    """``Trainer``, ``TrainingArguments``, ``CompressionMixin`` and ``optim`` import
    transformers: loaded on use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'hfcompress' has no attribute {name!r}")
    import importlib
    module = importlib.import_module(_LAZY[name], __name__)
    return module if name == "optim" else getattr(module, name)
