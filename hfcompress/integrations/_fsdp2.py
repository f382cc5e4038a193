"""Every private FSDP2 internal hfcompress relies on, in one place.

FSDP2's public API (``fully_shard``, ``FSDPModule.set_custom_all_gather`` /
``set_custom_reduce_scatter`` / ``set_all_reduce_hook``) takes the collective objects but not
what they need to know: the base classes ``AllGather`` / ``ReduceScatter``, whether an
all-gather runs in forward or backward, the param groups and their parameters, hpZ's
post-forward mesh, native HSDP (its groups, and the FSDP-only mesh info that skips its exact
replica all-reduce). Those live in ``torch.distributed.fsdp._fully_shard``; no
other hfcompress module imports them or touches a private attribute of FSDP2 (a test greps
the package).

Checked against torch ``CHECKED_TORCH``. On a torch whose internals moved, ``require()``
(called by ``apply`` before it touches FSDP2) raises :class:`FSDP2InternalsError` naming
what is missing, so DDP keeps working and FSDP2 fails with a clear message; an accessor
that finds a renamed attribute at run time raises it too, instead of an ``AttributeError``
deep inside a collective.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

#: torch releases whose FSDP2 internals this module was checked against (major.minor)
CHECKED_TORCH = ("2.9", "2.10", "2.11", "2.12", "2.13")


#: where an FSDPState keeps its param groups: a list (torch 2.13), or one group or None (2.11)
_PARAM_GROUP_ATTRS = ("_fsdp_param_groups", "_fsdp_param_group")


class FSDP2InternalsError(ImportError):
    """The installed torch moved an FSDP2 internal hfcompress relies on."""


def _moved(what: str, version: str = torch.__version__) -> FSDP2InternalsError:
    return FSDP2InternalsError(
        f"hfcompress's FSDP2 integration needs the torch internal {what}, which torch "
        f"{version} does not have (checked against torch {', '.join(CHECKED_TORCH)}). "
        f"Install one of those torch versions, or an hfcompress release that supports "
        f"torch {version}")


def check_internals(version: str = torch.__version__) -> dict[str, Any]:
    """Import the private names and check the class-level API and a fresh ``FSDPState``'s
    param-group attribute; FSDP2InternalsError if one moved. Returns the names
    (``AllGather``, ``ReduceScatter``, ``TrainingState``)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
        from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, TrainingState
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError as err:
        raise _moved(f"module/name ({err})", version) from err
    state = FSDPState()            # no process group needed: the attributes are set in __init__
    if not any(hasattr(state, a) for a in _PARAM_GROUP_ATTRS):
        raise _moved(f"FSDPState.{' or .'.join(_PARAM_GROUP_ATTRS)}", version)
    needed = [(TrainingState, "PRE_BACKWARD"), (FSDPParamGroup, "is_sharded_post_forward"),
              (FSDPParamGroup, "_is_hsdp"), (FSDPModule, "_get_fsdp_state"),
              (FSDPModule, "set_custom_all_gather"), (FSDPModule, "set_custom_reduce_scatter"),
              (FSDPModule, "set_all_reduce_hook")]
    for owner, attr in needed:
        if not hasattr(owner, attr):
            raise _moved(f"{owner.__name__}.{attr}", version)
    return {"AllGather": AllGather, "ReduceScatter": ReduceScatter,
            "TrainingState": TrainingState, "FSDPMeshInfo": FSDPMeshInfo}


try:
    _names, _problem = check_internals(), None
except FSDP2InternalsError as _err:
    _names, _problem = {}, _err


def require() -> None:
    """FSDP2InternalsError if this torch moved an internal the FSDP2 integration needs."""
    if _problem is not None:
        raise _problem


class _Missing:
    """Stands in for a moved FSDP2 base class; ``require()`` refuses before it is used."""


AllGather = _names.get("AllGather", _Missing)
ReduceScatter = _names.get("ReduceScatter", _Missing)
_PRE_BACKWARD = _names["TrainingState"].PRE_BACKWARD if _names else None


def _get(obj: Any, attr: str) -> Any:
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise _moved(f"{type(obj).__name__}.{attr}") from None


# -- modules and param groups ---------------------------------------------------------------
def param_groups(module: FSDPModule) -> list:
    """The FSDP param groups of one ``fully_shard``-ed module (empty: no parameters)."""
    state = module._get_fsdp_state()
    if hasattr(state, _PARAM_GROUP_ATTRS[0]):
        return list(getattr(state, _PARAM_GROUP_ATTRS[0]))
    group = _get(state, _PARAM_GROUP_ATTRS[1])
    return [] if group is None else [group]


def in_backward(param_group) -> bool:
    """The param group's all-gather is the backward one (FSDP's pre-backward state)."""
    return _get(param_group, "_training_state") == _PRE_BACKWARD


def is_sharded_post_forward(param_group) -> bool:
    """hpZ: the group holds the node's secondary partition (its gather stays in the node)."""
    return _get(param_group, "is_sharded_post_forward")


