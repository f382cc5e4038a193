"""Install compressed communication on the model the Trainer prepared.

- FSDP2: ``hfcompress.apply`` on the ``fully_shard``-ed model; every module's all-gather and
  reduce-scatter are wrapped to time them and count their uncompressed size.
- DDP: the all-reduce comm hook of ``integrations.ddp`` (its ``AllReduceState``), wrapped the
  same way. DDP has no weight all-gather: a preset's all-reduce is its ``all_reduce``
  scheme, else its gradient scheme ``grad_inter`` (e.g. ``sdp4bit`` all-reduces with the
  4-bit Hadamard scheme); weight schemes, hpZ and the 2-hop layout need FSDP2.

(No ``from __future__ import annotations`` here: DDP checks the hook's annotations.)
"""

import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from .api import apply
from .comm import Topology, WireMeter
from .comm.all_reduce import stock_all_reduce_bytes
from .config import CompressionConfig, Scheme
from .integrations.ddp import AllReduceState
from .integrations.fsdp import FSDPCompression
from .trainer_metrics import CommStats


def describe(scheme: Optional[Scheme]) -> str:
    """``"hadamard 4-bit"``, ``"exact"``, ... for messages."""
    if scheme is None:
        return "exact (uncompressed)"
    bits = scheme.params.get("bits")
    return f"{scheme.name} {bits}-bit" if bits is not None else scheme.name


def one_node_fallback(config: CompressionConfig, ranks_per_node: int, world: int) -> Optional[str]:
    """What a multi-node preset does on a single node (FSDP2), or None if nothing changes."""
    if ranks_per_node != world or world < 2 or not (config.two_hop or config.hpz):
        return None
    parts = []
    if config.two_hop:
        parts.append(f"its 2-hop gradient reduce-scatter ({describe(config.grad_intra)} inside "
                     f"a node, {describe(config.grad_inter)} across nodes) runs only the "
                     f"intra-node hop, so gradients are sent {describe(config.grad_intra)}")
    if config.hpz:
        parts.append(f"hpZ changes nothing (the backward all-gather already stays inside the "
                     f"node; it sends {describe(config.weights)} weights like the forward one)")
    hint = "Set ranks_per_node to emulate nodes"
    if config.two_hop and describe(config.grad_intra) != describe(config.grad_inter):
        hint += ", or use 'ulq' / 'loco' for 4-bit gradients on one node"
    return (f"comm_compressor {config.name!r} is built for several nodes, but all {world} ranks "
            f"are on one node (ranks_per_node={ranks_per_node}): " + "; ".join(parts) +
            f". {hint}")


def check_integration(config: CompressionConfig, fsdp: bool) -> None:
    """ValueError if ``config`` compresses nothing that FSDP2 (or DDP) sends."""
    if not fsdp:
        ddp_scheme(config)
    elif config.all_reduce is not None and not config.compresses_fsdp:
        raise ValueError(f"comm_compressor {config.name!r} compresses only DDP's all-reduce "
                         f"({describe(config.all_reduce)}); FSDP2's all-gather and "
                         f"reduce-scatter have nothing to compress. Train with DDP (no fsdp), "
                         f"or pick an FSDP preset such as 'sdp4bit'")


def ddp_scheme(config: CompressionConfig) -> Optional[Scheme]:
    """The scheme DDP's all-reduce uses for ``config``; ValueError if the preset compresses
    nothing DDP sends."""
    scheme = config.all_reduce or config.grad_inter
    if scheme is None and (config.weights is not None or config.grad_intra is not None
                           or config.loco is not None):
        raise ValueError(f"comm_compressor {config.name!r} compresses only FSDP's collectives "
                         f"(weights: {describe(config.weights)}); DDP sends only gradients "
                         f"through its all-reduce. Run with FSDP2 (fsdp=True, fsdp_config="
                         f"{{'version': 2}}, or an accelerate FSDP config), or pick a gradient "
                         f"preset such as 'loco' or 'global_qsgd'")
    return scheme


# -- FSDP2 ----------------------------------------------------------------------------------
class TimedAllGather(AllGather):
    def __init__(self, inner: AllGather, stats: CommStats) -> None:
        self.inner, self.stats = inner, stats

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> Any:
        self.stats.baseline(input_tensor.numel() * input_tensor.element_size(), group)
        with self.stats.timer(input_tensor.device):
            return self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                              group=group, async_op=async_op)


