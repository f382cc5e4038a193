"""Every rank must compress the same way: compare the settings of all ranks once, at
``apply`` time, and name what differs (a mismatch would otherwise hang or corrupt a
collective: payload sizes and process groups depend on it)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..compressors.base import Compressor

ERROR = "__error__"


def plain(value: Any) -> Any:
    """A picklable, ``==``-comparable form of a setting (compressors by their config)."""
    if isinstance(value, Compressor):
        return plain(value.config())
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (empty dicts kept as values)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def differences(per_rank: list[dict[str, Any]], labels: list[str] | None = None) -> list[str]:
    """One line per flattened key whose value is not the same on every rank (``labels``
    name the dicts; default ``rank 0``, ``rank 1``, ...)."""
    flat = [flatten(plain(s)) for s in per_rank]
    labels = labels or [f"rank {r}" for r in range(len(flat))]
    missing = object()
    lines = []
    for key in sorted(set().union(*flat)):
        values = [s.get(key, missing) for s in flat]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{label}: {'<missing>' if v is missing else repr(v)}"
                              for label, v in zip(labels, values))
            lines.append(f"  {key}: {shown}")
    return lines


def check_same_settings(settings: dict[str, Any] | BaseException,
                        group: dist.ProcessGroup | None = None,
                        what: str = "hfcompress.apply") -> None:
    """Raise ValueError on every rank if ``settings`` differ between the ranks of ``group``,
    naming each differing key with every rank's value. A rank that could not build its
    settings passes its exception instead: every rank then raises, naming it (instead of
    the others waiting for that rank until the timeout)."""
    mine = {ERROR: f"{type(settings).__name__}: {settings}"} \
        if isinstance(settings, BaseException) else plain(settings)
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    failed = [f"  rank {r}: {s[ERROR]}" for r, s in enumerate(everyone) if ERROR in s]
    if failed:
        raise ValueError(f"{what} failed on some ranks:\n" + "\n".join(failed))
    lines = differences(everyone)
    if lines:
        raise ValueError(f"{what}: the compression settings differ across ranks (every rank "
                         f"must pass the same configuration):\n" + "\n".join(lines))
