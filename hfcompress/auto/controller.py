"""The running side of ``comm_compressor="auto"``: the choice a handle carries, its re-probes,
its switches at step boundaries and what it reports.

``Compression.step()`` calls :meth:`AutoController.on_step` after every optimizer step. With
``reprobe_every = N``, every N steps it measures the step time since the last
re-probe (one device sync per N steps, never inside a step; the slowest rank's, agreed over
the world), takes ``compute = step - the current plan's predicted exposed communication``
(under DDP, whose buckets hide behind backward, the compute that solves it:
``cost_model.compute_from_step``),
probes again and predicts every plan's step time (as at start: every rank of the world, over
a sub-mesh every DP group at once, world rank 0's choice); if another plan wins, the
collectives of every group are switched before the next forward. A switch starts fresh
compressor state, as at start: qWD's first all-gather after it sends the weights exactly
(SDP4Bit Alg. 4 line 2), so references are re-initialised exactly.

On resume, :meth:`AutoController.restore` switches to the plan the checkpoint was saved
under, so that its state loads, unless the pins given now (``HFCOMPRESS_AUTO``, changed
since) exclude it: the explicit pin wins, the pinned plan runs with fresh compressor state,
and one line on rank 0 says so.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..config import AutoSettings, CompressionConfig
from .candidates import PIN_ENV, Plan
from .choose import Choice
from .cost_model import compute_from_step
from .probe import agree

logger = logging.getLogger(__name__)


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


class AutoController:
    """The current :class:`Choice` of a handle; ``settings``: the ``auto`` request.
    ``reprobe(compute_s)`` probes and chooses again (every rank); ``rebuild(config)`` builds
    the collectives of a config (FSDP2; None: switching unsupported)."""

    def __init__(self, choice: Choice, settings: AutoSettings,
                 reprobe: Callable[[float | None], Choice] | None = None,
                 rebuild: Callable[[CompressionConfig], Any] | None = None) -> None:
        self.choice, self.settings = choice, settings
        self._reprobe, self._rebuild = reprobe, rebuild
        self.every = settings.reprobe_every
        self.steps = 0
        self._mark: tuple[int, float] | None = None
        self._device: torch.device | None = None
        for line in choice.lines():
            if _rank0():
                logger.warning(line)

    @property
    def config(self) -> CompressionConfig:
        """The configuration that runs now."""
        return self.choice.plan.config()

    def summary(self) -> dict[str, Any]:
        """For ``summary.json``: the choice, its predicted table, the probe, the history."""
        return {"requested": "auto", "reprobe_every": self.every, **self.choice.to_dict()}

    # -- the step boundary ----------------------------------------------------------------
    def on_step(self, handle: Any) -> None:
        self.steps += 1
        if not self.every or self._reprobe is None:
            return
        if self._mark is None:              # after the first step (compilation, exact sends)
            self._mark = (self.steps, self._now(handle))
            return
        if (self.steps - self._mark[0]) % self.every:
            return
        step_s = (self._now(handle) - self._mark[1]) / (self.steps - self._mark[0])
        step_s = agree([step_s], self._device)[0]    # the slowest rank's: the same everywhere
        old = self.choice
        row = old.predicted()
        compute = step_s if row is None else \
            compute_from_step(step_s, row, old.overlap, old.cover_share)
        new = self._reprobe(compute)
        new.history = old.history + [{"step": self.steps, "measured_step_s": step_s,
                                      "compute_s": compute, "was": old.plan.label,
                                      "reprobed_was_s": (new.predicted(old.plan) or {}).get(
                                          "step_s"),    # the new probe's view of that plan
                                      "chose": new.plan.label}]
        if new.plan != old.plan:
            self.switch(handle, new)
        else:
            self.choice = new
        self._mark = (self.steps, self._now(handle))

    def switch(self, handle: Any, choice: Choice) -> None:
        """Install ``choice``'s collectives on ``handle`` (at a step boundary)."""
        if self._rebuild is None:
            raise ValueError(f"hfcompress auto: switching collectives is supported under "
                             f"FSDP2 and DDP only (this is {handle.kind})")
        if _rank0():
            logger.warning(f"hfcompress auto: step {self.steps}: switching from "
                           f"{self.choice.plan.label!r} to {choice.plan.label!r}")
            for line in choice.lines():
                logger.warning(line)
        self.choice = choice
        handle.remove()
        handle.adopt(self.config, self._rebuild(self.config))

    def restore(self, handle: Any, plan: dict[str, str]) -> bool:
        """A checkpoint's plan: switch to it if it differs, so its state can load (True).
        A plan that the pins given now exclude (``HFCOMPRESS_AUTO`` changed since it was
        saved) is not restored: the explicit pin wins, the pinned plan keeps running with
        fresh compressor state, one line on rank 0 says so (False: do not load the saved
        state, it belongs to the other plan's collectives)."""
        saved = Plan(**plan)
        if saved == self.choice.plan:
            return True
        pins = self.choice.pins
        excluded = {k: v for k, v in pins.items() if getattr(saved, k, v) != v}
        if excluded:
            if _rank0():
                was = ", ".join(f"{k}={getattr(saved, k)}" for k in excluded)
                now = ",".join(f"{k}={v}" for k, v in pins.items())
                logger.warning(f"hfcompress auto: the checkpoint was saved under plan "
                               f"{saved.label!r} ({was}), which the pins given now exclude "
                               f"({PIN_ENV} / AutoSettings.pins: {now}): the pins win, "
                               f"{self.choice.plan.label!r} runs with fresh compressor "
                               f"state (the saved state is the other plan's; unset the pin "
                               f"to resume with the saved plan)")
            return False
        self.switch(handle, dataclasses.replace(self.choice, plan=saved))
        return True

    def plan_dict(self) -> dict[str, str]:
        return asdict(self.choice.plan)

    def _now(self, handle: Any) -> float:
        if self._device is None:
            p = next(handle.model.parameters(), None)
            self._device = p.device if p is not None else torch.device("cpu")
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)     # once per re-probe, not per step
        return time.perf_counter()
