"""Shared code of the multi-process benchmarks (``bench_wire_volume.py``, ``bench_slow_link.py``).

- ``launch``: runs ``module.function(payload)`` on ``nodes x ranks_per_node`` gloo processes
  through ``hfcompress.testing.launch`` (the tests' launcher too): subprocesses, inside
  their node's network namespace when given a ``Netns``, rank ``node * ranks_per_node +
  local``; returns every rank's return value. A failing or hung rank stops them all, with
  every rank's log in the error.
- ``Variant``: one way to train the model (``prefetch=True``: FSDP2 explicit prefetching,
  each decoder layer's all-gather issued asynchronously during the previous layer's forward /
  the next layer's backward): plain FSDP2 (``fsdp2``: bf16 parameters, fp32
  reduction; ``fsdp2_bf16_reduce``), an hfcompress FSDP preset (``hfcompress.apply``), or DDP
  (``ddp``, ``ddp_fp16``: torch's ``fp16_compress_hook``, ``ddp_powersgd``: torch's
  ``powerSGD_hook``, and the hfcompress all-reduce presets ``global_qsgd`` /
  ``global_qsgd_exp``). DDP computes under bf16 autocast, like FSDP's bf16 parameters.
  Every variant steps AdamW's fused kernel.
- ``set_compute``: how every rank computes (``cpu_compute.py``: bf16 natively, or bf16 on
  the wire with fp32 matmuls where this CPU only emulates bf16), passed to the workers.
- ``run_info`` / ``write_meta`` / ``write_csv`` / ``markdown_table``: results files (with the
  CPU's bf16 flags, its bf16 / fp32 GEMM throughput and the compute mode).
"""

from __future__ import annotations

import csv
import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import cpu_compute

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
COMPUTE_ENV, COMPUTE_INFO_ENV = "HFC_BENCH_COMPUTE", "HFC_BENCH_COMPUTE_INFO"



def _presets() -> tuple[list[str], list[str]]:
    """hfcompress's presets: those FSDP2 runs ("none" included), those only DDP runs."""
    from hfcompress.config import get_config, list_presets

    ddp = [p for p in list_presets() if get_config(p).all_reduce is not None
           and not get_config(p).compresses_fsdp]
    return [p for p in list_presets() if p not in ddp], ddp


FSDP_PRESETS, DDP_PRESETS = _presets()
AUTO = ["auto"]            # comm_compressor="auto": chosen per collective at start
FSDP_PEERS = ["fsdp2", "fsdp2_bf16_reduce"]
DDP_PEERS = ["ddp", "ddp_fp16", "ddp_powersgd"]


# -- model and data -------------------------------------------------------------------------
def llama(dims: dict, seed: int = 0):
    """A ``LlamaForCausalLM`` from ``dims`` (hidden, intermediate, layers, heads, vocab, seq);
    the same initial weights on every rank."""
    from hfcompress.testing import llama as build

    return build(seed, vocab_size=dims["vocab"], hidden_size=dims["hidden"],
                 intermediate_size=dims["intermediate"], num_hidden_layers=dims["layers"],
                 num_attention_heads=dims["heads"], num_key_value_heads=dims["heads"],
                 max_position_embeddings=dims["seq"], tie_word_embeddings=False)


def describe(dims: dict) -> str:
    return (f"LLaMA hidden {dims['hidden']}, intermediate {dims['intermediate']}, "
            f"{dims['layers']} layers, {dims['heads']} heads, vocab {dims['vocab']}, "
            f"batch {dims['batch']} x {dims['seq']} tokens per rank")


def batch(step: int, rank: int, dims: dict):
    """This rank's batch at ``step``: arithmetic sequences ``(a + b t) mod vocab``."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    n, length, vocab = dims["batch"], dims["seq"], dims["vocab"]
    a = torch.randint(0, vocab, (n, 1), generator=g)
    b = torch.tensor([1, 2, 3, 5, 7])[torch.randint(0, 5, (n, 1), generator=g)]
    return (a + b * torch.arange(length)) % vocab


# -- the ways to train ----------------------------------------------------------------------
def known_variants() -> list[str]:
    return FSDP_PEERS + FSDP_PRESETS + AUTO + DDP_PEERS + DDP_PRESETS


class Variant:
    """One model trained one way (see the module docstring). ``step(i)`` runs forward,
    backward and the optimizer step on this rank's batch ``i``; it returns the hfcompress wire
    meter's closed step (a dict) or None for torch's own collectives."""

    def __init__(self, name: str, dims: dict, ranks_per_node: int, *, metered_ddp: bool = False,
                 powersgd_rank: int = 4, lr: float = 1e-3, prefetch: bool = False) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.nn.parallel import DistributedDataParallel as DDP

        import hfcompress
        from hfcompress.integrations import shard_model

        if name not in known_variants():
            raise ValueError(f"unknown variant {name!r}; known: {', '.join(known_variants())}")
        cpu_compute.install(os.environ.get(COMPUTE_ENV, "bf16"))
        self.name, self.dims, self.rank = name, dims, dist.get_rank()
        self.model = llama(dims)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.handle = None
        self.ddp = name in DDP_PEERS + DDP_PRESETS
        bf16, fp32 = torch.bfloat16, torch.float32
        if name in FSDP_PEERS:
            reduce = bf16 if name == "fsdp2_bf16_reduce" else fp32
            shard_model(self.model, ranks_per_node, False,
                        mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=reduce))
            self.net = self.model
        elif name in FSDP_PRESETS + AUTO:
            self.handle = hfcompress.apply(
                self.model, name, ranks_per_node=ranks_per_node, shard=True,
                mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))
            self.net = self.model
        else:
            self.net = DDP(self.model)
            if name in DDP_PRESETS or (name == "ddp" and metered_ddp):
                self.handle = hfcompress.apply(self.net, "none" if name == "ddp" else name,
                                               ranks_per_node=ranks_per_node)
            elif name == "ddp_fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                self.net.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif name == "ddp_powersgd":
                from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
                state = ps.PowerSGDState(process_group=None,
                                         matrix_approximation_rank=powersgd_rank,
                                         start_powerSGD_iter=2)
                self.net.register_comm_hook(state, serialized_powersgd_hook)
        # fused: one vectorized pass over all parameters, as on a GPU (its default there is
        # foreach); CPU's default loops over the tensors, a cost the same for every variant
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, fused=True)
        self.layers = list(self.model.model.layers) if prefetch and not self.ddp else []
        for a, b in zip(self.layers, self.layers[1:]):     # FSDP2 explicit prefetching
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])

    def step(self, i: int) -> dict | None:
        import torch

        ids = batch(i, self.rank, self.dims)
        if self.layers:
            self.layers[0].unshard(async_op=True)   # the first layer's gather overlaps embedding
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.ddp):
            loss = self.net(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return self.handle.step() if self.handle is not None else None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()


def serialized_powersgd_hook(state, bucket):
    """torch's ``powerSGD_hook``, each bucket's chain finished before the next bucket's hook:
    the hook issues its all-reduces from future callbacks, whose order across buckets differs
    between ranks, and gloo needs every rank to issue collectives in the same order (else:
    "Received data size doesn't match expected size")."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    out = ps.powerSGD_hook(state, bucket).wait()
    fut = torch.futures.Future()
    fut.set_result(out)
    return fut


