"""Compressor instances per stream, for schemes that keep state between calls.

A stateful compressor (SDP4Bit qWD references, LoCo error buffers) must see one tensor
stream per instance: a collective keys an instance (``compressor.fresh()``) by what it
compresses (all-gather slot, destination slice, hop, chunk). Stateless compressors are
shared. The layout a stateful stream was built for may not change between calls.
"""

from __future__ import annotations

import ast
from typing import Any, Hashable, Iterable

from ..compressors.base import Compressor


class Streams:
    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self._instances: dict[Hashable, Compressor] = {}
        self._layout: Any = None

    @property
    def stateful(self) -> bool:
        return bool(self.compressor.stateful)

    def __getitem__(self, key: Hashable) -> Compressor:
        if not self.stateful:
            return self.compressor
        if key not in self._instances:
            self._instances[key] = self.compressor.fresh()
        return self._instances[key]

    def instances(self) -> list[Compressor]:
        """Every instance in use (e.g. to call LoCo's ``step()`` once per optimizer step)."""
        return list(self._instances.values()) if self.stateful else [self.compressor]

    def check_layout(self, layout: Any) -> None:
        """A stateful stream set serves one layout (shape, group size, chunks) for life."""
        if not self.stateful:
            return
        if self._layout is not None and self._layout != layout:
            raise ValueError(f"{self.compressor.name} keeps state per stream, built for layout "
                             f"{self._layout}; got {layout}. Use one collective object per "
                             f"tensor and process group.")
        self._layout = layout

    def state_dict(self) -> dict[str, Any]:
        """Per-stream states, or the shared compressor's (e.g. its RNG) if stateless."""
        if not self.stateful:
            return {"shared": self.compressor.state_dict()}
        return {"layout": self._layout,
                "streams": {repr(k): c.state_dict() for k, c in self._instances.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.stateful:
            self.compressor.load_state_dict(state["shared"])
            return
        self._layout = state["layout"]
        self._instances = {}
        for key, st in state["streams"].items():
            c = self.compressor.fresh()
            c.load_state_dict(st)
            self._instances[ast.literal_eval(key)] = c


class StreamOwner:
    """State plumbing of a collective holding named ``Streams`` in ``self.streams``."""

    streams: dict[str, Streams]

    def compressors(self) -> list[Compressor]:
        """Every compressor instance in use (call LoCo's ``step()`` on each per optimizer step)."""
        return [c for s in self.streams.values() for c in s.instances()]

    def state_bytes(self) -> dict[str, int]:
        """Bytes of compressor state this rank keeps between calls, by kind ("references",
        "errors", "buffers"), summed over every instance in use."""
        return add_state_bytes(c.state_bytes() for c in self.compressors())

    def state_dict(self) -> dict[str, Any]:
        return {name: s.state_dict() for name, s in self.streams.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, st in state.items():
            layout = st.get("layout")
            if layout is not None:
                self.check_saved_layout(layout)
            self.streams[name].load_state_dict(st)

    def check_saved_layout(self, layout: Any) -> None:
        """Refuse a state saved for another world size / node layout (a collective that
        knows its layout before the first call overrides this)."""

    @staticmethod
    def refuse_layout(saved: dict[str, int], here: dict[str, int]) -> None:
        if saved != here:
            fmt = lambda d: ", ".join(f"{k}={v}" for k, v in d.items())  # noqa: E731
            raise ValueError(f"hfcompress compressor state was saved with {fmt(saved)}; this "
                             f"run has {fmt(here)}. Resume with the same number of ranks and "
                             f"nodes, or drop the hfcompress state from the checkpoint")


def add_state_bytes(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-kind sum of several ``state_bytes()`` dicts."""
    total: dict[str, int] = {}
    for part in parts:
        for kind, n in part.items():
            total[kind] = total.get(kind, 0) + int(n)
    return total


def stateless_only(compressors: list[Compressor | None], cls: str) -> None:
    """The one-shot functions cannot keep state between calls."""
    for c in compressors:
        if c is not None and c.stateful:
            raise ValueError(f"{c.name} keeps state between calls: use one {cls} object per "
                             f"tensor instead of the one-shot function")
