"""Seeded, checkpointable random numbers for the stochastic schemes.

``uniform_like`` (the rounding noise of every stochastic scheme, e.g. SDP4Bit 2.2, QSDP 3.2,
Global-QSGD Alg. 1) is the counter-based hash of ``kernels/noise.py``: call ``n`` is keyed by
the ``n``-th output of a splitmix64 stream seeded from ``seed``, so the state is just
``(seed, n)`` and the numbers are the same on every device and backend. ``next_keys`` draws
the same call's keys only: the quantize kernels take them in place of the noise and the
Triton ones hash each value's index themselves (no noise tensor in memory), same numbers;
``next_keys(device, rows)`` draws the keys of ``rows`` successive calls at once, as row keys
(``kernels/noise.py``), so one kernel over ``rows`` rows rounds each row as its own call would.
The keys are views of a per-device table of the next ``KEY_BLOCK`` calls' keys, refilled by one
host-to-device copy when used up: no copy per call. ``generator(device)``
is a ``torch.Generator`` per device, seeded from a mix of ``seed`` (not the stream of
``torch.manual_seed(seed)``), for learned levels' sample batches (its numbers differ
between a CPU and a CUDA generator; every rounding noise and random shift is the hash). Both
states go into the compressor's ``state_dict`` so a resumed run draws the same noise.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels import dispatch
from ..kernels import noise as noise_twin

GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
#: calls whose keys one refill of a device's key table brings (4 KiB of int64 pairs)
KEY_BLOCK = 256


class SeededRNG:
    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.calls = 0  # uniform_like calls so far: the hash's key counter
        self._gens: dict[str, torch.Generator] = {}
        # per device: the key table (first call, keys) and, on CUDA, its streams (KeyTable)
        self._tables: dict[torch.device | str, KeyTable] = {}

    def generator(self, device: torch.device | str) -> torch.Generator:
        key = str(torch.device(device))
        if key not in self._gens:
            gen = torch.Generator(device=key)
            gen.manual_seed(_mix(self.seed))
            self._gens[key] = gen
        return self._gens[key]

    def next_keys(self, device: torch.device | str, rows: int | None = None) -> torch.Tensor:
        """The int64 hash keys ``(k1, k2)`` of the next call, on ``device``: what a quantize
        kernel's ``noise`` argument takes to round with ``uniform_like``'s numbers. With
        ``rows``: the ``(rows, 2)`` keys of the next ``rows`` calls (row keys, one per row).
        A view of the device's key table (:meth:`_table`): no copy per call."""
        n = 1 if rows is None else rows
        table = self._table(device, n)
        i = self.calls - table.first
        self.calls += n
        keys = table.keys_for_stream()
        return keys[i] if rows is None else keys[i:i + n]

    def _table(self, device: torch.device | str, n: int) -> KeyTable:
        """The key table of ``device`` covering the next ``n`` calls; refilled with the next
        ``max(n, KEY_BLOCK)`` calls' keys by one host-to-device copy from pinned memory
        (non_blocking: the host does not wait for the kernels already queued)."""
        table = self._tables.get(device)      # a tensor's device: no parsing per call
        if table is not None and table.first <= self.calls \
                and self.calls + n <= table.first + table.keys.shape[0]:
            return table
        count = max(n, KEY_BLOCK)
        keys = torch.tensor(calls_keys(self.seed, self.calls, count), dtype=torch.int64)
        table = self._tables[device] = KeyTable(self.calls, keys, torch.device(device))
        return table

    def uniform_like(self, x: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """float32 U[0, 1) noise of x's shape on x's device (x is not read); fresh per call.
        ``rows``: x's values split into ``rows`` equal rows drawn as ``rows`` successive
        calls (row keys)."""
        keys = self.next_keys(x.device, rows)
        return dispatch.pick(x, "auto", noise_twin, "triton_noise").uniform_like(x, keys)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "calls": self.calls,
                "states": {k: g.get_state() for k, g in self._gens.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.calls = int(state.get("calls", 0))  # states saved before the counter: call 0
        self._gens, self._tables = {}, {}
        for key, st in state["states"].items():
            self.generator(key).set_state(st)


def _splitmix64(z: int) -> int:
    """One splitmix64 output: advance the state ``z`` by the golden gamma and finalize."""
    z = (int(z) + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _mix(seed: int) -> int:
    """A splitmix64-style scramble of the user seed (non-negative, < 2**63)."""
    return _splitmix64(seed) >> 1


class KeyTable:
    """The keys of calls ``first ..`` on one device. On CUDA the table is copied in on the
    stream current at the refill and read by kernels of whatever stream is current at each
    call (FSDP2's all-gather, reduce-scatter or side stream): the first read from another
    stream makes that stream wait for the copy (an event, no host sync) and records the
    stream on the table (``record_stream``), so its memory is not reused before that
    stream's kernels are done."""

    def __init__(self, first: int, keys: torch.Tensor, device: torch.device) -> None:
        self.first = first
        self.keys = keys
        self.copied: torch.cuda.Event | None = None
        self.streams: set = set()
        if device.type == "cuda":
            self.keys = keys.pin_memory().to(device, non_blocking=True)
            stream = torch.cuda.current_stream(device)
            self.copied = torch.cuda.Event()
            self.copied.record(stream)
            self.streams.add(stream)

    def keys_for_stream(self) -> torch.Tensor:
        """The table, ready to be read by the current stream's next kernels."""
        if self.copied is not None:
            stream = torch.cuda.current_stream(self.keys.device)
            if stream not in self.streams:
                stream.wait_event(self.copied)
                self.keys.record_stream(stream)
                self.streams.add(stream)
        return self.keys


def call_keys(seed: int, call: int) -> tuple[int, int]:
    """The 32-bit hash keys ``(k1, k2)`` of ``uniform_like`` call number ``call``: output
    ``call`` of the splitmix64 stream whose state starts at ``_mix(seed)``."""
    return calls_keys(seed, call, 1)[0]


def calls_keys(seed: int, first: int, count: int) -> list[tuple[int, int]]:
    """:func:`call_keys` of calls ``first .. first + count - 1`` (the seed mixed once: a key
    table's refill)."""
    state = _mix(seed)
    keys = []
    for call in range(first, first + count):
        z = _splitmix64(state + call * GOLDEN)
        keys.append((z & 0xFFFFFFFF, z >> 32))
    return keys
