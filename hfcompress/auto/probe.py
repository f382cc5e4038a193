"""The start-up probe of ``comm_compressor="auto"``: what the links and this device cost.

- :func:`probe_links`: each collective primitive the candidates use (all-gather,
  reduce-scatter, all-to-all, all-reduce), on each process group it runs on (the world, the
  intra-node and the inter-node groups of :class:`~hfcompress.comm.Topology`), timed on the
  real groups at a small and a large size with every rank taking part at once (so the ranks
  of a node share its link as in training), and fitted as ``latency + bytes / bandwidth``;
- :func:`probe_codecs`: this device's compress / decompress time per value of each scheme,
  on the sizes the collectives will hand it (so compiled kernels are reused afterwards).

Every rank measures; :func:`agree` takes the slowest rank's numbers, so every rank holds the
same facts. Host syncs are fine here: the probe runs before training and at re-probes only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from ..comm import Topology
from ..comm.hop import all_gather_single, reduce_scatter_single
from ..compressors import Compressor

SMALL_BYTES = 4 << 10
LARGE_BYTES = 2 << 20
PRIMITIVES = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")


@dataclass
class Fit:
    """``seconds(nbytes) = latency_s + nbytes / bytes_per_s`` of one primitive on one group."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    @classmethod
    def from_points(cls, small: tuple[int, float], large: tuple[int, float]) -> "Fit":
        (b0, t0), (b1, t1) = small, large
        if t1 <= 1.1 * t0:   # the large size within the small one's jitter: all bandwidth
            return cls(latency_s=t0, bytes_per_s=b1 / max(t1, 1e-9))
        slope = (t1 - t0) / (b1 - b0)
        return cls(latency_s=max(t0 - b0 * slope, 0.0), bytes_per_s=1.0 / slope)


@dataclass
class Links:
    """Fitted primitives, keyed ``"all_gather@inter"`` etc. (group: world, intra, inter)."""

    fits: dict[str, Fit] = field(default_factory=dict)
    probe_s: float = 0.0

    def seconds(self, primitive: str, group: str, nbytes: float, calls: int = 1) -> float:
        """Time of ``calls`` calls moving ``nbytes`` in total; 0 when nothing is sent."""
        if nbytes <= 0 or calls <= 0:
            return 0.0
        fit = self.fits[f"{primitive}@{group}"]
        return calls * fit.latency_s + nbytes / fit.bytes_per_s

    def to_dict(self) -> dict:
        return {k: {"latency_us": f.latency_s * 1e6, "MB_per_s": f.bytes_per_s / 1e6}
                for k, f in self.fits.items()}


def groups_of(topology: Topology) -> dict[str, dist.ProcessGroup]:
    """The groups that carry traffic on this layout (a group of one rank carries none)."""
    out = {"world": topology.group}
    if topology.ranks_per_node > 1 and topology.num_nodes > 1:
        out["intra"] = topology.intra_group
        out["inter"] = topology.inter_group
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], reps: int, device: torch.device,
           world: dist.ProcessGroup) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, every rank starting together."""
    times = []
    for _ in range(reps):
        dist.barrier(group=world)
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _primitive(name: str, nbytes: int, group: dist.ProcessGroup,
               device: torch.device) -> Callable[[], object]:
    """One call of primitive ``name`` whose input (this rank's send buffer) is ``nbytes``."""
    n = dist.get_world_size(group)
    if name == "all_gather":
        x = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        out = torch.empty(n * nbytes, dtype=torch.uint8, device=device)
        return lambda: all_gather_single(out, x, group=group)
    if name == "all_to_all":
        per = max(nbytes // n, 1)
        x = torch.zeros(per * n, dtype=torch.uint8, device=device)
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group)
    values = max(nbytes // 4 // n, 1) * n
    x = torch.zeros(values, dtype=torch.float32, device=device)
    if name == "reduce_scatter":
        out = torch.empty(values // n, dtype=torch.float32, device=device)
        return lambda: reduce_scatter_single(out, x, group=group)
    return lambda: dist.all_reduce(x, group=group)


def probe_links(topology: Topology, needed: list[tuple[str, str]], device: torch.device,
                reps: int = 3) -> Links:
    """Fit every ``(primitive, group)`` in ``needed`` on the real groups (see module doc)."""
    groups = groups_of(topology)
    world = topology.group
    t_start = time.perf_counter()
    raw = []
    for prim, gname in needed:
        group = groups[gname]
        small = _primitive(prim, SMALL_BYTES, group, device)
        large = _primitive(prim, LARGE_BYTES, group, device)
        small(), large()   # connection set-up, buffers of each size: not timed
        raw += [_timed(small, 2 * reps + 1, device, world), _timed(large, reps, device, world)]
    raw = agree(raw, device, world)
    links = Links(probe_s=time.perf_counter() - t_start)
    for i, (prim, gname) in enumerate(needed):
        links.fits[f"{prim}@{gname}"] = Fit.from_points((SMALL_BYTES, raw[2 * i]),
                                                        (LARGE_BYTES, raw[2 * i + 1]))
    return links


@dataclass
class CodecRate:
    """Seconds per value to compress and to decompress with one scheme on this device."""

    compress_s: float
    decompress_s: float

    def seconds(self, compressed: float, decompressed: float) -> float:
        return compressed * self.compress_s + decompressed * self.decompress_s


def codec_rate(compressor: Compressor, numel: int, dtype: torch.dtype, device: torch.device,
               reps: int = 3) -> CodecRate:
    """Time ``compress`` and ``decompress`` of ``numel`` values of ``dtype`` (the median of
    ``reps`` after one untimed call, which compiles the kernels for this size)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(numel, generator=gen).to(device=device, dtype=dtype)
    packed = compressor.compress(x)
    compressor.decompress(packed)

    def median(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2] / numel

    return CodecRate(median(lambda: compressor.compress(x)),
                     median(lambda: compressor.decompress(packed)))


def agree(values: list[float], device: torch.device,
          group: dist.ProcessGroup | None = None) -> list[float]:
    """Every rank gets the largest value of each position over the ranks (the slowest rank
    bounds a synchronous step)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()
