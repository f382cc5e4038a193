"""Where the GPUs of a job are: nodes x GPUs per node, split into tensor (TP), context (CP),
pipeline (PP) and data parallelism (DP), and what that makes of one node's network link.

TP and CP are innermost (their ranks share a node: NVLink), PP outermost (its stages take
whole nodes), the rest is data parallel: each DP group has ``dp_per_node`` (x) ranks on
each of ``dp_nodes`` (y) nodes, and ``groups_per_node`` (k) DP groups (one per TP x CP
position) share each node's link, all running the same collective at the same time
(Megatron-LM's rank order; ZeRO++ 3.3's hpZ and SDP4Bit 3.2's 2-hop reduce-scatter are
built on this x / y split).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm.topology import divisors


@dataclass(frozen=True)
class ClusterLayout:
    """nodes x gpus_per_node GPUs; TP and CP innermost (inside a node: tp*cp must divide
    gpus_per_node), PP outermost (across nodes: pp must divide nodes); the rest is data
    parallel."""

    nodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "tp", "pp", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClusterLayout.{name}={value!r} must be an int >= 1")
        inner = self.tp * self.cp
        if self.gpus_per_node % inner:
            raise ValueError(
                f"tp x cp = {self.tp} x {self.cp} = {inner} must divide gpus_per_node="
                f"{self.gpus_per_node} (TP and CP stay inside a node): choose tp*cp among "
                f"{divisors(self.gpus_per_node)}")
        if self.nodes % self.pp:
            raise ValueError(
                f"pp={self.pp} must divide nodes={self.nodes} (each pipeline stage takes whole "
                f"nodes): choose pp among {divisors(self.nodes)} or change --nodes")

    @property
    def dp_per_node(self) -> int:
        """x: ranks of one DP group on a node."""
        return self.gpus_per_node // (self.tp * self.cp)

    @property
    def groups_per_node(self) -> int:
        """k: DP groups whose collectives share a node's link."""
        return self.tp * self.cp

    @property
    def dp_nodes(self) -> int:
        """y: nodes one DP group spans."""
        return self.nodes // self.pp

    @property
    def dp(self) -> int:
        """The data-parallel group size x * y."""
        return self.dp_per_node * self.dp_nodes
