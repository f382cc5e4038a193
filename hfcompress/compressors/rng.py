"""Seeded, checkpointable random numbers for the stochastic schemes.

One ``torch.Generator`` per device, seeded from a mix of ``seed`` (so the rounding noise is
not the same stream as ``torch.manual_seed(seed)`` data); its state goes into the
compressor's ``state_dict`` so a resumed run draws the same noise.
"""

from __future__ import annotations

from typing import Any

import torch


class SeededRNG:
    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._gens: dict[str, torch.Generator] = {}

    def generator(self, device: torch.device | str) -> torch.Generator:
        key = str(torch.device(device))
        if key not in self._gens:
            gen = torch.Generator(device=key)
            gen.manual_seed(_mix(self.seed))
            self._gens[key] = gen
        return self._gens[key]

    def uniform_like(self, x: torch.Tensor) -> torch.Tensor:
        """float32 U[0, 1) noise of x's shape on x's device."""
        return torch.rand(x.shape, generator=self.generator(x.device), device=x.device,
                          dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "states": {k: g.get_state() for k, g in self._gens.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self._gens = {}
        for key, st in state["states"].items():
            self.generator(key).set_state(st)


def _mix(seed: int) -> int:
    """A splitmix64-style scramble of the user seed (non-negative, < 2**63)."""
    z = (int(seed) + 0x9E3779B97F4A7C15) % (1 << 64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return (z ^ (z >> 31)) >> 1
