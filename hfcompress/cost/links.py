"""The links of a cluster one has not measured yet, as effective bandwidths (the planner's
counterpart of ``auto/probe.py``'s fitted :class:`~hfcompress.auto.probe.ProbedLinks`).

Effective, not nominal: what a node's data-parallel collectives really get. Fitted to the
papers' published runs, SDP4Bit's H800 cluster gave 0.13-0.14 of its stated 3.2 Tbit/s per
node (BENCHMARKS.md, "Planner vs the papers' clusters"); measure it (``hfcompress probe``)
or fit it to a few measured steps (``cost/calibrate.py``) rather than typing the data
sheet's number.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Gbit/s when neither the user nor a links file gives them: per node link, about what
#: SDP4Bit's H800 nodes (8 x 400 Gbit/s NICs) gave their data-parallel collectives; per GPU
#: inside a node, two thirds of H100 NVLink's 450 GB/s a direction
DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS = 400.0, 2400.0

#: effective / stated inter-node bandwidth of the papers' clusters whose bandwidth is stated,
#: as fitted (``benchmarks/results/plan_papers/plan_papers_fits.csv``, fitted_over_stated:
#: ZeRO++'s V100 / A100 InfiniBand, SDP4Bit's A100 Slingshot and H800 InfiniBand): the
#: lowest, the median and the highest. ``plan --nominal-inter-node-gbps`` prices at the
#: median and shows the answers at both ends.
NOMINAL_EFFICIENCY = (0.134, 1.12, 4.95)


@dataclass(frozen=True)
class ClusterLinks:
    """``inter_node_gbps``: Gbit/s of one node's network link (all its NICs), one direction;
    ``intra_node_gbps``: Gbit/s per GPU inside a node (NVLink / PCIe); latencies per
    message (per ring step)."""

    inter_node_gbps: float
    intra_node_gbps: float
    inter_latency_us: float = 10.0
    intra_latency_us: float = 2.0

    def __post_init__(self) -> None:
        for name in ("inter_node_gbps", "intra_node_gbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ClusterLinks.{name}={getattr(self, name)!r} must be > 0 "
                                 f"(Gbit/s)")
        for name in ("inter_latency_us", "intra_latency_us"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ClusterLinks.{name}={getattr(self, name)!r} must be >= 0")

    @property
    def inter_bytes_per_s(self) -> float:
        return self.inter_node_gbps * 1e9 / 8

    @property
    def intra_bytes_per_s(self) -> float:
        return self.intra_node_gbps * 1e9 / 8
