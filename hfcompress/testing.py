"""Helpers shared by the test suite and the benchmark scripts (and usable to test code built
on hfcompress): a tiny LLaMA built from a config (the same weights on every rank), and the
one multi-process launcher, :func:`launch` (gloo ranks as subprocesses, optionally inside
emulated nodes' network namespaces).

They live in the package because tests/ and benchmarks/ are not packages of their own and
both need them; importing this module pulls in nothing beyond torch until a helper runs
(``tiny_llama`` imports transformers)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

#: the tests' LLaMA: 2 layers, hidden 64, vocabulary 256 (no download)
TINY_LLAMA = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "max_position_embeddings": 64}


def llama(seed: int | None = 0, **config: Any):
    """The one LLaMA builder of the tests, benchmarks, demo and examples: a
    ``LlamaForCausalLM`` of ``LlamaConfig(**config)``, initialised from
    ``torch.manual_seed(seed)`` (every rank builds the same one; None: from the current
    random state, for callers that seed earlier)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**config)
    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def tiny_llama(seed: int = 0, **config: Any):
    """:func:`llama` of ``TINY_LLAMA`` updated with ``config`` (``LlamaConfig`` fields)."""
    return llama(seed, **{**TINY_LLAMA, **config})


# -- one multi-process launcher ---------------------------------------------------------------
class LaunchError(RuntimeError):
    """A launched rank raised, crashed, hung or left no result; the message holds every
    failing rank's traceback or log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(module: str, function: str, args: tuple = (), *, nodes: int = 1,
           ranks_per_node: int = 1, rank_args: bool = False, netns: Any = None,
           timeout: float = 1800.0, init_timeout: float = 900.0, env: dict | None = None,
           path: Sequence[str] = (), cwd: str | None = None,
           log_dir: Path | None = None, echo_rank0: bool = False) -> list[Any]:
    """``module.function(*args)`` on ``nodes x ranks_per_node`` gloo processes; the ranks'
    return values, in rank order.

    Every rank is a subprocess (rank ``node * ranks_per_node + local``, torchrun's
    environment variables), inside node n's network namespace when given a set-up
    ``benchmarks/netns.py`` ``Netns`` (gloo on ``nic0``), else on the loopback. ``path``:
    directories the ranks import ``module`` from. ``rank_args``: call
    ``function(rank, world_size, *args)``. Each rank's output goes to ``rank{r}.log`` in
    ``log_dir`` (default: a temporary directory), rank 0's to this console with
    ``echo_rank0`` (progress of a long run). A rank that raises, exits non-zero or hangs past
    ``timeout`` stops them all: :class:`LaunchError` with every failing rank's traceback or
    log tail. Each rank ends with ``destroy_process_group(); flush; os._exit`` (a test's own
    gloo callback destroyed at interpreter exit aborts it: ``comm/exit_drain.py``)."""
    world = nodes * ranks_per_node
    if netns is not None and netns.nodes < nodes:
        raise ValueError(f"netns has {netns.nodes} nodes, need {nodes}")
    with tempfile.TemporaryDirectory(prefix="hfc_launch_") as tmp:
        logs_at = Path(log_dir or tmp)
        logs_at.mkdir(parents=True, exist_ok=True)
        spec = Path(tmp) / "spec.pkl"
        with open(spec, "wb") as f:
            pickle.dump({"module": module, "function": function, "args": args,
                         "rank_args": rank_args, "init_timeout": init_timeout}, f)
        base = {**os.environ, **(env or {}), "WORLD_SIZE": str(world),
                "MASTER_ADDR": netns.addr(0) if netns is not None else "127.0.0.1",
                "MASTER_PORT": str(29500 if netns is not None else free_port()),
                "GLOO_SOCKET_IFNAME": "nic0" if netns is not None else "lo",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "HFC_LAUNCH_PATH": os.pathsep.join(map(str, path))}
        base.pop("LOCAL_WORLD_SIZE", None)
        procs, logs = [], []
        try:
            for rank in range(world):
                prefix = netns.exec_prefix(rank // ranks_per_node) if netns is not None else []
                log = None if echo_rank0 and rank == 0 else open(logs_at / f"rank{rank}.log", "w")
                logs.append(log)
                procs.append(subprocess.Popen(
                    [*prefix, sys.executable, "-m", __name__, str(spec),
                     str(Path(tmp) / f"rank{rank}.pkl")],
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank % ranks_per_node)},
                    stdout=log, stderr=subprocess.STDOUT if log else None, cwd=cwd))
            failed = _wait(procs, timeout)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                if log is not None:
                    log.close()
        results, errors = _collect(Path(tmp), logs_at, world)
        if failed or errors:
            raise LaunchError(f"{module}.{function} on {nodes} x {ranks_per_node} ranks failed "
                              f"({failed or 'a rank raised'}):\n" + "\n".join(errors))
        return results


def _collect(tmp: Path, logs_at: Path, world: int) -> tuple[list[Any], list[str]]:
    """The ranks' return values and, for each rank that raised or left no result, what to
    say (its traceback or its log's tail)."""
    results, errors = [], []
    for rank in range(world):
        out = tmp / f"rank{rank}.pkl"
        if out.exists():
            with open(out, "rb") as f:
                kind, value = pickle.load(f)
            if kind == "ok":
                results.append(value)
                continue
            errors.append(f"rank {rank} raised:\n{value}")
        else:
            log_path = logs_at / f"rank{rank}.log"
            tail = log_path.read_text()[-3000:] if log_path.exists() else "(on the console)"
            errors.append(f"rank {rank}: no result (killed or crashed); log tail:\n{tail}")
    return results, errors


def _wait(procs: list[subprocess.Popen], timeout: float) -> str | None:
    """Wait for every rank; the first failure (non-zero exit, timeout) or None."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if bad:
            return f"rank {bad[0]} exited with code {procs[bad[0]].returncode}"
        if time.monotonic() > deadline:
            return f"timed out after {timeout:.0f} s"
        time.sleep(0.2)
    bad = [r for r, p in enumerate(procs) if p.returncode]
    return f"rank {bad[0]} exited with code {procs[bad[0]].returncode}" if bad else None


def _exit_with(parent: int, every_s: float = 1.0) -> None:
    """End this rank when its launcher ``parent`` is gone: a launcher killed by a signal
    skips :func:`launch`'s cleanup, and its ranks would go on computing (a benchmark's
    whole job list) for no one."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)
    threading.Thread(target=watch, name="hfc-launcher-watch", daemon=True).start()


def _rank_main(spec_path: str, out_path: str) -> None:
    """One rank: init gloo from the environment, run the function, pickle its result."""
    import datetime
    import importlib
    import traceback

    import torch.distributed as dist

    _exit_with(os.getppid())
    status, result = 1, ("error", "not run")
    try:
        sys.path[:0] = [p for p in os.environ.get("HFC_LAUNCH_PATH", "").split(os.pathsep) if p]
        torch.set_num_threads(1)
        with open(spec_path, "rb") as f:
            spec = pickle.load(f)
        dist.init_process_group("gloo", timeout=datetime.timedelta(
            seconds=spec["init_timeout"]))
        fn = getattr(importlib.import_module(spec["module"]), spec["function"])
        args = spec["args"]
        if spec["rank_args"]:
            args = (dist.get_rank(), dist.get_world_size(), *args)
        result = ("ok", fn(*args))
        status = 0
    except BaseException:  # noqa: BLE001 (everything goes to the parent)
        result = ("error", traceback.format_exc())
    finally:
        try:
            with open(out_path, "wb") as f:
                pickle.dump(result, f)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
