"""Every compression scheme, registered by name (see ``list_compressors()``)."""

from .base import Compressor, Packed
from .registry import get_compressor, list_compressors, register_compressor
from . import group_quant  # noqa: F401  (registers "int")

__all__ = ["Compressor", "Packed", "get_compressor", "list_compressors", "register_compressor"]
