"""hfcompress: ~4-bit communication for sharded data-parallel LLM training.

Implements SDP4Bit, ZeRO++, QSDP, Global-QSGD and LoCo as composable compressors.
"""

from .compressors import (Compressor, Packed, get_compressor, list_compressors,
                          register_compressor)
from .api import apply

__version__ = "0.1.0"
__all__ = ["Compressor", "Packed", "apply", "get_compressor", "list_compressors", "register_compressor"]
