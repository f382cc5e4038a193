"""What the Trainer logs about communication, per optimizer step, from the handle's
``WireMeter``.

- Wire bytes: what this rank sends, split into intra- and inter-node, one closed meter step
  per optimizer step.
- Uncompressed bytes: the meter's baseline, what the exact collective would send for the
  buffer FSDP / DDP hands over (with ``comm_compressor="none"`` the two agree to the byte,
  ratio 1.0).
- Time: the meter's seconds inside the collectives (compression included), host wall-clock
  on CPU, CUDA events on the current stream on GPU.

At a logging step the window since the last comm log is summed over the ranks: bytes are
the job's total per optimizer step (all ranks), time is the mean per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.wire_meter import WireMeter

KEYS = ("intra_bytes", "inter_bytes", "uncompressed_intra_bytes", "uncompressed_inter_bytes")


class CommStats:
    """The logging window and the run totals of one compression handle's meter."""

    def __init__(self, meter: WireMeter | None = None) -> None:
        self.meter = meter
        self._window = [0.0] * (len(KEYS) + 1)      # the KEYS, then the step count
        self.totals = {"bytes": 0.0, "uncompressed_bytes": 0.0, "seconds": 0.0, "steps": 0}

    def close_step(self, meter_step: dict) -> None:
        """End of an optimizer step: add the meter's closed step to the window."""
        step = [meter_step.get(k, 0) for k in KEYS] + [1]
        self._window = [w + s for w, s in zip(self._window, step)]

    # -- at a logging step (collective: every rank calls it) ------------------------------
    def reduce(self, device: torch.device | str = "cpu") -> dict[str, float]:
        """The window's per-step metrics over all ranks; restarts the window. ``device``: where
        the process group reduces (the GPU under NCCL)."""
        seconds = self.meter.take_seconds() if self.meter is not None else 0.0
        t = torch.tensor([*self._window, seconds], dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(t)
            world = dist.get_world_size()
        else:
            world = 1
        intra, inter, b_intra, b_inter, steps, secs = t.tolist()
        self._window = [0.0] * (len(KEYS) + 1)
        steps = steps / world   # every rank counted the same steps
        self.totals["bytes"] += intra + inter
        self.totals["uncompressed_bytes"] += b_intra + b_inter
        self.totals["seconds"] += secs / world
        self.totals["steps"] += int(round(steps))
        if steps == 0:
            return {}
        logs = {"comm/intra_node_bytes": intra / steps, "comm/inter_node_bytes": inter / steps,
                "comm/uncompressed_bytes": (b_intra + b_inter) / steps,
                "comm/time_s": secs / world / steps}
        if intra + inter > 0:
            logs["comm/compression_ratio"] = (b_intra + b_inter) / (intra + inter)
        return logs

    def total_logs(self) -> dict[str, float]:
        """Run totals (as of the last ``reduce``) for the Trainer's final summary log."""
        t = self.totals
        return {"comm/total_bytes": t["bytes"], "comm/total_uncompressed_bytes":
                t["uncompressed_bytes"], "comm/total_bytes_saved":
                t["uncompressed_bytes"] - t["bytes"], "comm/total_time_s": t["seconds"]}
