"""The links file of ``hfcompress probe``: the effective bandwidths of a job's real
data-parallel groups at its model's message sizes and this device's codec rates, measured
once (``auto/cluster_probe.py``), read by ``hfcompress plan --links FILE`` (as
:class:`~hfcompress.cost.links.ClusterLinks` and codec rates) and by ``auto``
(``auto/links_file.py``: its probe then skips those primitives).

One JSON object, ``version`` 1:

- ``layout``: where it was measured (``nodes``, ``gpus_per_node``, ``tp``, ``dp``, x =
  ``dp_per_node``, y = ``dp_nodes``, k = ``groups_per_node``: ``cost/cluster.py``);
- ``fits``: per ``primitive@group`` (group: the DP group ``world``, its ``intra`` / ``inter``
  node subgroups, or ``node``: all ranks of a node, measured for the intra-node bandwidth
  when the DP group has no intra-node traffic) ``latency_us`` and ``MB_per_s`` (send buffer
  bytes per second, as ``auto/probe.ProbedLinks``), the ``sizes_bytes`` and ``seconds`` they
  were fitted to, ``steps`` (latency steps) and, per node, ``node_link_gbps`` /
  ``gpu_intra_gbps``: what a node's network link / a GPU's intra-node link carried per
  second (``cost/link_bytes.py``);
- ``inter_node_gbps`` / ``intra_node_gbps`` (null: nothing on this layout crosses nodes /
  stays in a node) and ``inter_latency_us`` / ``intra_latency_us`` per latency step: the
  fields of ``ClusterLinks``;
- ``codec_rates``: per rate key (``cost/codec_rates.rate_key``) ``compress_values_per_s``,
  ``decompress_values_per_s``, the ``values`` timed and their ``dtype``;
- ``device``, ``torch``, ``probe_s`` (seconds the probe took), ``model``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from .links import ClusterLinks

VERSION = 1
KEYS = ("version", "layout", "fits", "inter_node_gbps", "intra_node_gbps", "inter_latency_us",
        "intra_latency_us", "codec_rates", "device", "torch", "probe_s", "model")
LAYOUT_KEYS = ("nodes", "gpus_per_node", "tp", "dp", "dp_per_node", "dp_nodes",
               "groups_per_node")
FIT_KEYS = ("latency_us", "MB_per_s", "sizes_bytes", "seconds", "steps")
CODEC_KEYS = ("compress_values_per_s", "decompress_values_per_s", "values", "dtype")


class LinksFileError(ValueError):
    """A links file that cannot be used (the message names the file and what is wrong)."""


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def validate(data: Any, source: str = "links file") -> dict[str, Any]:
    """``data`` if it is a version-1 links file (module doc), else LinksFileError naming
    the first missing key or wrong value."""
    def fail(what: str) -> LinksFileError:
        return LinksFileError(f"{source}: {what}; write it again with `hfcompress probe --out "
                              f"FILE` (under torchrun) on the cluster it describes")

    if not isinstance(data, dict):
        raise fail(f"not a JSON object but {type(data).__name__}")
    if data.get("version") != VERSION:
        raise fail(f"version {data.get('version')!r}, this hfcompress reads version {VERSION}")
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise fail(f"no key {missing[0]!r}")
    if not isinstance(data["layout"], dict):
        raise fail("layout is not a JSON object")
    missing = [k for k in LAYOUT_KEYS if k not in data["layout"]]
    if missing:
        raise fail(f"no key layout.{missing[0]!r}")
    if not all(isinstance(v, int) and v >= 1 for v in data["layout"].values()):
        raise fail(f"layout {data['layout']} holds a value that is not an int >= 1")
    for key in ("inter_node_gbps", "intra_node_gbps"):
        if data[key] is not None and not _positive(data[key]):
            raise fail(f"{key}={data[key]!r} must be > 0 Gbit/s or null")
    for key in ("inter_latency_us", "intra_latency_us"):
        if data[key] is not None and not (_positive(data[key]) or data[key] == 0):
            raise fail(f"{key}={data[key]!r} must be >= 0 or null")
    for kind, table, keys in (("fits", data["fits"], FIT_KEYS),
                              ("codec_rates", data["codec_rates"], CODEC_KEYS)):
        if not isinstance(table, dict):
            raise fail(f"{kind} is not a JSON object")
        for name, entry in table.items():
            missing = [k for k in keys if not isinstance(entry, dict) or k not in entry]
            if missing:
                raise fail(f"no key {kind}.{name}.{missing[0]!r}")
    for name, fit in data["fits"].items():
        if not _positive(fit["MB_per_s"]) or not (fit["latency_us"] == 0
                                                  or _positive(fit["latency_us"])):
            raise fail(f"fits.{name}: latency_us={fit['latency_us']!r} must be >= 0 and "
                       f"MB_per_s={fit['MB_per_s']!r} > 0")
    for name, rate in data["codec_rates"].items():
        for key in ("compress_values_per_s", "decompress_values_per_s"):
            if not _positive(rate[key]):
                raise fail(f"codec_rates.{name}.{key}={rate[key]!r} must be > 0")
    return data


def load(path: str) -> dict[str, Any]:
    """The validated links file at ``path``."""
    try:
        with open(os.path.expanduser(path)) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise LinksFileError(f"cannot read the links file {path!r}: {e}") from e
    return validate(data, f"links file {path!r}")


def save(data: dict[str, Any], path: str) -> None:
    validate(data, "the probe's result")
    with open(os.path.expanduser(path), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def describe_layout(data: dict[str, Any]) -> str:
    """``"2 nodes x 2 GPUs, tp 2 (dp 2: 1 per node x 2 nodes, 2 groups per node)"``."""
    lay = data["layout"]
    return (f"{lay['nodes']} nodes x {lay['gpus_per_node']} GPUs, tp {lay['tp']} (dp "
            f"{lay['dp']}: {lay['dp_per_node']} per node x {lay['dp_nodes']} nodes, "
            f"{lay['groups_per_node']} groups per node)")


def cluster_links(data: dict[str, Any], fallback: ClusterLinks, *,
                  inter_node_gbps: float | None = None,
                  intra_node_gbps: float | None = None) -> ClusterLinks:
    """The file's bandwidths and latencies as :class:`ClusterLinks` (bandwidths are per node
    link / per GPU, so they serve any layout); an explicit ``inter_node_gbps`` /
    ``intra_node_gbps`` wins, and ``fallback`` fills what the file left null."""
    def pick(flag: float | None, key: str) -> float:
        if flag is not None:
            return flag
        return data[key] if data[key] is not None else getattr(fallback, key)

    return ClusterLinks(pick(inter_node_gbps, "inter_node_gbps"),
                        pick(intra_node_gbps, "intra_node_gbps"),
                        pick(None, "inter_latency_us"), pick(None, "intra_latency_us"))


def codec_rates(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Rate key -> (compress, decompress) values/s measured on the probe's device."""
    return {k: (r["compress_values_per_s"], r["decompress_values_per_s"])
            for k, r in data["codec_rates"].items()}
