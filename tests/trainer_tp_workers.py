"""Worker of the Trainer-on-an-N-D-mesh test (``tests/test_trainer_tp.py``): 4 gloo ranks as 2
emulated nodes of 2 (``ranks_per_node=2``), ``hfcompress.Trainer`` on two meshes:

- ``hsdp``: Accelerate's ``ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)`` with
  FSDP2 (native HSDP: shard groups {0, 1}, {2, 3} inside a node, replicas {0, 2}, {1, 3});
- ``tp``: dp_shard 2 x tp 2, TP inside a node, the tiny LLaMA sharded by transformers at load
  time (``from_pretrained(distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))``,
  its ``base_model_tp_plan``; the Trainer hands Accelerate the matching ``ParallelismConfig``).
  Accelerate 1.15's own TP preparation with FSDP2 fails on transformers 5.24 (it imports the
  removed ``transformers.integrations.tensor_parallel.ReplicateParallel``).

Per mesh: the plain Trainer (``comm_compressor=None``), ``none`` and ``sdp4bit``; HSDP's
``sdp4bit`` saved at step 2 of 4 and resumed from that checkpoint (transformers 5.24 refuses
checkpoints of a model it sharded at load time: "Resuming is not supported for models sharded
at load time").
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hfcompress.integrations import _fsdp2
from hfcompress.integrations.fsdp import fsdp_modules
from trainer_workers import Arithmetic, losses, setup, tiny_llama

RANKS_PER_NODE = 2
STEPS, SAVE_AT = 4, 2


def meshes() -> tuple[str, ...]:
    """The meshes this transformers can train: loading a TP x FSDP2 model
    (``DistributedConfig(tp_size=2, fsdp_size=2)``) works on 5.24; 5.17's (the GPU image's)
    fails inside transformers (an IndexError in ``DtensorShardOperation``)."""
    import transformers
    from packaging.version import Version
    return ("hsdp", "tp") if Version(transformers.__version__) >= Version("5.24") else ("hsdp",)


def model_for(mesh: str, folder: str):
    if mesh == "hsdp":
        return tiny_llama()
    from transformers import LlamaForCausalLM
    from transformers.distributed import DistributedConfig
    return LlamaForCausalLM.from_pretrained(
        folder, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2),
        dtype=torch.float32)


def train(out: str, mesh: str, preset, folder: str, resume: str | None = None, **kw):
    import hfcompress
    from accelerate import ParallelismConfig
    if mesh == "hsdp":
        extra = dict(fsdp=True, fsdp_config={"version": 2},
                     parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
    else:   # the model's own mesh, given: transformers < 5.24's Trainer passes its TP size only
        extra = dict(parallelism_config=ParallelismConfig(tp_size=2, dp_shard_size=2))
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    args = hfcompress.TrainingArguments(**{
        "output_dir": out, "max_steps": STEPS, "per_device_train_batch_size": 4,
        "logging_steps": 1, "report_to": [], "save_strategy": "no", "learning_rate": 3e-3,
        "warmup_steps": 0, "lr_scheduler_type": "constant", "disable_tqdm": True, "seed": 0,
        "data_seed": 0, "dataloader_num_workers": 0, "comm_compressor": preset,
        "ranks_per_node": RANKS_PER_NODE, **extra, **kw})
    trainer = hfcompress.Trainer(model=model_for(mesh, folder), args=args,
                                 train_dataset=Arithmetic())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def final_shards(trainer) -> dict[str, torch.Tensor]:
    return {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
            for n, p in trainer.model_wrapped.named_parameters()}


def declared(trainer) -> dict[str, tuple[float, float]]:
    """(intra, inter) bytes of one steady step on this rank, per collective tag, from the
    collectives' declarations: the shard group's (``tp_workers.declared_step``) and, with
    native HSDP, the replica all-reduce of each module's gradient shard."""
    from hfcompress.comm.all_reduce import QuantizedAllReduce
    from hfcompress.comm.traffic import sent
    from hfcompress.integrations.ddp import all_reduce_compressor
    from tp_workers import declared_step
    h = trainer.compression
    out = declared_step(trainer.model_wrapped, h)
    replica = getattr(h.installed_parts, "replica", None)
    if replica is None:
        return out
    topo = replica.topology
    x, y = topo.ranks_per_node, topo.num_nodes
    comp = all_reduce_compressor(h.config, replica.size, 0, 0)
    tags: dict[str, list] = {}
    for m in h.comms.values():
        layout = m.layouts.trainable
        e = layout.exact_numel
        c = layout.numel - e
        if comp is None or c == 0:
            tags.setdefault("replica_all_reduce_exact", []).extend(
                QuantizedAllReduce.traffic(c + e, x, y, None, 4))
            continue
        tags.setdefault("replica_all_reduce", []).extend(
            QuantizedAllReduce.traffic(c, x, y, comp, 4))
        if e:
            tags.setdefault("replica_all_reduce_exact", []).extend(
                QuantizedAllReduce.traffic(e, x, y, None, 4))
    return {**out, **{k: sent(v, x, y) for k, v in tags.items()}}


def run(tmp: str, mesh: str, folder: str) -> dict:
    out = {}
    for preset in (None, "none"):
        t = train(os.path.join(tmp, f"{mesh}-{preset}"), mesh, preset, folder)
        out[preset] = {"losses": losses(t), "params": final_shards(t)}
        if preset == "none":
            out[preset].update(meter=t.compression.meter.history, declared=declared(t),
                               nodes=t.compression.node_traffic())
    d = os.path.join(tmp, f"{mesh}-sdp4bit")
    # transformers refuses checkpoints of a model it sharded at load time (no optimizer state)
    save = dict(save_strategy="steps", save_steps=SAVE_AT) if mesh == "hsdp" else {}
    t = train(d, mesh, "sdp4bit", folder, **save)
    h = t.compression
    out["sdp4bit"] = {"losses": losses(t), "params": final_shards(t), "meter": h.meter.history,
                      "declared": declared(t), "describe": repr(h),
                      "topology": (h.topology.ranks_per_node, h.topology.num_nodes,
                                   list(h.topology.ranks)),
                      "nodes": h.node_traffic(), "units": list(h.comms)}
    h.remove()            # FSDP2's own collectives again, its replica all-reduce included
    out["sdp4bit"]["hsdp_after_remove"] = [
        _fsdp2.is_hsdp(_fsdp2.param_groups(m)[0]) for _, m in fsdp_modules(t.model_wrapped)]
    if not save:
        return out
    ckpt = os.path.join(d, f"checkpoint-{SAVE_AT}")
    saved = torch.load(os.path.join(ckpt, f"hfcompress_rank{dist.get_rank()}.pt"),
                       weights_only=False)
    out["settings"] = saved["settings"]
    r = train(os.path.join(tmp, f"{mesh}-resumed"), mesh, "sdp4bit", folder, resume=ckpt)
    out["resumed"] = {"losses": losses(r), "params": final_shards(r)}
    return out


def pretrained_folder(rank: int, world: int, tmp: str) -> str:
    """Set up the rank's process group and the tiny LLaMA saved as a pretrained folder (TP
    loads one: transformers shards it as it loads)."""
    setup(rank, world)
    folder = os.path.join(tmp, "tiny-llama")
    if rank == 0:
        tiny_llama().save_pretrained(folder)
    dist.barrier()
    return folder


def worker(rank: int, world: int, tmp: str) -> dict:
    folder = pretrained_folder(rank, world, tmp)
    return {mesh: run(tmp, mesh, folder) for mesh in meshes()}
