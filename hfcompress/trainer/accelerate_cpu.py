"""Distributed Trainer runs on a CPU-only machine (docs/architecture.md, "Accelerate on CPU").

- Accelerate treats a process without a GPU as a single-process run unless told ``cpu``:
  under ``torchrun`` / ``accelerate launch --multi_gpu`` every rank would train alone.
  :func:`default_use_cpu` turns on ``use_cpu`` for a multi-process launch without an
  accelerator, so the ranks train together over gloo.
- Accelerate keeps an FSDP plugin only for GPU-like distributed types and silently runs DDP
  on CPU, and its ``ParallelismConfig`` refuses ``MULTI_CPU``. :func:`enable_fsdp_on_cpu`
  sets the distributed type to ``MULTI_GPU`` before the Trainer builds its ``Accelerator``
  (FSDP asked for, or a model that transformers sharded at load time:
  ``from_pretrained(distributed_config=DistributedConfig(tp_size=..., fsdp_size=...))``);
  FSDP2 then shards the model on CPU (gloo), and the mesh is built on ``"cpu"``.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

logger = logging.getLogger(__name__)


def is_rank0() -> bool:
    """Global rank 0 of the launch (what hfcompress did for the user is logged there once)."""
    return int(os.environ.get("RANK", "0")) == 0


def is_machine_lead() -> bool:
    """Local rank 0 of a machine other than global rank 0's (says one line there, so a
    multi-machine launch shows on every machine that hfcompress is on)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and not is_rank0()


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_use_cpu(args) -> None:
    """``use_cpu=True`` for a multi-process launch on a machine without an accelerator."""
    if args.use_cpu or torch.accelerator.is_available() or launched_world_size() < 2:
        return
    args.use_cpu = True
    if is_rank0():
        logger.warning(f"hfcompress: no GPU found, so use_cpu was set to True: the "
                       f"{launched_world_size()} launched processes train together over gloo "
                       f"(Accelerate would otherwise train each alone)")


def init_process_group(args) -> bool:
    """Create the default process group with ``args.ddp_timeout`` for a multi-process CPU
    launch (``use_cpu``), where transformers leaves the timeout out; Accelerate then uses
    this group. Call before ``args.device`` is first read. True if it created the group."""
    if not args.use_cpu or launched_world_size() < 2 or dist.is_initialized() \
            or not all(os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK")):
        return False     # not a launch, or the group is the user's / Accelerate's to make
    dist.init_process_group(args.ddp_backend or "gloo", timeout=args.ddp_timeout_delta,
                            rank=int(os.environ["RANK"]), world_size=launched_world_size())
    return True


def apply_ddp_timeout(args) -> bool:
    """Give the default process group ``args.ddp_timeout`` where a CPU launch's arguments
    set up their devices without it (``use_cpu``: transformers leaves the timeout out, and
    ``TrainingArguments.__post_init__`` sets the devices up, so the group exists before the
    Trainer sees the arguments: any ``TrainingArguments`` class, TRL's ``SFTConfig``, ...).
    Only a group at torch's default timeout changes (a timeout set elsewhere is kept). True
    if it changed the timeout."""
    from ..integrations.timeouts import group_timeout, set_default_timeout

    cpu = args.use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    if not cpu or not dist.is_initialized():
        return False
    want = args.ddp_timeout_delta
    have = group_timeout()
    if have is None or have == want or have != default_pg_timeout:
        return False
    set_default_timeout(want)
    return True


def give_ddp_timeout(args) -> list[str]:
    """``args.ddp_timeout`` on every process group of this process that still has torch's
    default timeout (``integrations.timeouts.give_timeout``): the device mesh's dims and
    flattened dims (Accelerate's ``ParallelismConfig``, transformers' ``DistributedConfig``
    create them without a timeout: 30 min under gloo, 10 under NCCL), the world where the
    launch left it out, the node groups hfcompress builds. Any launch, GPU or CPU; a timeout
    set elsewhere is kept. Local (no collective): call it once the groups exist (the
    Trainer: after its Accelerator is built, and around installing the compression). Returns
    the changed groups' names (logged on rank 0)."""
    from ..integrations.timeouts import give_timeout, process_groups, seconds

    if not dist.is_initialized():
        return []
    changed = give_timeout(process_groups(), args.ddp_timeout_delta)
    if changed and is_rank0():
        logger.info(f"hfcompress: ddp_timeout {seconds(args.ddp_timeout_delta)} given to "
                    f"{len(changed)} process group(s) created with torch's default: "
                    f"{', '.join(changed)}")
    return changed


def fsdp_version(args) -> int | None:
    """The FSDP version the user asked for (``args.fsdp`` / ``fsdp_config``, or an
    ``accelerate launch`` FSDP config), None if FSDP was not asked for."""
    if getattr(args, "fsdp_plugin_args", None):
        return int(args.fsdp_plugin_args.get("fsdp_version", 2))
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return int(os.environ.get("FSDP_VERSION", "1"))
    return None


def sharded_by_transformers(model) -> bool:
    """Whether transformers sharded ``model`` when loading it (``DistributedConfig``: TP, FSDP2
    or HSDP over its own mesh); the Trainer then does not shard it again."""
    return bool(getattr(model, "is_distributed_loading_by_transformers", False))


def enable_fsdp_on_cpu(args, model=None) -> bool:
    """If FSDP was asked for (or ``model`` was sharded by transformers at load time) and this
    is a multi-process CPU run, make Accelerate keep it.

    Call after ``args.device`` was set up and before the Trainer creates its Accelerator.
    Returns whether the distributed type was changed."""
    from accelerate.utils import DistributedType

    if fsdp_version(args) is None and not sharded_by_transformers(model):
        return False
    state = args.distributed_state
    if state is None or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    state.distributed_type = DistributedType.MULTI_GPU
    if is_rank0():
        logger.warning("hfcompress: FSDP requested on CPU, where Accelerate would silently "
                       "fall back to DDP, so its distributed type was set to MULTI_GPU: "
                       "FSDP2 shards the model over gloo")
    return True
