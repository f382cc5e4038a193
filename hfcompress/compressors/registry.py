"""Name -> compressor class registry (peft-style): ``get_compressor("int", bits=4)``."""

from __future__ import annotations

import difflib
import hashlib
import inspect
from typing import Any, Protocol

from .base import COMPRESSORS as _REGISTRY
from .base import Compressor


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


#: names users may mistake for compressors -> what they are instead (the layers above fill
#: it: ``config`` adds its presets), for the unknown-name error
NOT_COMPRESSORS: dict[str, str] = {}


def list_compressors() -> list[str]:
    """Names of every registered compressor, sorted."""
    return sorted(_REGISTRY)


def get_compressor(name: str, **params: Any) -> Compressor:
    """A new instance of the compressor registered as ``name`` with ``params``."""
    if name not in _REGISTRY:
        if name in NOT_COMPRESSORS:
            raise ValueError(f"{name!r} is {NOT_COMPRESSORS[name]}, not a compressor. "
                             f"Compressors: {', '.join(list_compressors())}")
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown compressor {name!r}.{hint} Valid names: "
                         f"{', '.join(list_compressors())} (presets: hfcompress.list_presets())")
    return _REGISTRY[name](**params)


class SchemeLike(Protocol):
    """A registered name and its parameters (``hfcompress.config.Scheme``)."""

    name: str
    params: dict[str, Any]


def stream_seed(base: int, *key: Any) -> int:
    """A seed for one stream (e.g. rank, module, direction), derived from the base seed."""
    digest = hashlib.blake2b(repr((int(base), *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def build_compressor(scheme: SchemeLike | None, base_seed: int = 0, *key: Any,
                     **defaults: Any) -> Compressor | None:
    """A fresh compressor of ``scheme`` for the stream ``key`` (None: exact).

    A scheme whose class takes a ``seed`` gets ``stream_seed(scheme's seed or base_seed,
    *key)``: include the rank in ``key``, peers must not share rounding noise. ``defaults``
    fill the parameters the class takes and the scheme leaves unset (e.g. ``num_peers``)."""
    if scheme is None:
        return None
    if scheme.name not in _REGISTRY:
        get_compressor(scheme.name)     # the unknown-name error
    accepts = inspect.signature(_REGISTRY[scheme.name].__init__).parameters
    params = {**{k: v for k, v in defaults.items() if k in accepts}, **scheme.params}
    if "seed" in accepts:
        params["seed"] = stream_seed(scheme.params.get("seed", base_seed), *key)
    return get_compressor(scheme.name, **params)

