"""Compressor state in Trainer checkpoints: one file per rank, ``hfcompress_rank{r}.pt``.

A file holds what the compression handle's ``state_dict()`` returns (LoCo error buffers and
step counters, qWD references, learned levels, RNG streams) plus the settings it was made
with: the preset's ``CompressionConfig``, FSDP2 or DDP, world size and ranks per node. It is
saved with ``torch.save`` and loaded with ``weights_only=True`` (tensors, numbers, strings and
containers; DDP bucket layouts are allow-listed ``Segment`` records).

Resuming with different settings, or from a checkpoint without the files, never loads
anything: ``on_mismatch="error"`` (default) raises ValueError naming what differs;
``"reset"`` warns and starts the compressor state fresh (LoCo errors zero, qWD references
re-initialised by an exact first all-gather of the loaded weights, new RNG streams).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ..integrations.exact_params import Segment

FORMAT = 1
MISMATCH_CHOICES = ("error", "reset")


def state_path(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, f"hfcompress_rank{rank}.pt")


def settings(config_dict: dict[str, Any], kind: str, world_size: int,
             ranks_per_node: int) -> dict[str, Any]:
    """What must match between the saving and the resuming run."""
    return {"config": config_dict, "integration": kind, "world_size": world_size,
            "ranks_per_node": ranks_per_node}


def save(handle: Any, setting: dict[str, Any], checkpoint_dir: str, rank: int,
         stats: Any = None) -> str:
    """Write this rank's compressor state (and the ``CommStats`` run totals) into
    ``checkpoint_dir``."""
    path = state_path(checkpoint_dir, rank)
    os.makedirs(checkpoint_dir, exist_ok=True)
    torch.save({"format": FORMAT, "settings": setting, "state": handle.state_dict(),
                "totals": stats.state_dict() if stats is not None else None}, path)
    return path


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per differing setting (config fields one by one)."""
    def fields(s: dict[str, Any]) -> dict[str, Any]:
        return {**{f"config.{k}": v for k, v in s.get("config", {}).items()},
                **{k: v for k, v in s.items() if k != "config"}}
    a, b = fields(saved), fields(current)
    missing = "<missing>"
    return [f"{k}: checkpoint {a.get(k, missing)!r}, this run {b.get(k, missing)!r}"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


def load(handle: Any, setting: dict[str, Any], checkpoint_dir: str, rank: int,
         on_mismatch: str = "error", map_location: Any = None, stats: Any = None) -> bool:
    """Restore this rank's compressor state (and ``stats``' run totals, when saved) from
    ``checkpoint_dir``; True if restored.

    The decision depends only on the files and the settings, so every rank of a job takes
    the same one."""
    if on_mismatch not in MISMATCH_CHOICES:
        raise ValueError(f"comm_state_mismatch={on_mismatch!r}; allowed: {MISMATCH_CHOICES}")
    path = state_path(checkpoint_dir, rank)
    name = setting["config"].get("name", "custom")
    if not os.path.exists(path):
        problem = (f"checkpoint {checkpoint_dir!r} has no hfcompress compressor state for rank "
                   f"{rank} (saved by a plain Trainer, with comm_compressor=None, or by fewer "
                   f"ranks), but this run uses comm_compressor {name!r}")
    else:
        if map_location is not None and torch.device(map_location).type == "cpu":
            map_location = "cpu"     # torch.load does not know Accelerate's "cpu:0"
        with torch.serialization.safe_globals([Segment]):
            saved = torch.load(path, map_location=map_location, weights_only=True)
        if saved.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown hfcompress state format {saved.get('format')!r} "
                             f"(this version reads format {FORMAT})")
        diff = _differences(saved["settings"], setting)
        if not diff:
            handle.load_state_dict(saved["state"])
            if stats is not None and saved.get("totals"):
                stats.load_state_dict(saved["totals"])
            return True
        problem = (f"checkpoint {checkpoint_dir!r} was saved with different compression "
                   f"settings than this run's comm_compressor {name!r}:\n  " + "\n  ".join(diff))
    if on_mismatch == "error":
        raise ValueError(f"hfcompress: {problem}\nResume with the same comm_compressor, "
                         f"ranks_per_node, integration (FSDP2 / DDP) and world size, or set "
                         f"comm_state_mismatch='reset' to start the compressor state fresh")
    warnings.warn(f"hfcompress: {problem}\ncomm_state_mismatch='reset': starting the "
                  f"compressor state fresh (LoCo errors zero, qWD references re-initialised "
                  f"from the loaded weights, new RNG streams)", UserWarning, stacklevel=2)
    return False
