"""The planner's price of one training step on a cluster: the collectives of
``cost/collectives.py`` on a node's links (``cost/link_bytes.py``), the codec at the GPU's
rates (``cost/codec_rates.py``), compute, and what the engine overlaps.

- **Wire**: per unit and collective, each phase takes ``steps x latency + max(link bytes x k
  / inter-node bandwidth, intra bytes / intra-node bandwidth)``: the k DP groups of a node
  share its link, a phase crossing nodes is as slow as the slower of its two parts; the
  phases of a call run one after the other, at the real (per-unit) message sizes.
- **2-hop gradients** (ZeRO++ F.1.2, SDP4Bit 3.2) are pipelined: the intra-node hop of unit
  i + 1 (or chunk c + 1) runs while the inter-node hop of unit i is on the network, on the
  other link: max(sum of hop 1, sum of hop 2) + the faster hop of the unit reduced first
  (the last decoder layer in forward order: backward starts there; the root, which FSDP2
  does not re-gather, reduces last).
- **Codec**: never hidden (it runs on the same GPU as the compute).
- **Overlap** (``engine``): ``"fsdp2"``: prefetching hides the weight all-gathers behind
  compute, up to the compute time: exposed = max(0, all-gathers - compute) + the rest. FSDP2
  also runs unit i's reduce-scatter while backward computes unit i - 1; that is not
  modelled: the same backward compute already hides the backward all-gathers, which share
  the node's link with the reduce-scatters, so crediting both would count one compute twice
  (exposed is an upper bound). ``"megatron"``: Megatron-style data parallelism is taken as
  exposing everything (its gradient all-reduce / reduce-scatter after backward, its
  parameter all-gather before forward), and its distributed optimizer gathers the
  parameters once per step: no unit is gathered again in backward. Step = compute + exposed + codec; the full-overlap
  limit = max(compute, wire) + codec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..comm.traffic import Phase
from ..config import CompressionConfig, get_config
from ..integrations.fsdp import Unit
from ..integrations.memory import estimate_state_bytes, total
from .cluster import ClusterLayout
from .codec_rates import default_rates, rate_key
from .collectives import (ROLES, Collective, Senders, Work, ddp_collectives,
                          unit_collectives)
from .link_bytes import phase_bytes
from .links import ClusterLinks

ENGINES = ("fsdp2", "megatron")


@dataclass
class CollectiveCost:
    """One collective of every unit, per training step."""

    name: str                 # weights_fwd | weights_bwd | grads | exact_* | all_reduce
    algorithm: str            # "ring" | "direct" (all-to-all) | "2-hop" | "ring+..."
    link_bytes_per_node: float   # inter-node bytes one node sends (all k groups of the node)
    meter_bytes_per_node: float  # what hfcompress's WireMeter counts for the same
    intra_bytes_per_gpu: float
    wire_s: float
    codec_s: float
    overlappable: bool        # may hide behind compute under the engine


@dataclass
class StepCost:
    preset: str
    collectives: list[CollectiveCost]
    compute_s: float
    wire_s: float             # all communication, serial
    exposed_s: float          # communication not hidden behind compute (engine's overlap)
    codec_s: float
    step_s: float             # compute_s + exposed_s + codec_s
    full_overlap_s: float     # the limit: max(compute_s, wire_s) + codec_s
    state_bytes_per_gpu: int  # compressor state (qWD references, LoCo errors, ...)


class _Pricer:
    """Seconds and bytes of collectives on one layout's links (cached per unit shape)."""

    def __init__(self, config: CompressionConfig, layout: ClusterLayout, links: ClusterLinks,
                 codec_rates: dict[str, float] | None) -> None:
        self.x, self.y, self.k = layout.dp_per_node, layout.dp_nodes, layout.groups_per_node
        self.links = links
        loco = config.loco_hops(self.x) if config.loco is not None else ()
        given = codec_rates or {}
        self.rates = {}     # role -> (compress, weight decode, gradient decode-sum) values/s
        for role in ROLES:
            scheme = getattr(config, role)
            if scheme is None:
                continue
            key = rate_key(scheme, role in loco)
            rate = given.get(key, given.get(scheme.name))
            self.rates[role] = (rate, rate, rate) if rate else default_rates(key)

    def phase(self, p: Phase) -> tuple[float, float, float, float, str]:
        """(link bytes of the node, meter bytes of the node, intra bytes per GPU, seconds,
        algorithm) of one call."""
        b = phase_bytes(p, self.x, self.y)
        link, meter = b.link * self.k, b.meter * self.k
        latency = (self.links.inter_latency_us if b.crosses else self.links.intra_latency_us)
        seconds = b.steps * latency * 1e-6 + max(link / self.links.inter_bytes_per_s,
                                                 b.intra / self.links.intra_bytes_per_s)
        return link, meter, b.intra, seconds, b.algorithm

    def codec(self, w: Work) -> float:
        """Seconds of one call's codec work (a gradient hop decodes by summing peers)."""
        compress, weight_decode, grad_decode = self.rates[w.role]
        decode = grad_decode if w.role.startswith("grad") else weight_decode
        return w.compressed / compress + w.decompressed / decode

    def collective(self, c: Collective) -> dict:
        """Bytes, seconds per hop, codec seconds and algorithm of ``c`` (its calls)."""
        out = {"link": 0.0, "meter": 0.0, "intra": 0.0, "hop1": 0.0, "hop2": 0.0,
               "algorithms": []}
        for p in c.phases:
            link, meter, intra, seconds, algorithm = self.phase(p)
            out["link"] += c.calls * link
            out["meter"] += c.calls * meter
            out["intra"] += c.calls * intra
            out["hop1" if c.two_hop and p.group == "intra" else "hop2"] += c.calls * seconds
            if algorithm not in out["algorithms"]:
                out["algorithms"].append(algorithm)
        out["codec"] = sum(self.codec(w) for w in c.codec)
        out["algorithm"] = "2-hop" if c.two_hop else "+".join(out["algorithms"])
        return out


