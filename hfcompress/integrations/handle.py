"""The one handle ``hfcompress.apply`` returns, for FSDP2, DDP and HSDP alike.

It owns what was installed (``FSDPInstall``: every FSDP module's collectives; or the
``AllReduceState`` of the DDP / HSDP all-reduce hook) and the ``WireMeter``:

- ``meter``: bytes sent, the uncompressed baseline and the time in the collectives (this
  rank's); ``node_traffic()``: those bytes summed per node and per data-parallel group over
  the world (collective);
- ``step()`` after every optimizer step: the error-feedback reset clock (LoCo Alg. 1 lines
  9-10) on every compressor that has one, then the meter's step boundary;
- ``state_dict()`` / ``load_state_dict()``: every compressor's state (qWD references, LoCo
  errors, RNG streams, learned levels); ``reset_references()``: qWD references rebuilt by
  an exact all-gather (also after ``model.load_state_dict``: restored weights recover from a
  NaN reference);
- ``memory_report()``: the bytes of that state on this rank, and the parameter bytes;
- ``remove()``: the framework's own exact collectives again (``disabled()`` for a block);
- ``auto``: with ``comm_compressor="auto"``, the choice (``hfcompress/auto``): stepped after
  every optimizer step (re-probes), saved with the state, reported by ``auto.summary()``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Protocol

from torch import nn
from torch.distributed.tensor import DTensor

from ..comm import Topology, WireMeter
from ..comm.streams import StreamOwner
from ..comm.wire_meter import node_traffic
from ..compressors.base import Compressor, ErrorFeedback, ReferenceCoded
from ..config import CompressionConfig
from ..cost.state import KINDS as STATE_KINDS   # of persistent compressor state

KINDS = ("fsdp2", "ddp", "hsdp")


class Installed(Protocol):
    """What a framework integration installs (``FSDPInstall``, ``AllReduceState``)."""

    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def collectives(self) -> list[StreamOwner]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def describe(self) -> str: ...


#: compressor class -> whether it is :class:`ErrorFeedback` (a runtime-checkable Protocol's
#: ``isinstance`` costs ~20 us: asked once per class, not per instance and step)
_FEEDBACK: dict[type, bool] = {}


def step_error_feedback(compressors: Iterable[Compressor]) -> None:
    """One optimizer step of every error-feedback compressor's reset clock (LoCo Alg. 1)."""
    for c in compressors:
        kind = type(c)
        if kind not in _FEEDBACK:
            _FEEDBACK[kind] = isinstance(c, ErrorFeedback)
        if _FEEDBACK[kind]:
            c.step()


def param_bytes(model: nn.Module) -> tuple[int, int]:
    """(this rank's local shard bytes, full parameter bytes) of ``model``."""
    local = full = 0
    for p in model.parameters():
        full += p.numel() * p.element_size()
        shard = p.to_local() if isinstance(p, DTensor) else p
        local += shard.numel() * shard.element_size()
    return local, full


