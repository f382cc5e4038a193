"""The start-up probe of ``comm_compressor="auto"``: what the links and this device cost.

- :func:`probe_links`: each collective primitive the candidates use (all-gather,
  reduce-scatter, all-to-all, all-reduce), on each process group it runs on (this rank's
  data-parallel group ``world``, its intra-node and inter-node groups, of
  :class:`~hfcompress.comm.Topology`), timed on the real groups at 4 KiB, 1 MiB and 4 MiB
  with every rank of the *world* starting each run together (a world barrier first: the k
  DP groups of a node beside TP time at once, so they share its link as in training), and
  fitted as ``latency + bytes / bandwidth`` (latency: the 4 KiB time; bandwidth: the slope
  between 1 and 4 MiB);
- :func:`codec_rate`: this device's compress / decompress time per value of each scheme,
  on the sizes the collectives will hand it (so compiled kernels are reused afterwards);
- :func:`probe_collectives`: each compressed collective as training runs it (qWD all-gather,
  2-hop reduce-scatter) on the real groups, whose time beyond the predicted wire time is the
  cost model's codec cost (kernels, reference updates, copies, per-call overhead).

Every rank measures; :func:`agree` takes the slowest rank's numbers over the world (every
DP group's), so every rank holds the same facts and one plan serves every group. Host syncs
are fine here: the probe runs before training and at re-probes only.
With ``HFCOMPRESS_LINKS_FILE`` set to the JSON of ``hfcompress probe`` (``links_file.py``:
measured once, at the model's message sizes) measured on this layout, :func:`probe_links`
takes its fits from the file and probes only what the file lacks.
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
from .links_file import known_fits

SMALL_BYTES = 4 << 10     # latency
MID_BYTES = 1 << 20       # bandwidth: the slope from MID to LARGE (a shaped link's burst
LARGE_BYTES = 4 << 20     # allowance, e.g. tc tbf's, cancels out of it)
SIZES = (SMALL_BYTES, MID_BYTES, LARGE_BYTES)


@dataclass
class Fit:
    """``seconds(nbytes) = latency_s + nbytes / bytes_per_s`` of one primitive on one group."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    @classmethod
    def from_points(cls, small: tuple[int, float], mid: tuple[int, float],
                    large: tuple[int, float]) -> "Fit":
        """Latency: the small size's time; bandwidth: the slope from ``mid`` to ``large``
        (if jitter hides it, ``large`` alone: the conservative bound)."""
        (_, t0), (b1, t1), (b2, t2) = small, mid, large
        if t2 <= 1.1 * t1:
            return cls(latency_s=t0, bytes_per_s=b2 / max(t2, 1e-9))
        return cls(latency_s=t0, bytes_per_s=(b2 - b1) / (t2 - t1))


@dataclass
class ProbedLinks:
    """Fitted primitives, keyed ``"all_gather@inter"`` etc. (group: world, intra, inter)."""

    fits: dict[str, Fit] = field(default_factory=dict)

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