class TimedReduceScatter(ReduceScatter):
    def __init__(self, inner: ReduceScatter, stats: CommStats) -> None:
        self.inner, self.stats = inner, stats

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> Any:
        self.stats.baseline(output_tensor.numel() * input_tensor.element_size(), group)
        with self.stats.timer(input_tensor.device):
            return self.inner(output_tensor=output_tensor, input_tensor=input_tensor,
                              group=group, op=op, async_op=async_op)


def install_fsdp(model: nn.Module, config: CompressionConfig, ranks_per_node: int,
                 stats: CommStats) -> FSDPCompression:
    """``hfcompress.apply`` on an FSDP2 model, every collective timed and baselined."""
    fallback = one_node_fallback(config, ranks_per_node, dist.get_world_size())
    if fallback and dist.get_rank() == 0:
        warnings.warn(f"hfcompress: {fallback}", UserWarning, stacklevel=2)
    handle = apply(model, config, ranks_per_node=ranks_per_node)
    stats.topology = handle.topology
    for comms in handle.comms.values():
        comms.ag = TimedAllGather(comms.ag, stats)
        comms.rs = TimedReduceScatter(comms.rs, stats)
    return handle.install()


# -- DDP ------------------------------------------------------------------------------------
class HookState:
    """The DDP hook's state: hfcompress's all-reduce state, the stats to feed, and the bucket
    keys used so far in this process."""

    def __init__(self, state: AllReduceState, stats: CommStats) -> None:
        self.state, self.stats = state, stats
        self.used: set = set()

    def restored_order(self, key: Any, named: list) -> Optional[torch.Tensor]:
        """Indices putting this bucket's values in the order of a stream restored from a
        checkpoint, when DDP's first iteration orders the same parameters differently (DDP
        rebuilds its buckets after the first iteration: the checkpoint holds the rebuilt
        order). None: use the bucket as it is (a stream whose parameters differ restarts)."""
        stream = self.state.streams.get(key)
        first_use = key not in self.used
        self.used.add(key)
        if stream is None or not first_use:
            return None
        saved = [(seg.name, seg.numel) for seg in stream.layout.segments]
        if saved == named:
            return None
        if sorted(saved) != sorted(named) or len(set(saved)) != len(saved):
            warnings.warn(f"hfcompress: DDP bucket {key} holds other parameters than the bucket "
                          f"restored from the checkpoint; its compressor state (LoCo errors, "
                          f"RNG) restarts", UserWarning, stacklevel=2)
            return None
        start, offset = {}, 0
        for entry in named:
            start[entry], offset = offset, offset + entry[1]
        return torch.cat([torch.arange(start[e], start[e] + e[1]) for e in saved])


def timed_all_reduce_hook(hook_state: HookState,
                          bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``integrations.ddp.all_reduce_hook``, timed, with the stock all-reduce's bytes counted,
    and restored streams kept across DDP's bucket reordering."""
    state, buf = hook_state.state, bucket.buffer()
    world, me = dist.get_world_size(state.group), dist.get_rank(state.group)
    hook_state.stats.baseline(stock_all_reduce_bytes(buf.numel(), buf.element_size(), world, me),
                              state.group)
    names = state.param_names
    named = [(names.get(id(p), "?"), p.numel()) for p in bucket.parameters()]
    with hook_state.stats.timer(buf.device):
        key = bucket.index()
        order = hook_state.restored_order(key, named)
        if order is None:
            state.reduce(key, buf, state.layout(named))
        else:
            part = buf[order.to(buf.device)]
            state.reduce(key, part, state.streams[key].layout)
            buf[order.to(buf.device)] = part
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def install_ddp(ddp_model: nn.parallel.DistributedDataParallel, config: CompressionConfig,
                ranks_per_node: int, stats: CommStats) -> AllReduceState:
    """Register the compressed all-reduce hook on ``ddp_model`` (see ``register_ddp_hook``)."""
    ddp_scheme(config)
    topology = stats.topology = Topology(ranks_per_node)
    state = AllReduceState(config, ddp_model.process_group, topology, WireMeter())
    state.param_names = {id(p): n for n, p in ddp_model.module.named_parameters()}
    ddp_model.register_comm_hook(HookState(state, stats), timed_all_reduce_hook)
    return state
