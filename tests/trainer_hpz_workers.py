"""Worker of ``tests/test_trainer_tp_hpz.py``: ``hfcompress.Trainer`` with ``zeropp`` (hpZ) on
dp_shard 2 x tp 2, 4 gloo ranks as 2 emulated nodes of 2 (the model sharded by transformers at
load time, as in ``trainer_tp_workers``), and the plain Trainer on the same mesh for the loss.
The shard groups {0, 2}, {1, 3} have one rank per node, so hpZ keeps the full weights after
forward (``reshard_after_forward=False``)."""

from __future__ import annotations

import os

from hfcompress.integrations import _fsdp2
from hfcompress.integrations.fsdp import fsdp_modules
from trainer_tp_workers import pretrained_folder, train
from trainer_workers import losses


def worker(rank: int, world: int, tmp: str) -> dict:
    folder = pretrained_folder(rank, world, tmp)
    base = train(os.path.join(tmp, "plain"), "tp", None, folder)
    t = train(os.path.join(tmp, "zeropp"), "tp", "zeropp", folder)
    h = t.compression
    reshard = {name: _fsdp2.post_forward_shard_size(_fsdp2.param_groups(m)[0])
               for name, m in fsdp_modules(t.model_wrapped)}
    return {"base": losses(base), "losses": losses(t), "hpz": h.config.hpz,
            "topology": (h.topology.ranks_per_node, h.topology.num_nodes,
                         list(h.topology.ranks)), "reshard": reshard}
