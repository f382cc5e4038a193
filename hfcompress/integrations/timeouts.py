"""A dead or stalled peer must surface as a clear error within the process group's timeout.

- :func:`group_timeout`: the timeout a process group was created with, for
  ``Topology(timeout=...)`` (``new_group`` without one would wait torch's default 30 minutes);
  :func:`set_default_timeout` changes the default group's, :func:`set_group_timeout` any
  group's (these read or write private torch state: this module is the one place that does).
- :func:`give_timeout`: the user's timeout (``--ddp_timeout``, or the world group's) on the
  groups that still have torch's default: the device mesh's dims (``init_device_mesh`` /
  Accelerate's ``ParallelismConfig`` create them without a timeout), FSDP2's shard and
  replica groups, so that the node groups ``Topology`` builds from them inherit it.
  :func:`process_groups`: every group of this process, for the Trainer's ``ddp_timeout``.
- :func:`comm_guard`: turns a failed collective into a :class:`CommunicationError` naming
  the collective, the FSDP module, the rank, the group and its timeout.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

logger = logging.getLogger(__name__)

#: what torch gives a group created without a timeout (gloo and the others; NCCL)
TORCH_DEFAULT_TIMEOUTS = tuple(t for t in (default_pg_timeout, default_pg_nccl_timeout)
                               if t is not None)


class CommunicationError(RuntimeError):
    """A collective of the compressed FSDP communication failed (peer dead, stalled, ...)."""


def group_timeout(group: dist.ProcessGroup | None = None) -> timedelta | None:
    """The timeout of ``group``'s backend (None if the backend does not expose it)."""
    group = group or dist.group.WORLD
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def set_default_timeout(timeout: timedelta) -> None:
    """Give the default process group ``timeout`` after its creation (torch has no public
    call for it: ``distributed_c10d._set_pg_timeout``, torch 2.9-2.13)."""
    dist.distributed_c10d._set_pg_timeout(timeout)


def set_group_timeout(group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Give ``group`` (this rank is in it) ``timeout`` for its next collectives."""
    dist.distributed_c10d._set_pg_timeout(timeout, group)


def process_groups() -> list[dist.ProcessGroup]:
    """Every process group this process belongs to (the world, the device mesh's dims and
    flattened dims, the node groups, the user's own), in creation order."""
    if not dist.is_initialized():
        return []
    return [g for g in dist.distributed_c10d._world.pg_map if g is not None
            and not dist.distributed_c10d._rank_not_in_group(g)]


def group_name(group: dist.ProcessGroup) -> str:
    """``'mesh_dp_shard' (ranks [2, 3])``: the description torch keeps (``group_desc``: a
    device mesh names its dims so) and the global ranks."""
    desc = getattr(group, "group_desc", "") or ""
    try:
        ranks = dist.get_process_group_ranks(group)
    except (RuntimeError, ValueError):
        ranks = None
    named = f"{desc!r} " if desc and desc != "undefined" else ""
    return f"{named}(ranks {ranks})" if ranks is not None else named.strip() or "<group>"


def mesh_groups(mesh: Any) -> list[dist.ProcessGroup]:
    """The groups of ``mesh``'s dims and, for a sub-mesh (``mesh["dp"]`` of a ``(dp, tp)``
    mesh), those of the mesh it was cut from (its TP dim too); [] for None."""
    if mesh is None:
        return []
    groups = list(mesh.get_all_groups())
    root = getattr(mesh, "_get_root_mesh", lambda: None)()     # torch's private accessor
    if root is not None and root is not mesh:
        groups += list(root.get_all_groups())
    return groups


def seconds(timeout: timedelta | None) -> str:
    return f"{timeout.total_seconds():g} s" if timeout is not None else "unknown"


def give_timeout(groups: Iterable[Any], timeout: timedelta | None) -> list[str]:
    """``timeout`` on each of ``groups`` (process groups, None skipped, each once) whose
    timeout is torch's default, created without one; a timeout set elsewhere is kept.
    Returns the changed groups' names (:func:`group_name`)."""
    if timeout is None or not dist.is_initialized():
        return []
    changed, seen = [], set()
    for group in groups:
        if group is None or id(group) in seen or dist.distributed_c10d._rank_not_in_group(group):
            continue
        seen.add(id(group))
        have = group_timeout(group)
        if have is None or have == timeout or have not in TORCH_DEFAULT_TIMEOUTS:
            continue
        set_group_timeout(group, timeout)
        changed.append(group_name(group))
    return changed


def user_timeout(*groups: Any) -> timedelta | None:
    """The timeout the user chose: the world group's (``init_process_group(timeout=...)``),
    given to those of ``groups`` that kept torch's default (a device mesh's dims do); the
    first group's own timeout when the world has torch's default too. ``apply`` builds the
    node groups with it."""
    world = group_timeout(dist.group.WORLD)
    if world is not None and world not in TORCH_DEFAULT_TIMEOUTS:
        give_timeout(groups, world)
    first = next((g for g in groups if g is not None), dist.group.WORLD)
    return group_timeout(first)


class comm_guard:
    """``with comm_guard(collective, module, group):`` re-raises a failure inside the block
    as :class:`CommunicationError` with context. A class, not a generator: entered twice per
    FSDP unit and step, where a generator's context manager costs ~2 us of host time."""

    __slots__ = ("collective", "module", "group")

    def __init__(self, collective: str, module: str, group: dist.ProcessGroup) -> None:
        self.collective, self.module, self.group = collective, module, group

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, err: BaseException | None, tb: Any) -> bool:
        # DistBackendError, gloo timeouts and closed connections are RuntimeErrors
        if isinstance(err, RuntimeError) and not isinstance(err, CommunicationError):
            raise communication_error(self.collective, self.module, self.group, err) from err
        return False


def communication_error(collective: str, module: str, group: dist.ProcessGroup,
                        err: BaseException) -> BaseException:
    """The :class:`CommunicationError` for ``err`` (itself if it already is one)."""
    if isinstance(err, CommunicationError):
        return err
    limit = seconds(group_timeout(group))
    return CommunicationError(
        f"hfcompress: the {collective} of FSDP module {module or '<root>'!r} failed on "
        f"global rank {dist.get_rank()} (group {group_name(group)} of {group.size()} ranks, "
        f"timeout {limit}). "
        f"A peer rank probably died or stopped calling the collective; the error from "
        f"the process group was: {type(err).__name__}: {err}")
