"""Every compression scheme, registered by name (see ``list_compressors()``)."""

from .base import Compressor, Packed
from .registry import get_compressor, list_compressors, register_compressor
from . import (global_qsgd, group_quant, hadamard, learned_levels, loco,  # noqa: F401 (register)
               qsgd, random_shift, weight_diff)

__all__ = ["Compressor", "Packed", "get_compressor", "list_compressors", "register_compressor"]
