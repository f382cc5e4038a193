"""What the Trainer logs about communication, per optimizer step, from the handle's
``WireMeter``.

- Wire bytes: what this rank sends, split into intra- and inter-node, one closed meter step
  per optimizer step.
- Uncompressed bytes: the meter's baseline, what the exact collective would send for the
  buffer FSDP / DDP hands over (with ``comm_compressor="none"`` the two agree to the byte,
  ratio 1.0), in all and across nodes: ``comm/inter_node_compression_ratio`` is the network's
  ratio alone (under HSDP or a 2-hop layout the overall ratio also counts the bytes that
  stay inside a node, exact or more lightly compressed).
- Time: the meter's seconds inside the collectives (compression included), host wall-clock
  on CPU, CUDA events on the current stream on GPU.

At a logging step the window since the last comm log is summed over the ranks: bytes are
the job's total per optimizer step (all ranks), time is the mean per rank.

Warm-up: the collectives' time in the first ``WARMUP_STEPS`` optimizer steps of a run (or of
a resumed run) is also totalled apart. It holds one-time costs: kernel compilation
(``torch.compile`` / Triton, seconds per kernel on a cold cache), qWD's exact first
all-gather, the first step's allocations. The steady-state time per step excludes it.

Run totals (bytes intra- and inter-node, uncompressed bytes, time, steps) go into the
checkpoint with the compressor state and are restored on resume, so a resumed run's totals
cover all its steps, like its losses.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.wire_meter import WireMeter

KEYS = ("intra_bytes", "inter_bytes", "uncompressed_intra_bytes", "uncompressed_inter_bytes")
WARMUP_STEPS = 2   # step 1 compiles the kernels and sends qWD's weights exactly; step 2 runs
#                    (and compiles) the first weight-difference kernels


def _empty_totals() -> dict[str, float]:
    return {"bytes": 0.0, "intra_bytes": 0.0, "inter_bytes": 0.0, "uncompressed_bytes": 0.0,
            "uncompressed_inter_bytes": 0.0, "seconds": 0.0, "steps": 0,
            "warmup_seconds": 0.0, "warmup_steps": 0}


class CommStats:
    """The logging window and the run totals of one compression handle's meter."""

    def __init__(self, meter: WireMeter | None = None) -> None:
        self.meter = meter
        self._window = [0.0] * (len(KEYS) + 1)      # the KEYS, then the step count
        self._closed = 0             # steps closed since this object (the run) started
        self._warmup_seconds = 0.0   # this rank's warm-up time not yet reduced
        self._warmup_steps_before = 0   # of the run a checkpoint continues
        self.totals = _empty_totals()

    def close_step(self, meter_step: dict) -> None:
        """End of an optimizer step: add the meter's closed step to the window. At the end
        of the warm-up, its time is taken apart (on GPU: one event sync, once per run)."""
        step = [meter_step.get(k, 0) for k in KEYS] + [1]
        self._window = [w + s for w, s in zip(self._window, step)]
        self._closed += 1
        if self._closed == WARMUP_STEPS and self.meter is not None:
            self._warmup_seconds += self.meter.take_seconds()

    # -- at a logging step (collective: every rank calls it) ------------------------------
    def reduce(self, device: torch.device | str = "cpu") -> dict[str, float]:
        """The window's per-step metrics over all ranks; restarts the window. ``device``: where
        the process group reduces (the GPU under NCCL)."""
        seconds = self.meter.take_seconds() if self.meter is not None else 0.0
        if self._closed < WARMUP_STEPS:          # still warming up: all of it is warm-up
            self._warmup_seconds, seconds = self._warmup_seconds + seconds, 0.0
        t = torch.tensor([*self._window, seconds, self._warmup_seconds], dtype=torch.float64,
                         device=device)
        if dist.is_initialized():
            dist.all_reduce(t)
            world = dist.get_world_size()
        else:
            world = 1
        intra, inter, b_intra, b_inter, steps, secs, warm = t.tolist()
        self._window = [0.0] * (len(KEYS) + 1)
        self._warmup_seconds = 0.0
        steps = steps / world   # every rank counted the same steps
        secs = (secs + warm) / world
        tot = self.totals
        tot["bytes"] += intra + inter
        tot["intra_bytes"] += intra
        tot["inter_bytes"] += inter
        tot["uncompressed_bytes"] += b_intra + b_inter
        tot["uncompressed_inter_bytes"] += b_inter
        tot["seconds"] += secs
        tot["warmup_seconds"] += warm / world
        tot["steps"] += int(round(steps))
        tot["warmup_steps"] = self._warmup_steps_before + min(self._closed, WARMUP_STEPS)
        if steps == 0:
            return {}
        logs = {"comm/intra_node_bytes": intra / steps, "comm/inter_node_bytes": inter / steps,
                "comm/uncompressed_bytes": (b_intra + b_inter) / steps,
                "comm/uncompressed_inter_node_bytes": b_inter / steps,
                "comm/time_s": secs / steps}
        if intra + inter > 0:
            logs["comm/compression_ratio"] = (b_intra + b_inter) / (intra + inter)
        if inter > 0:
            logs["comm/inter_node_compression_ratio"] = b_inter / inter
        return logs

    def total_logs(self) -> dict[str, float]:
        """Run totals (as of the last ``reduce``) for the Trainer's final summary log: bytes
        (all ranks), time per rank, the warm-up apart and the steady-state time per step
        (when steps after the warm-up were measured)."""
        t = self.totals
        logs = {"comm/total_bytes": t["bytes"], "comm/total_inter_node_bytes": t["inter_bytes"],
                "comm/total_intra_node_bytes": t["intra_bytes"],
                "comm/total_uncompressed_bytes": t["uncompressed_bytes"],
                "comm/total_uncompressed_inter_node_bytes": t["uncompressed_inter_bytes"],
                "comm/total_bytes_saved": t["uncompressed_bytes"] - t["bytes"],
                "comm/total_time_s": t["seconds"], "comm/total_steps": t["steps"],
                "comm/total_warmup_steps": t["warmup_steps"],
                "comm/total_warmup_time_s": t["warmup_seconds"]}
        steady = t["steps"] - t["warmup_steps"]
        if steady > 0:
            logs["comm/total_steady_time_s_per_step"] = \
                (t["seconds"] - t["warmup_seconds"]) / steady
        return logs

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, float]:
        """The run totals so far (call after a ``reduce``: the window is not included)."""
        return dict(self.totals)

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue the totals of the run a checkpoint was saved from."""
        self.totals = {**_empty_totals(), **state}
        self._warmup_steps_before = int(self.totals["warmup_steps"])
