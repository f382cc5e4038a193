"""hpZ switched on an FSDP2 model that is already sharded, for ``comm_compressor="auto"``
(ZeRO++ 3.3: the backward all-gather stays inside the node).

A preset with hpZ shards the layers with ``reshard_after_forward`` = the node's ranks
(``cost/units.hpz_reshard``) before ``apply``; ``auto`` chooses after the model is sharded
(by the user, Accelerate or transformers), so it can only change what FSDP2's public
``FSDPModule.set_reshard_after_forward`` changes: True or False. That is hpZ at one rank per
node (the node's secondary partition is the whole layer: keep the weights the forward gathered,
no backward all-gather at all). With several ranks per node the node partition is an int,
which FSDP2 sets only at ``fully_shard`` (its per-parameter post-forward metadata is built
there): ``auto`` does not offer hpZ there (pick ``zeropp`` or shard with
``reshard_after_forward=ranks_per_node``).

What hpZ costs is memory: every layer's weights, unsharded, from its forward to its backward
(``held_bytes``); ``integrations/memory.hpz_fits`` checks it before ``auto`` may choose it.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..comm import Topology
from ..cost.units import Unit
from . import _fsdp2


class LayerResharding:
    """The layers of a sharded model that reshard after forward (FSDP units but the root,
    as the user sharded them) and hpZ on / off for them (:meth:`set`)."""

    def __init__(self, model: nn.Module, modules: list[tuple[str, FSDPModule]],
                 topology: Topology) -> None:
        size = {name: {_fsdp2.post_forward_shard_size(pg) for pg in _fsdp2.param_groups(m)}
                for name, m in modules if m is not model}
        # the layers that reshard fully after forward (others, e.g. Accelerate's final norm
        # + lm_head kept gathered, have no backward all-gather to save)
        self.layers = [(name, m) for name, m in modules if size.get(name) == {True}]
        partitioned = sorted({s for v in size.values() for s in v if type(s) is int})
        x, w = topology.ranks_per_node, topology.world_size
        if x > 1:
            self.unavailable = (f"{x} ranks per node: hpZ needs reshard_after_forward={x} "
                                f"at fully_shard, which FSDP2 cannot switch later")
        elif partitioned:
            self.unavailable = (f"layers sharded with reshard_after_forward={partitioned[0]} "
                                f"(a node partition already)")
        elif w == 1 or not self.layers:
            self.unavailable = "no backward all-gather to save"
        else:
            self.unavailable = None
        self.world = w
        self.on = False

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def as_sharded(self, units: list[Unit]) -> list[Unit]:
        """``units`` (``fsdp_units``, read from the model now) with the backward all-gather
        the layers have as the user sharded them, whether hpZ is on now or not."""
        if not self.on:
            return units
        layers = {name for name, _ in self.layers}
        return [dataclasses.replace(u, backward_gather=True) if u.name in layers else u
                for u in units]

    def held_bytes(self, units: list[Unit], weight_bytes: int) -> int:
        """Bytes per rank hpZ holds at the end of the forward: every layer's weights,
        unsharded (``world`` shards of each unit that is gathered again in backward), from
        the :meth:`as_sharded` ``units``."""
        return sum((u.numel + u.exact_numel) * self.world * weight_bytes
                   for u in units if u.backward_gather)

    def set(self, hpz: bool) -> None:
        """Every layer keeps its forward's weights for backward (``hpz``) or reshards after
        forward as it was sharded; ValueError if hpZ cannot be switched on here."""
        if hpz and not self.available:
            raise ValueError(f"hfcompress auto: this plan uses hpZ, which cannot be switched "
                             f"on here ({self.unavailable}); pin another weights option "
                             f"(HFCOMPRESS_AUTO=weights=qwd) or pick the 'zeropp' preset")
        if self.available and hpz != self.on:
            for _, m in self.layers:
                m.set_reshard_after_forward(not hpz, recurse=False)
            self.on = hpz
