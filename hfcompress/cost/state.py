"""Compressor state per rank, estimated before it is allocated: what ``apply`` checks against
free memory (``integrations/memory.py``) and the planner prices.

State a rank keeps between steps, as each scheme declares it (``Compressor.state_bytes_for``;
``state_bytes()`` of the collectives measures it afterwards):

- ``references``: a reference-coded weight scheme's copy of the weights (qWD's w~, SDP4Bit
  Alg. 2) for the slots this rank holds, in the weights' dtype: ``Y = world /
  ranks_per_node`` slots of each unit's shard with node-sharded references
  (``comm/reference_gather.py``), all ``world`` slots with one rank per node;
- ``errors``: an error-feedback scheme's stored error (LoCo 3.2) of everything this rank
  sends on a gradient hop: X parts of ``Y * s`` values on the 2-hop intra-node hop and Y
  parts of ``s`` on its inter-node hop (the node's partial sums), else ``world`` parts of
  ``s``;
- ``buffers``: nothing persistent (payload and gather buffers live for one call).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..comm.all_reduce import hierarchical, summing_peers
from ..comm.reference_gather import ShardedReferences
from ..compressors import Compressor
from ..compressors.registry import build_compressor
from ..config import CompressionConfig, get_config
from .hops import gradient_hops

KINDS = ("references", "errors", "buffers")


def _add(into: dict[str, int], state: dict[str, int], times: int = 1) -> None:
    for kind, n in state.items():
        into[kind] = into.get(kind, 0) + times * int(n)


def _gradient_parts(config: CompressionConfig, world: int, ranks_per_node: int
                    ) -> list[tuple[Compressor | None, int, int]]:
    """(compressor of a gradient hop, parts, values per part / shard value)."""
    x, y = ranks_per_node, world // ranks_per_node
    hops = gradient_hops(config, x)
    intra, inter = hops["grad_intra"], hops["grad_inter"]
    if config.two_hop and x > 1:
        return [(intra, x, y), (inter, y if y > 1 else 0, 1)]
    return [(inter, world, 1)]


def estimate_state_bytes(config: CompressionConfig | str, shard_numels: Sequence[int],
                         world: int, ranks_per_node: int, dtype: torch.dtype,
                         shard_references: bool = True,
                         grad_numels: Sequence[int] | None = None) -> dict[str, int]:
    """Compressor state per rank, by kind, for FSDP units whose compressed shards hold
    ``shard_numels[i]`` values per rank (the all-gather input), gathered in ``dtype``, of
    which ``grad_numels[i]`` get gradients (default: all; frozen ones send none, so they
    keep no error-feedback state)."""
    config = get_config(config)
    out = dict.fromkeys(KINDS, 0)
    weights = build_compressor(config.weights)
    hops = _gradient_parts(config, world, ranks_per_node) if world > 1 else []
    rows = ShardedReferences.rows(world, ranks_per_node, shard_references)
    for s, g in zip(shard_numels, shard_numels if grad_numels is None else grad_numels):
        if weights is not None:
            _add(out, weights.state_bytes_for(rows * s, dtype))
        for comp, parts, width in hops:
            if comp is not None and parts:
                _add(out, comp.state_bytes_for(width * g, dtype), parts)
    return out


def all_reduce_state_bytes(config: CompressionConfig | str, numel: int, ranks_per_node: int,
                           nodes: int, dtype: torch.dtype) -> dict[str, int]:
    """Compressor state per rank of the DDP / HSDP replica all-reduce of ``numel``
    compressed gradient values over ``ranks_per_node`` x ``nodes`` ranks
    (``comm/all_reduce.py``): a stateful scheme (LoCo) keeps a stream per chunk it sends
    and one for the chunk it gathers, of the whole gradient over the ranks (flat), or of
    this rank's 1/X of it over the nodes (hierarchical)."""
    config = get_config(config).ddp_config()
    peers = summing_peers(ranks_per_node, nodes)
    comp = build_compressor(config.all_reduce, 0, num_peers=peers)
    out = dict.fromkeys(KINDS, 0)
    if comp is None or ranks_per_node * nodes < 2:
        return out
    comp = config.loco.wrap(comp) if config.loco is not None else comp
    sent = -(-numel // ranks_per_node) if hierarchical(ranks_per_node, nodes) else numel
    _add(out, comp.state_bytes_for(sent, dtype))
    _add(out, comp.state_bytes_for(-(-sent // peers), dtype))
    return out


def total(state: dict[str, int]) -> int:
    return sum(state.values())
