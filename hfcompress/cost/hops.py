"""Which compressor runs on which gradient hop: the one builder the reduce-scatter
(``integrations/fsdp.py``), the state estimate (``cost/state.py``) and the cost model
(``cost/collectives.py``) call."""

from __future__ import annotations

from typing import Any

from ..compressors import Compressor
from ..compressors.registry import build_compressor
from ..config import GRAD_ROLES, CompressionConfig


def gradient_hops(config: CompressionConfig, ranks_per_node: int, seed: int = 0,
                  key: tuple[Any, ...] = (), **defaults: Any) -> dict[str, Compressor | None]:
    """``"grad_intra"`` / ``"grad_inter"`` -> the config's scheme for that hop, built for the
    stream ``(*key, hop)`` (None: exact), with LoCo error feedback on the hops
    :meth:`CompressionConfig.loco_hops` names. A 1-hop reduce-scatter runs ``grad_inter``
    only; a 2-hop one runs both."""
    return config.with_loco({k: build_compressor(getattr(config, k), seed, *key, k, **defaults)
                             for k in GRAD_ROLES}, ranks_per_node)
