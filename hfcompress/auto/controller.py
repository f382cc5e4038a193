"""The running side of ``comm_compressor="auto"``: the choice a handle carries, its re-probes,
its switches at step boundaries and what it reports.

``Compression.step()`` calls :meth:`AutoController.on_step` after every optimizer step. With
``reprobe_every = N`` (FSDP2), every N steps it measures the step time since the last
re-probe (one device sync per N steps, never inside a step), takes ``compute = step - the
current plan's predicted exposed communication``, probes again and predicts every plan's
step time; if another plan wins, the collectives are switched before the next forward. A
switch starts fresh compressor state, as at start: qWD's first all-gather after it sends
the weights exactly (SDP4Bit Alg. 4 line 2), so references are re-initialised exactly.
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
from .candidates import Plan
from .choose import Choice

logger = logging.getLogger(__name__)


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
            if dist.get_rank() == 0:
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
        old = self.choice
        exposed = (old.predicted() or {}).get("exposed_s", 0.0)
        compute = max(step_s - exposed, 0.0)
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
                             f"FSDP2 only (this is {handle.kind})")
        if dist.get_rank() == 0:
            logger.warning(f"hfcompress auto: step {self.steps}: switching from "
                           f"{self.choice.plan.label!r} to {choice.plan.label!r}")
            for line in choice.lines():
                logger.warning(line)
        self.choice = choice
        handle.remove()
        handle.adopt(self.config, self._rebuild(self.config))

    def restore(self, handle: Any, plan: dict[str, str]) -> None:
        """A checkpoint's plan: switch to it if it differs, so its state can load."""
        saved = Plan(**plan)
        if saved != self.choice.plan:
            self.switch(handle, dataclasses.replace(self.choice, plan=saved))

    def plan_dict(self) -> dict[str, str]:
        return asdict(self.choice.plan)

    def _now(self, handle: Any) -> float:
        if self._device is None:
            p = next(handle.model.parameters(), None)
            self._device = p.device if p is not None else torch.device("cpu")
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)     # once per re-probe, not per step
        return time.perf_counter()
