"""The examples' device mesh: ``--dp_replicate_size``, ``--dp_shard_size``, ``--tp_size``,
checked against the launched world before any work, as Accelerate's ``ParallelismConfig``
(the Trainer's ``parallelism_config``).

- HSDP, ``--dp_replicate_size R --dp_shard_size S`` (R x S processes): FSDP2 shards every
  unit over S ranks (a node: ``--ranks_per_node S``) and replicates it R times (across
  nodes); hfcompress compresses the shard group's all-gather / reduce-scatter and the
  replicas' all-reduce. The scripts turn FSDP2 on for it.
- TP, ``--tp_size T`` (and ``--dp_shard_size S``, S x T processes): transformers shards the
  pretrained model when loading it (``from_pretrained(..., distributed_config=
  DistributedConfig(tp_size=T, fsdp_size=S))``, the model's tensor-parallel plan; TP groups
  are consecutive ranks, inside a node with ``--ranks_per_node`` a multiple of T) and FSDP2
  over S; hfcompress compresses the data-parallel collectives, TP's stay torch's. Needs
  ``--model_name_or_path`` (a folder or hub id): Accelerate 1.15's own TP preparation fails
  on transformers 5.24.
- HSDP beside TP is refused (not tried through the Trainer).

Under TP, FSDP2 warns once per rank and unit that a unit "returned a view tensor": TP's output
hooks return ``DTensor.to_local()``, a view, from the embedding, the final norm + lm_head unit
and the root. The hazard it names (an in-place op on that view drops the unit's pre-backward
all-gather) needs a consumer that writes into the output; transformers' LLaMA, Mistral and
Mixtral and the Trainer use these outputs out of place only (the Trainer's ``loss *=`` acts on
the loss, not a view), and a dp_shard 2 x tp 2 run gave the losses and gradient norms of
FSDP2 on 2 ranks alone, step for step. :func:`quiet_tp_view_warnings` silences exactly these
warnings for those model types; other models keep them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from hfcompress.models import is_gguf

#: what turns FSDP2 on for HSDP or ``--dp_shard_size`` alone (unless asked for already)
FSDP2_FLAGS = ["--fsdp", "--fsdp_config", '{"version": 2}']


@dataclass
class MeshArguments:
    dp_replicate_size: int = field(default=1, metadata={
        "help": "HSDP: replicas of the FSDP2 shards (e.g. the number of nodes)."})
    dp_shard_size: int = field(default=0, metadata={
        "help": "Ranks each FSDP2 unit is sharded over (0: the processes divided by "
                "dp_replicate_size x tp_size)."})
    tp_size: int = field(default=1, metadata={
        "help": "Tensor parallelism: transformers shards --model_name_or_path at load time."})


def parallelism_config(mesh: MeshArguments, world: int, fsdp: bool,
                       model_name_or_path: str | None):
    """The ``ParallelismConfig`` of ``mesh`` on ``world`` processes, None for the flat layout
    (no mesh flags, or ``--dp_shard_size`` = the world: DDP, or FSDP2 with ``--fsdp``).
    ``fsdp``: FSDP was asked for (``--fsdp`` or an FSDP config). ValueError, saying what to
    change, for a mesh that does not fit the world or is not supported here."""
    r, s, t = mesh.dp_replicate_size, mesh.dp_shard_size, mesh.tp_size
    if r < 1 or t < 1 or s < 0:
        raise ValueError(f"--dp_replicate_size {r}, --tp_size {t} must be >= 1 and "
                         f"--dp_shard_size {s} >= 0 (0: the rest of the processes)")
    s = s or max(world // (r * t), 1)
    if r * s * t != world:
        raise ValueError(f"dp_replicate_size x dp_shard_size x tp_size = {r} x {s} x {t} = "
                         f"{r * s * t}, but {world} process(es) were launched: the sizes must "
                         f"multiply to the number of processes")
    if r == t == 1:
        return None
    if r > 1 and t > 1:
        raise ValueError("--dp_replicate_size with --tp_size (HSDP beside TP) is not supported "
                         "by these scripts; use one of them")
    if t > 1:
        if model_name_or_path is None or is_gguf(model_name_or_path):
            raise ValueError("--tp_size needs --model_name_or_path (a folder or hub id, not a "
                             ".gguf file): transformers shards a pretrained model when loading "
                             "it (save a model built from a config with save_pretrained first)")
        if fsdp:
            raise ValueError("--tp_size: transformers shards the model itself (FSDP2 over "
                             "dp_shard_size); drop --fsdp / the FSDP config file")
    if s == 1:
        why = "TP alone has no data-parallel collectives to compress" if t > 1 else \
            "replicas alone are DDP: launch without the mesh flags"
        raise ValueError(f"dp_replicate_size {r} x tp_size {t} leaves dp_shard_size 1: no "
                         f"FSDP2 group ({why})")
    from accelerate import ParallelismConfig
    return ParallelismConfig(dp_replicate_size=r, dp_shard_size=s, tp_size=t)


def check_tp_checkpoints(tp_size: int, training) -> None:
    """Before any work: with TP, transformers saves and loads the weights but not the
    optimizer state of the sharded model (a checkpoint or a resume fails after the training
    with its errors on every rank). ValueError naming the flags that avoid it."""
    if tp_size <= 1:
        return
    if training.resume_from_checkpoint not in (None, "", "False", "false"):
        raise ValueError(f"--tp_size {tp_size} with --resume_from_checkpoint: transformers "
                         f"cannot resume a TP model's optimizer state; resume without "
                         f"--tp_size (a checkpoint of the weights loads as a pretrained model "
                         f"with --model_name_or_path)")
    if str(training.save_strategy) not in ("no", "SaveStrategy.NO") \
            and not training.save_only_model:
        raise ValueError(f"--tp_size {tp_size} with --save_strategy "
                         f"{getattr(training.save_strategy, 'value', training.save_strategy)}: "
                         f"transformers cannot save a TP model's optimizer state; add "
                         f"--save_only_model (weights only) or use --save_strategy no")


def wants_fsdp2(mesh: MeshArguments) -> bool:
    """HSDP, or FSDP2 over ``--dp_shard_size`` ranks (not TP: transformers shards that)."""
    return mesh.tp_size == 1 and (mesh.dp_replicate_size > 1 or mesh.dp_shard_size > 1)


def distributed_config(parallelism):
    """The ``DistributedConfig`` to load the model with (TP), None otherwise."""
    if parallelism is None or parallelism.tp_size == 1:
        return None
    from transformers.distributed import DistributedConfig
    return DistributedConfig(tp_size=parallelism.tp_size, fsdp_size=parallelism.dp_shard_size)


def check_tp_heads(config, tp_size: int) -> None:
    """Each TP rank computes whole attention heads: ValueError naming the head counts that
    ``tp_size`` does not divide (transformers would fail in the first forward)."""
    heads = {k: getattr(config, k, None) for k in ("num_attention_heads", "num_key_value_heads")}
    bad = [f"{k} = {v}" for k, v in heads.items() if v and v % tp_size]
    if bad:
        raise ValueError(f"--tp_size {tp_size} does not divide the model's {' and '.join(bad)} "
                         f"(each TP rank holds whole heads): choose a tp_size that does")


#: model types whose forward (and the Trainer's loss step) never writes into a TP unit's output
TP_VIEW_SAFE_MODELS = ("llama", "mistral", "mixtral")
#: the warning FSDP2 gives for the TP units of those models (embedding, norm + lm_head, root)
TP_VIEW_WARNING = (r"FSDP2-wrapped module \((FSDPEmbedding|FSDP\w+RMSNorm, FSDPLinear|"
                   r"FSDP\w+ForCausalLM)\) returned a view tensor")


def quiet_tp_view_warnings(config) -> None:
    """Silence FSDP2's "returned a view tensor" warnings of the TP units when ``config``'s
    model type is one whose forward uses them out of place (see the module docstring)."""
    if getattr(config, "model_type", None) in TP_VIEW_SAFE_MODELS:
        warnings.filterwarnings("ignore", message=TP_VIEW_WARNING, category=UserWarning)


def mesh_shape(parallelism) -> dict[str, int] | None:
    """``{"dp_replicate": R, "dp_shard": S, "tp": T}`` (sizes above 1) for the summary."""
    if parallelism is None:
        return None
    sizes = {"dp_replicate": parallelism.dp_replicate_size,
             "dp_shard": parallelism.dp_shard_size, "tp": parallelism.tp_size}
    return {k: v for k, v in sizes.items() if v > 1}

