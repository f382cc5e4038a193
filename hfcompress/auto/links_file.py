"""``auto``'s use of the links file (``cost/links_file.py``): the fits ``hfcompress probe``
measured on this data-parallel layout, so its probe skips those primitives."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch.distributed as dist

from ..cost.links_file import describe_layout, load

logger = logging.getLogger(__name__)

LINKS_FILE_ENV = "HFCOMPRESS_LINKS_FILE"


def known_fits(topology: Any) -> dict[str, tuple[float, float]]:
    """``primitive@group`` -> (latency s, send buffer bytes/s) from ``HFCOMPRESS_LINKS_FILE``
    when it was measured on this data-parallel layout (x ranks per node, y nodes, k groups
    per node), else none (a line on rank 0 says why). The DP group's first rank reads the
    file and sends it to the others, so the ranks agree on what is left to probe."""
    box: list[Any] = [None]
    if topology.rank == 0:
        path = os.environ.get(LINKS_FILE_ENV)
        box[0] = _matching_fits(load(path), path, topology) if path else {}
    dist.broadcast_object_list(box, src=topology.ranks[0], group=topology.group)
    return box[0]


def _matching_fits(data: dict[str, Any], path: str, topology: Any
                   ) -> dict[str, tuple[float, float]]:
    lay = data["layout"]
    here = (topology.ranks_per_node, topology.num_nodes, topology.groups_per_node)
    if (lay["dp_per_node"], lay["dp_nodes"], lay["groups_per_node"]) != here:
        if dist.get_rank() == 0:
            logger.warning(f"hfcompress auto: {LINKS_FILE_ENV}={path} was measured on "
                           f"{describe_layout(data)}, not this layout (x={here[0]} ranks per "
                           f"node, y={here[1]} nodes, k={here[2]} groups per node): probing "
                           f"the links instead")
        return {}
    return {k: (f["latency_us"] * 1e-6, f["MB_per_s"] * 1e6) for k, f in data["fits"].items()}
