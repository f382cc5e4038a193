"""Quantized collectives over torch.distributed: topology, wire meter, all-gather,
reduce-scatter (1-hop and 2-hop all-to-all), all-reduce (Global-QSGD, group schemes, LoCo).
Group-aware, any size, fp32/bf16/fp16."""

from .all_gather import QuantizedAllGather, all_gather
from .all_reduce import QuantizedAllReduce, all_reduce
from .reduce_scatter import QuantizedReduceScatter, reduce_scatter
from .topology import Topology, resolve_ranks_per_node
from .two_hop import TwoHopReduceScatter, reduce_scatter_2hop, slice_order
from .wire_meter import WireMeter

__all__ = ["QuantizedAllGather", "QuantizedAllReduce", "QuantizedReduceScatter", "Topology",
           "TwoHopReduceScatter", "WireMeter", "all_gather", "all_reduce", "reduce_scatter",
           "reduce_scatter_2hop", "resolve_ranks_per_node", "slice_order"]