class Compression:
    """Compressed communication installed on a model (see the module docstring).

    ``kind``: ``"fsdp2"``, ``"ddp"`` or ``"hsdp"``. ``comms`` (FSDP2): the collectives per
    FSDP module name; ``all_reduce`` (DDP, HSDP): the hook state; ``auto``: the
    ``AutoController`` of a ``comm_compressor="auto"`` handle, else None.
    """

    def __init__(self, kind: str, model: nn.Module, config: CompressionConfig,
                 topology: Topology | None, meter: WireMeter, installed: Installed,
                 auto: Any = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}; allowed: {KINDS}")
        self.kind, self.model, self.topology, self.meter = kind, model, topology, meter
        self._parts(config, installed)
        self.installed = False
        self.auto = auto             # an auto.AutoController when the config was "auto"
        # weights loaded over the model (a rollback, e.g. after a NaN reached them): qWD
        # references re-initialised exactly, as a non-finite reference never recovers
        model.register_load_state_dict_post_hook(lambda module, keys: self.reset_references())

    def install(self) -> "Compression":
        self.installed_parts.install()
        self.installed = True
        return self

    def remove(self) -> None:
        """The framework's own exact collectives again (compressor state is kept; DDP, which
        cannot unregister a comm hook, runs its default all-reduce)."""
        self.installed_parts.uninstall()
        self.installed = False

    def _parts(self, config: CompressionConfig, installed: Installed) -> None:
        self.config, self.installed_parts = config, installed
        self.comms = installed.comms if self.kind == "fsdp2" else {}
        self.all_reduce = installed if self.kind != "fsdp2" else None

    def adopt(self, config: CompressionConfig, installed: Installed) -> None:
        """Install other collectives of the same kind (``auto`` switching plans; call
        ``remove()`` first, so they record the framework's own ones to restore)."""
        self._parts(config, installed)
        self.install()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Exact collectives inside the block (e.g. to measure exact gradients)."""
        was = self.installed
        self.remove()
        try:
            yield
        finally:
            if was:
                self.install()

    def compressors(self) -> list[Compressor]:
        """Every compressor instance the installed collectives hold."""
        return [c for coll in self.installed_parts.collectives() for c in coll.compressors()]

    def step(self) -> dict:
        """End of an optimizer step: error-feedback reset clocks and the wire meter's step
        boundary. Returns the closed step's byte counts."""
        step_error_feedback(self.compressors())
        counts = self.meter.step()
        if self.auto is not None:
            self.auto.on_step(self)
        return counts

    @property
    def dp_size(self) -> int:
        """Ranks the data-parallel dims span: the topology's group (FSDP2's shard group, the
        DDP group), times the replicas under native HSDP; smaller than the world beside TP."""
        replica = getattr(self.installed_parts, "replica", None)   # hsdp.NativeHSDP's
        return self.topology.world_size * (1 if replica is None else replica.size)

    def node_traffic(self) -> dict:
        """The meter's bytes (last step, run total) summed per node (what the data-parallel
        groups of a node send together over its link) and per DP group, over the world: a
        collective, every rank calls it (``comm.wire_meter.node_traffic``)."""
        return node_traffic(self.meter, self.topology)

    def reset_references(self) -> None:
        """The next all-gather of every qWD stream is exact and re-initialises its reference
        from the current weights (SDP4Bit Alg. 4 line 2). Runs by itself after
        ``model.load_state_dict``; call it on every rank after restoring weights another way
        (e.g. ``p.copy_(saved)``), or a reference made NaN by NaN weights stays NaN."""
        for c in self.compressors():
            if isinstance(c, ReferenceCoded):
                c.reset_reference()

    def state_dict(self) -> dict[str, Any]:
        state = self.installed_parts.state_dict()
        if self.auto is not None:
            state = {**state, "auto_plan": self.auto.plan_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the compressor state (an ``auto`` handle first switches to the plan the
        state was saved under; a plan the pins given now exclude is not restored, and its
        state not loaded: ``AutoController.restore``)."""
        state = dict(state)
        plan = state.pop("auto_plan", None)
        if plan is not None and self.auto is not None and not self.auto.restore(self, plan):
            return
        self.installed_parts.load_state_dict(state)

    @property
    def state_estimate(self) -> dict[str, int] | None:
        """FSDP2: the compressor state per rank by kind, estimated before any was allocated
        (``cost/state.py``; on CUDA, ``apply`` raised if it could not fit: ``integrations/memory.py``). None
        for DDP."""
        return getattr(self.installed_parts, "state_estimate", None)

    def memory_report(self) -> dict[str, int]:
        """Bytes on this rank: compressor state per kind (``references``, ``errors``,
        ``buffers``) and their ``total``, this rank's parameter shard
        (``sharded_param_bytes``) and the full parameters (``full_param_bytes``)."""
        report = dict.fromkeys(STATE_KINDS, 0)
        for coll in self.installed_parts.collectives():
            for kind, n in coll.state_bytes().items():
                if kind not in report:
                    raise ValueError(f"state_bytes() kind {kind!r} is not one of {STATE_KINDS}")
                report[kind] += int(n)
        report["total"] = sum(report[k] for k in STATE_KINDS)
        report["sharded_param_bytes"], report["full_param_bytes"] = param_bytes(self.model)
        return report

    def __repr__(self) -> str:
        return (f"Compression({self.kind}, {self.config.name!r}, "
                f"{self.installed_parts.describe()}, {self.topology!r}, "
                f"installed={self.installed})")