def _collectives(senders: Senders, units: list[Unit], nodes: int, weight_bytes: int,
                 grad_bytes: int) -> list[tuple[bool, list[Collective]]]:
    """Per unit (DDP: one list for the whole model), whether backward re-gathers it (a
    layer, not the root) and its collectives."""
    if senders.ddp:
        w = senders.world
        return [(False, ddp_collectives(senders, w * sum(u.numel for u in units),
                                        w * sum(u.exact_numel for u in units), nodes,
                                        grad_bytes))]
    cache: dict[Unit, list[Collective]] = {}
    out = []
    for u in units:
        key = Unit("", u.numel, u.exact_numel, u.backward_gather)
        if key not in cache:
            cache[key] = unit_collectives(senders, u, nodes, weight_bytes, grad_bytes)
        out.append((u.backward_gather, cache[key]))
    return out


def price_step(config: CompressionConfig | str, units: list[Unit], layout: ClusterLayout,
               links: ClusterLinks, *, compute_s: float, engine: str = "fsdp2",
               codec_rates: dict[str, float] | None = None, weight_bytes: int = 2,
               grad_bytes: int = 4) -> StepCost:
    """One training step of ``units`` (values per DP rank, forward order) under ``config``
    (a preset name or a :class:`CompressionConfig`; DDP presets: the all-reduce of every
    gradient) on ``layout`` / ``links`` (module docstring). ``codec_rates``: values/s per
    rate key (``cost/codec_rates.rate_key``) or scheme name, for compress and decompress
    alike; None: the H200's measured rates."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}")
    config = get_config(config)
    if engine == "megatron":     # parameters gathered once per step (module docstring)
        units = [dataclasses.replace(u, backward_gather=False) for u in units]
    x, y = layout.dp_per_node, layout.dp_nodes
    senders = Senders.of(config, layout.dp, x)
    pricer = _Pricer(config, layout, links, codec_rates)
    rows: dict[str, dict] = {}
    first_hops: tuple[float, float] | None = None     # of the unit backward reduces first
    priced: dict[int, list[tuple[Collective, dict]]] = {}
    for layer, colls in _collectives(senders, units, y, weight_bytes, grad_bytes):
        if id(colls) not in priced:
            priced[id(colls)] = [(c, pricer.collective(c)) for c in colls]
        for c, p in priced[id(colls)]:
            row = rows.setdefault(c.name, {"algorithm": p["algorithm"], "link": 0.0,
                                           "meter": 0.0, "intra": 0.0, "hop1": 0.0,
                                           "hop2": 0.0, "codec": 0.0, "part": c.part,
                                           "two_hop": c.two_hop})
            for key in ("link", "meter", "intra", "hop1", "hop2", "codec"):
                row[key] += p[key]
            if c.two_hop and (layer or first_hops is None):
                first_hops = (p["hop1"], p["hop2"])    # the last layer's: reduced first
    out = []
    for name, r in rows.items():
        if r["two_hop"]:   # pipelined: the slower hop, plus the first unit's faster one
            wire = max(r["hop1"], r["hop2"]) + min(first_hops)
        else:
            wire = r["hop1"] + r["hop2"]
        out.append(CollectiveCost(name, r["algorithm"], r["link"], r["meter"], r["intra"], wire,
                                  r["codec"], engine == "fsdp2" and r["part"] == "weights"))
    return _step(config, out, compute_s, units, layout, weight_bytes)


def _step(config: CompressionConfig, colls: list[CollectiveCost], compute_s: float,
          units: list[Unit], layout: ClusterLayout, weight_bytes: int) -> StepCost:
    wire = sum(c.wire_s for c in colls)
    hidden = sum(c.wire_s for c in colls if c.overlappable)
    exposed = max(0.0, hidden - compute_s) + wire - hidden
    codec = sum(c.codec_s for c in colls)
    dtype = torch.bfloat16 if weight_bytes == 2 else torch.float32
    state = total(estimate_state_bytes(config, [u.numel for u in units], layout.dp,
                                       layout.dp_per_node, dtype))
    return StepCost(config.name, colls, compute_s, wire, exposed, codec,
                    compute_s + exposed + codec, max(compute_s, wire) + codec, state)


def compute_from_baseline(step_s: float, units: list[Unit], layout: ClusterLayout,
                          links: ClusterLinks, *, engine: str = "fsdp2", weight_bytes: int = 2,
                          grad_bytes: int = 4) -> float:
    """Compute seconds of a step whose exact baseline (``none``) measured ``step_s``: the
    step minus ``none``'s exposed communication, >= 0. Under ``"fsdp2"`` the all-gathers
    hide behind that compute, so it is ``step_s`` minus the rest; when the result is below
    the all-gathers' time the modelled links are slower than the measurement allows
    (``price_step`` will then predict more than ``step_s``: fit the bandwidth instead)."""
    none = price_step("none", units, layout, links, compute_s=0.0, engine=engine,
                      weight_bytes=weight_bytes, grad_bytes=grad_bytes)
    rest = sum(c.wire_s for c in none.collectives if not c.overlappable)
    return max(0.0, step_s - rest)