def is_hsdp(param_group) -> bool:
    """Sharded over a 2-D mesh (native HSDP: FSDP all-reduces over replicas itself)."""
    return _get(param_group, "_is_hsdp")


def shard_group(param_group):
    """The process group the param group shards over."""
    return _get(param_group, "mesh_info").shard_process_group


def replicate_group(param_group):
    """Native HSDP: the process group of the replicas (what FSDP2 all-reduces over)."""
    return _get(param_group, "mesh_info").replicate_process_group


def gradient_divide_factor(param_group) -> float | None:
    """``set_gradient_divide_factor``'s value (None: FSDP2's mean over its groups)."""
    for attr in ("gradient_divide_factor", "_gradient_divide_factor"):   # 2.13, older
        if hasattr(param_group, attr):
            return getattr(param_group, attr)
    raise _moved("FSDPParamGroup.gradient_divide_factor")


def shard_only(param_group) -> Any:
    """Native HSDP without FSDP2's replica all-reduce: the param group gets an FSDP-only mesh
    info over its shard dim (the same shard group: the reduce-scatter and all-gathers are
    unchanged; ``foreach_reduce`` then gets no all-reduce group, so the all-reduce hook runs
    on the reduce-scatter output and the mean is over the shard group only). The parameters
    keep their own mesh info (DTensor placements, state dicts unchanged). Returns the mesh
    info it replaced, for :func:`restore_mesh_info`."""
    old = _get(param_group, "mesh_info")
    new = _names["FSDPMeshInfo"](old.mesh, shard_mesh_dim=old.shard_mesh_dim)
    if hasattr(old, "reduce_scatter_process_group"):   # set_separate_reduce_scatter_group
        new.reduce_scatter_process_group = old.reduce_scatter_process_group
    _set_mesh_info(param_group, new)
    return old


def restore_mesh_info(param_group, info: Any) -> None:
    """Undo :func:`shard_only` (native HSDP's own all-reduce again)."""
    _set_mesh_info(param_group, info)


def _set_mesh_info(param_group, info: Any) -> None:
    # reshard_after_forward=True is the mesh info itself: FSDP2 compares the two to tell
    # a post-forward (hpZ) mesh from it
    if _get(param_group, "post_forward_mesh_info") is param_group.mesh_info:
        param_group.post_forward_mesh_info = info
    param_group.mesh_info = info


def post_forward_shard_size(param_group) -> bool | int:
    """``reshard_after_forward`` as FSDP resolved it: False (no reshard), True (the full
    shard group), or the size of the post-forward (hpZ) group."""
    info = _get(param_group, "post_forward_mesh_info")
    if info is None:
        return False
    return True if info == _get(param_group, "mesh_info") else info.shard_mesh_size


def current_comms(param_group) -> tuple[Any, Any]:
    """The param group's all-gather and reduce-scatter objects (to restore them later)."""
    return _get(param_group, "_all_gather_comm"), _get(param_group, "_reduce_scatter_comm")


# -- parameters -----------------------------------------------------------------------------
def fsdp_params(param_group) -> list:
    return list(_get(param_group, "fsdp_params"))


def all_gather_dtype_device(param_group) -> tuple[torch.dtype, torch.device]:
    """The dtype (mixed-precision param dtype, else the parameters') and device of the
    group's all-gather buffer."""
    fp = fsdp_params(param_group)[0]
    sharded = _get(fp, "sharded_param")
    return _get(param_group, "mp_policy").param_dtype or sharded.dtype, sharded.device


def reduce_dtype(param_group) -> torch.dtype:
    """The dtype of the group's gradient reduce-scatter (mixed-precision reduce dtype, else
    the gradients' dtype: the param dtype under mixed precision, else the parameters')."""
    policy = _get(param_group, "mp_policy")
    return policy.reduce_dtype or all_gather_dtype_device(param_group)[0]


def sharded_params(param_group) -> list:
    """Each parameter as the model holds it between steps (a DTensor ``nn.Parameter``): its
    ``requires_grad`` flag, and its version counter, which in-place writes through it move
    (the local tensors' counters never do; ``foreach`` / ``fused`` optimizer steps move
    neither)."""
    try:    # one try for the lot: a function call per parameter costs the step's host time
        return [p.sharded_param for p in fsdp_params(param_group)]
    except AttributeError:
        raise _moved("FSDPParam.sharded_param") from None


def param_owner(fsdp_param) -> tuple[Any, str]:
    """(module holding the parameter, its attribute name there)."""
    info = _get(fsdp_param, "_module_info")
    return info.module, info.param_name


def padded_shard_numel(fsdp_param) -> int:
    """Values of this parameter in one rank's slot of the flat all-gather buffer."""
    return _get(fsdp_param, "padded_sharded_param_size").numel()


def orig_numel(fsdp_param) -> int:
    return _get(fsdp_param, "_orig_size").numel()


def requires_grad(fsdp_param) -> bool:
    return _get(fsdp_param, "sharded_param").requires_grad
