"""A dead or stalled peer must surface as a clear error within the process group's timeout.

- :func:`group_timeout`: the timeout a process group was created with, for
  ``Topology(timeout=...)`` (``new_group`` without one would wait torch's default 30 minutes);
  :func:`set_default_timeout` changes the default group's (both read or write private torch
  state: this module is the one place that does).
- :func:`comm_guard`: turns a failed collective into a :class:`CommunicationError` naming
  the collective, the FSDP module, the rank and the timeout.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist


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


@contextlib.contextmanager
def comm_guard(collective: str, module: str, group: dist.ProcessGroup) -> Iterator[None]:
    """Re-raise a failure inside the block as :class:`CommunicationError` with context."""
    try:
        yield
    except CommunicationError:
        raise
    except RuntimeError as err:  # DistBackendError, gloo timeouts and closed connections
        raise communication_error(collective, module, group, err) from err


def communication_error(collective: str, module: str, group: dist.ProcessGroup,
                        err: BaseException) -> BaseException:
    """The :class:`CommunicationError` for ``err`` (itself if it already is one)."""
    if isinstance(err, CommunicationError):
        return err
    timeout = group_timeout(group)
    limit = f"{timeout.total_seconds():g} s" if timeout is not None else "unknown"
    return CommunicationError(
        f"hfcompress: the {collective} of FSDP module {module or '<root>'!r} failed on "
        f"global rank {dist.get_rank()} (group of {group.size()} ranks, timeout {limit}). "
        f"A peer rank probably died or stopped calling the collective; the error from "
        f"the process group was: {type(err).__name__}: {err}")
