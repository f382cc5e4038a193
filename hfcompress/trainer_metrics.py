"""What the Trainer logs about communication, per optimizer step.

- Wire bytes: the ``WireMeter`` of the compression handle (what this rank sends, split into
  intra- and inter-node), one closed meter step per optimizer step.
- Uncompressed bytes: computed analytically per collective call, from the buffer FSDP / DDP
  hands over (its numel and dtype) and the group, exactly as the meter counts an exact
  collective: ``(peers) * shard bytes`` for an all-gather and a reduce-scatter, and the
  reduce-scatter + all-gather volume of a stock all-reduce. With ``comm_compressor="none"``
  the two agree to the byte (ratio 1.0).
- Time: seconds spent inside the collectives (compression included), host wall-clock on
  CPU, CUDA events on the current stream on GPU.

At a logging step the window since the last comm log is summed over the ranks: bytes are
the job's total per optimizer step (all ranks), time is the mean per rank.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from .comm.topology import Topology
from .comm.wire_meter import peer_is_remote

KEYS = ("intra", "inter", "base_intra", "base_inter", "steps")


class Timer:
    """Seconds inside ``with timer(device):`` blocks (CUDA: resolved when read)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def __call__(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
            return
        t0 = time.perf_counter()
        yield
        self.seconds += time.perf_counter() - t0

    def take(self) -> float:
        """Seconds since the last ``take`` (or ``discard``); restarts the count."""
        for start, end in self._events:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0
        seconds, self.seconds, self._events = self.seconds, 0.0, []
        return seconds


class CommStats:
    """Uncompressed-byte baseline, time, and the logging window of one compression handle."""

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology
        self.timer = Timer()
        self._remote: dict[int, list[bool]] = {}
        self._base = [0, 0]
        self._window = [0.0] * len(KEYS)
        self._seconds = 0.0
        self.totals = {"bytes": 0.0, "uncompressed_bytes": 0.0, "seconds": 0.0, "steps": 0}

    # -- during a step --------------------------------------------------------------------
    def baseline(self, per_peer: int | Sequence[int], group: dist.ProcessGroup) -> None:
        """Count what an exact collective sends to each peer of ``group`` (an int: the same
        to every peer); this rank's own slot is not sent."""
        key = id(group)
        if key not in self._remote:
            self._remote[key] = peer_is_remote(group, self.topology)
        remote, me = self._remote[key], dist.get_rank(group)
        sizes = [per_peer] * len(remote) if isinstance(per_peer, int) else per_peer
        for k, (b, r) in enumerate(zip(sizes, remote)):
            if k != me:
                self._base[int(r)] += int(b)

    def close_step(self, meter_step: dict) -> None:
        """End of an optimizer step: add the meter's closed step and the baseline to the
        window."""
        step = (meter_step["intra_bytes"], meter_step["inter_bytes"], *self._base, 1)
        self._window = [w + s for w, s in zip(self._window, step)]
        self._base = [0, 0]

    def discard_step(self) -> None:
        """Forget the current step's baseline and time (e.g. evaluation traffic)."""
        self._base = [0, 0]
        self.timer.take()

    # -- at a logging step (collective: every rank calls it) ------------------------------
    def reduce(self, device: torch.device | str = "cpu") -> dict[str, float]:
        """The window's per-step metrics over all ranks; restarts the window. ``device``: where
        the process group reduces (the GPU under NCCL)."""
        seconds = self.timer.take()
        t = torch.tensor([*self._window, seconds], dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(t)
            world = dist.get_world_size()
        else:
            world = 1
        intra, inter, b_intra, b_inter, steps, secs = t.tolist()
        self._window = [0.0] * len(KEYS)
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
