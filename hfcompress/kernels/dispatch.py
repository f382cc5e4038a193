"""Backend choice for every kernel: Triton on CUDA tensors when Triton is usable, torch
otherwise. ``backend="triton"`` forces Triton (on CPU tensors this needs
``TRITON_INTERPRET=1`` set before hfcompress is imported, as the tests do).

On CPU with ``backend="auto"``, a twin that lists function names in ``COMPILE_ON_CPU`` runs
them through ``torch.compile`` (Inductor C++: several times faster than eager, same numbers);
``HFCOMPRESS_COMPILE=0`` turns that off, and a function that fails to compile runs eager
after one warning. A twin may set ``COMPILE_OPTIONS`` (Inductor options for its functions).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import itertools
import os
import types
import warnings
from types import ModuleType
from typing import Any, Callable

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """Triton is importable and not disabled with ``HFCOMPRESS_DISABLE_TRITON=1``."""
    if env_flag("HFCOMPRESS_DISABLE_TRITON", False):
        return False
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Triton's own reading of ``TRITON_INTERPRET`` (1 / true / yes / on)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _ON


_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on")


def env_flag(name: str, default: bool) -> bool:
    """A boolean environment variable: 0 / false / no / off or 1 / true / yes / on (any
    case); anything else is refused with the accepted spellings."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    if value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    raise ValueError(f"{name}={value!r}: use one of {', '.join(_OFF)} (off) or "
                     f"{', '.join(_ON)} (on)")


def compile_enabled() -> bool:
    """CPU twins run compiled unless ``HFCOMPRESS_COMPILE`` is off (0 / false / no / off)."""
    return env_flag("HFCOMPRESS_COMPILE", True)


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
    ``hfcompress.kernels.<triton_module>``, the torch ``twin`` compiled (CPU, ``"auto"``,
    twins with ``COMPILE_ON_CPU``), or the ``twin`` itself (same names and signatures)."""
    if use_triton(t, backend):
        return _triton_module(triton_module)
    if (backend == "auto" and t.device.type == "cpu" and compile_enabled()
            and getattr(twin, "COMPILE_ON_CPU", ())):
        return compiled(twin)
    return twin


@functools.cache
def _triton_module(name: str) -> ModuleType:
    return importlib.import_module(f"{__package__}.{name}")


@functools.cache
def compiled(twin: ModuleType) -> ModuleType:
    """A copy of ``twin`` whose ``COMPILE_ON_CPU`` functions are :class:`Compiled`. Its other
    functions (composites of kernels) run in Python and call the copy's compiled functions,
    and those of the twins it imports (``from . import group_quant as _gq``): each kernel is
    its own graph, its output stored before the next one reads it."""
    mod = types.ModuleType(f"{twin.__name__}.compiled", twin.__doc__)
    ns = {k: v for k, v in vars(twin).items() if not k.startswith("__")}
    for k, v in ns.items():
        if isinstance(v, ModuleType) and getattr(v, "COMPILE_ON_CPU", ()):
            ns[k] = compiled(v)
        elif k in twin.COMPILE_ON_CPU:
            ns[k] = Compiled(v, getattr(twin, "COMPILE_OPTIONS", None))
        elif isinstance(v, types.FunctionType) and v.__module__ == twin.__name__:
            ns[k] = types.FunctionType(v.__code__, mod.__dict__, v.__name__, v.__defaults__,
                                       v.__closure__)
    mod.__dict__.update(ns)
    return mod


class Compiled:
    """``fn`` through ``torch.compile``, dynamic in tensor sizes: one graph per combination of
    its non-tensor arguments (bits, group size, dtype, ``None``: baked in as constants, so the
    code is as specialized as a static compile) and of its tensors' dtypes. Each combination
    gets its own code object, hence its own Dynamo cache and recompile limit. Runs eager: empty
    tensors, unhashable arguments, combinations past ``MAX_GRAPHS`` (arguments that vary every
    call, which would recompile every call) and, after one warning, failed compilations."""

    MAX_GRAPHS = 32

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.options = options
        self.signature = inspect.signature(fn)
        self.graphs: dict[tuple, Callable[..., Any] | None] = {}  # None: failed, run eager
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        args = tuple(bound.arguments.values())
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = tuple((a.dtype, a.dim()) if isinstance(a, torch.Tensor) else a for a in args)
        try:
            graph = self.graphs.get(key, _NEW)
        except TypeError:  # an unhashable argument
            return self.fn(*args)
        if (graph is None or any(t.numel() == 0 for t in tensors)
                or (graph is _NEW and len(self.graphs) >= self.MAX_GRAPHS)):
            return self.fn(*args)
        for t in tensors:
            for d in range(t.dim()):
                torch._dynamo.maybe_mark_dynamic(t, d)
        try:
            if graph is _NEW:
                graph = self.graphs[key] = torch.compile(_bind(self.fn, args),
                                                         options=self.options)
            return graph(*tensors)
        except Exception as err:  # noqa: BLE001 (any compiler failure: fall back to eager)
            out = self.fn(*args)  # raises if the arguments themselves are bad
            if not any(g is None for g in self.graphs.values()):
                warnings.warn(f"hfcompress: torch.compile of {self.fn.__module__}."
                              f"{self.fn.__name__} failed ({type(err).__name__}: {err}); running "
                              f"it eager (HFCOMPRESS_COMPILE=0 turns compilation off)",
                              RuntimeWarning, stacklevel=2)
            self.graphs[key] = None
            return out


_NEW = object()  # a combination of arguments not compiled yet
_IDS = itertools.count()  # makes every bound function's code name unique


def _bind(fn: Callable[..., Any], args: tuple) -> Callable[..., Any]:
    """``fn`` as a function of ``args``' tensors only (the other arguments fixed), built on a
    fresh code object with a name of its own: Dynamo remembers the sizes it saw per code
    name, file and line, so a shared name made every combination after the first compile as
    a "recompile" with generic dynamic sizes, measured ~5x slower."""
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    fixed = [None if isinstance(a, torch.Tensor) else a for a in args]

    def bound(*tensors: torch.Tensor) -> Any:
        full = list(fixed)
        for i, t in zip(slots, tensors):
            full[i] = t
        return fn(*full)

    code = bound.__code__.replace(co_name=f"{fn.__name__}_{next(_IDS)}")
    return types.FunctionType(code, bound.__globals__, fn.__name__, None, bound.__closure__)