def _times(fn: Callable[[], object], reps: int, device: torch.device,
           world: dist.ProcessGroup | None = None) -> list[float]:
    """Seconds of ``reps`` runs of ``fn`` (device synced around each); with ``world``,
    every rank starts each run together (a barrier first)."""
    times = []
    for _ in range(reps):
        if world is not None:
            dist.barrier(group=world)
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _timed(fn: Callable[[], object], reps: int, device: torch.device,
           world: dist.ProcessGroup) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, every rank starting together."""
    times = sorted(_times(fn, reps, device, world))
    return times[len(times) // 2]


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


def time_sizes(needed: list[tuple[str, dist.ProcessGroup, tuple[int, ...]]],
               device: torch.device, reps: int, world: dist.ProcessGroup | None) -> list[float]:
    """Median seconds of each ``(primitive, group, sizes)`` at each of its sizes (send
    buffer bytes; the first size, the latency point, timed ``2 reps + 1`` times), every rank
    of ``world`` starting each run together, agreed over ``world``: a flat list in order."""
    raw = []
    for prim, group, sizes in needed:
        calls = [_primitive(prim, n, group, device) for n in sizes]
        for call in calls:   # connection set-up, buffers of each size: not timed
            call()
        raw += [_timed(call, 2 * reps + 1 if i == 0 else reps, device, world)
                for i, call in enumerate(calls)]
    return agree(raw, device, world) if raw else []


def probe_links(topology: Topology, needed: list[tuple[str, str]], device: torch.device,
                reps: int = 3, links_file: bool = True) -> ProbedLinks:
    """Fit every ``(primitive, group)`` in ``needed`` on the real groups of this rank's DP
    group, all DP groups at once (see module doc); the fits a links file
    (``HFCOMPRESS_LINKS_FILE``, ``links_file.py``) holds for this layout are taken from it
    instead (world rank 0's reading, so every rank times the same primitives;
    ``links_file=False``: probe them all, for groups a links file does not describe)."""
    known: list = [known_fits(topology) if links_file else {}]
    dist.broadcast_object_list(known, src=0)
    links = ProbedLinks({k: Fit(*v) for k, v in known[0].items()})
    todo = [(p, g) for p, g in needed if f"{p}@{g}" not in links.fits]
    groups = groups_of(topology)
    raw = time_sizes([(p, groups[g], SIZES) for p, g in todo], device, reps, dist.group.WORLD)
    for i, (prim, gname) in enumerate(todo):
        links.fits[f"{prim}@{gname}"] = Fit.from_points(*zip(SIZES, raw[3 * i:3 * i + 3]))
    return links


@dataclass
class CodecSeconds:
    """Seconds per value to compress and to decompress with one scheme on this device."""

    compress_s: float
    decompress_s: float

    def seconds(self, compressed: float, decompressed: float) -> float:
        return compressed * self.compress_s + decompressed * self.decompress_s


def codec_rate(compressor: Compressor, numel: int, dtype: torch.dtype, device: torch.device,
               reps: int = 3) -> CodecSeconds:
    """Time ``compress`` and ``decompress`` of ``numel`` values of ``dtype`` (the fastest of
    ``reps`` after one untimed call, which compiles the kernels for this size)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(numel, generator=gen).to(device=device, dtype=dtype)
    packed = compressor.compress(x)
    compressor.decompress(packed)

    def fastest(fn: Callable[[], object]) -> float:   # the kernel's own cost, least noise
        return min(_times(fn, reps, device)) / numel

    return CodecSeconds(fastest(lambda: compressor.compress(x)),
                     fastest(lambda: compressor.decompress(packed)))


def agree(values: list[float], device: torch.device,
          group: dist.ProcessGroup | None = None) -> list[float]:
    """Every rank gets the largest value of each position over the ranks of ``group``
    (default: the world; the slowest rank bounds a synchronous step)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def probe_collectives(topology: Topology, weights: dict[str, Compressor],
                      grads: dict[str, tuple[Compressor | None, Compressor | None]],
                      numel: int, weight_dtype: torch.dtype, grad_dtype: torch.dtype,
                      device: torch.device, reps: int = 3) -> dict[str, float]:
    """Seconds of one call of each compressed collective as training runs it, on the real
    groups, for ``numel`` values per rank: the qWD all-gather (``weights``: option ->
    compressor; its first, exact call untimed, then steady calls on changed weights) and the
    2-hop reduce-scatter (``grads``: ``"<intra>+<inter>"`` -> the hops' compressors).
    Besides the wire this holds what the kernels alone miss: reference updates, copies,
    packing, per-call overhead. Every DP group at once (world barriers), agreed over the
    world; keys ``weights:<option>`` and ``grads:<intra>+<inter>``."""
    from ..comm import QuantizedAllGather, TwoHopReduceScatter

    world, w = dist.group.WORLD, topology.world_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    keys, times = [], []
    for option, compressor in weights.items():
        gather = QuantizedAllGather(compressor, topology)
        x = torch.randn(numel, generator=gen).to(device=device, dtype=weight_dtype)
        out = torch.empty(w * numel, dtype=weight_dtype, device=device)
        gather(out, x)                        # the exact first send, kernels compiled

        def step(gather=gather, x=x, out=out) -> None:
            x.mul_(1.001)                     # an optimizer step changed the weights
            gather(out, x)

        step()
        keys.append(f"weights:{option}")
        times.append(_timed(step, reps, device, world))
    for pair, (intra, inter) in grads.items():
        scatter = TwoHopReduceScatter(topology, intra, inter)
        g = torch.randn(w * numel, generator=gen).to(device=device, dtype=grad_dtype)
        out = torch.empty(numel, dtype=grad_dtype, device=device)
        scatter(out, g)
        keys.append(f"grads:{pair}")
        times.append(_timed(lambda s=scatter, g=g, o=out: s(o, g), reps, device, world))
    return dict(zip(keys, agree(times, device, world)))