def layer_params(model) -> int:
    """Parameters inside the decoder layers (FSDP re-gathers only these in backward)."""
    return sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)


# -- launching ------------------------------------------------------------------------------
def launch(module: str, function: str, payload: Any, nodes: int, ranks_per_node: int,
           netns=None, timeout: float = 1800.0, env: dict | None = None,
           log_dir: Path | None = None, echo_rank0: bool = False) -> list[Any]:
    """``module.function(payload)`` on every rank (module imported from ``benchmarks/``),
    through ``hfcompress.testing.launch``; returns the ranks' return values. ``netns``: a
    set-up ``netns.Netns`` (node n's ranks run in its namespace n); else the loopback.
    Kernels are compiled (``HFCOMPRESS_COMPILE=1``) unless the environment says otherwise."""
    from hfcompress.testing import launch as launch_ranks

    env = {"HFCOMPRESS_COMPILE": os.environ.get("HFCOMPRESS_COMPILE", "1"),
           "HFC_BENCH_RANKS_PER_NODE": str(ranks_per_node),
           COMPUTE_ENV: os.environ.get(COMPUTE_ENV, "bf16"), **(env or {})}
    return launch_ranks(module, function, (payload,), nodes=nodes,
                        ranks_per_node=ranks_per_node, netns=netns, timeout=timeout,
                        init_timeout=900.0, env=env, path=[str(HERE)], cwd=str(HERE),
                        log_dir=log_dir, echo_rank0=echo_rank0)


def ranks_per_node() -> int:
    """Inside a worker: the emulated node size ``launch`` was given."""
    return int(os.environ["HFC_BENCH_RANKS_PER_NODE"])


# -- results files --------------------------------------------------------------------------
def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} CPUs)"
    except OSError:
        return "unknown"


def machine() -> str:
    """CPU model, core count and platform of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {platform.platform()}"


def set_compute(mode: str) -> str:
    """Resolve ``mode`` (``cpu_compute.MODES``; ``auto`` measures this CPU) for this run and
    the workers ``launch`` starts; prints and returns its one-line description."""
    resolved, measured = cpu_compute.choose(mode)
    os.environ[COMPUTE_ENV] = resolved
    os.environ[COMPUTE_INFO_ENV] = cpu_compute.describe(resolved, measured)
    print(f"compute: {os.environ[COMPUTE_INFO_ENV]}", flush=True)
    return os.environ[COMPUTE_INFO_ENV]


def run_info(command: str, model: str, settings: str) -> dict[str, str]:
    """Machine (CPU flags and GEMM throughput too), versions, date, command, compute mode
    (BENCHMARKS.md shows them with every result)."""
    import torch
    import transformers

    import hfcompress

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hfcompress"], cwd=HERE,
                               capture_output=True, text=True).stdout.strip()
        commit = commit + (" (hfcompress/ modified)" if dirty else "")
    except OSError:
        commit = "unknown"
    return {"command": command, "model": model, "settings": settings,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "machine": machine(),
            "compute": os.environ.get(COMPUTE_INFO_ENV) or
            cpu_compute.describe("bf16", cpu_compute.probe()),
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
                        f"transformers {transformers.__version__}, "
                        f"hfcompress {hfcompress.__version__} (git {commit or 'unknown'})",
            "load_average_start": load_average()}


def write_meta(path: Path, info: dict[str, str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["key", "value"])
        w.writeheader()
        w.writerows({"key": k, "value": v} for k, v in info.items())


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def plot_per_topology(rows: list[dict], height: float):
    """A matplotlib (Agg) figure with one axis per ``topology`` of ``rows``:
    ``(plt, fig, [(topology, axis), ..])``, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    topos = sorted({r["topology"] for r in rows})
    fig, axes = plt.subplots(1, len(topos), figsize=(7 * len(topos), height), squeeze=False)
    return plt, fig, list(zip(topos, axes[0]))


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def info_block(info: dict[str, str]) -> str:
    return "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in info.items())

