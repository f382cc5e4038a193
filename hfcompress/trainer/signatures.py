"""The signatures a ``CompressionMixin`` subclass shows (``inspect.signature``, IDEs, ``help``):
its Trainer's ``__init__``, ``train`` and ``log``, with the communication settings added to
``__init__`` as keyword-only parameters. The mixin's methods take ``*args, **kwargs`` and pass
them on; each subclass gets its own copy that carries the signature."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

SHOWN = ("__init__", "train", "log")


def show_trainer_signatures(cls: type, mixin: type) -> None:
    """On ``cls``, the mixin's ``SHOWN`` methods show the signatures of the Trainer the mixin
    wraps (the next class after it in ``cls``'s MRO); methods ``cls`` overrides are left."""
    for name in SHOWN:
        method = mixin.__dict__[name]
        if getattr(cls, name) is not method:
            continue
        extra = [p for p in inspect.signature(method).parameters.values()
                 if p.kind is p.KEYWORD_ONLY] if name == "__init__" else []
        setattr(cls, name, _showing(method, getattr(super(mixin, cls), name), extra))


def _showing(method: Callable, trainer_method: Callable,
             extra: list[inspect.Parameter]) -> Callable:
    """``method`` with the signature of ``trainer_method`` plus the ``extra`` keyword-only
    parameters."""
    @functools.wraps(method)
    def shown(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    sig = inspect.signature(trainer_method)
    params = list(sig.parameters.values())
    names = {p.name for p in params}
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    new = [p for p in extra if p.name not in names]
    shown.__signature__ = sig.replace(parameters=params[:at] + new + params[at:])
    return shown
