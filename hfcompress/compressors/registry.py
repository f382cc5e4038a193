"""Name -> compressor class registry (peft-style): ``get_compressor("int", bits=4)``."""

from __future__ import annotations

import difflib
from typing import Any

from .base import Compressor

_REGISTRY: dict[str, type[Compressor]] = {}


def register_compressor(name: str, cls: type[Compressor] | None = None):
    """Register ``cls`` under ``name``; usable as ``@register_compressor("name")`` too."""

    def _register(c: type[Compressor]) -> type[Compressor]:
        if not (isinstance(c, type) and issubclass(c, Compressor)):
            raise TypeError(f"register_compressor({name!r}): {c!r} is not a Compressor subclass")
        if name in _REGISTRY and _REGISTRY[name] is not c:
            raise ValueError(f"compressor {name!r} is already registered to {_REGISTRY[name].__name__}")
        c.name = name
        _REGISTRY[name] = c
        return c

    return _register(cls) if cls is not None else _register


def list_compressors() -> list[str]:
    """Names of every registered compressor, sorted."""
    return sorted(_REGISTRY)


def get_compressor(name: str, **params: Any) -> Compressor:
    """A new instance of the compressor registered as ``name`` with ``params``."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown compressor {name!r}.{hint} Valid names: {', '.join(list_compressors())}")
    return _REGISTRY[name](**params)
