"""Run a function on N gloo processes from pytest (torch.multiprocessing, file:// rendezvous).

``run_distributed(fn, world_size, *args)`` spawns ``fn(rank, world_size, *args)`` on every
rank and returns the ranks' return values. A rank that raises writes its traceback to a
result file and exits with code 1; the parent then stops the others and raises one
AssertionError with every rank's traceback. Every worker ends with
``destroy_process_group(); flush; os._exit`` (PLATFORM.md: the gloo exit crash).
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, fn, world_size, tmp, args):
    status, result = 1, None
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=60))
        result = ("ok", fn(rank, world_size, *args))
        status = 0
    except BaseException:  # noqa: BLE001 (report everything to the parent)
        result = ("error", traceback.format_exc())
    finally:
        try:
            with open(os.path.join(tmp, f"rank{rank}.pkl"), "wb") as f:
                pickle.dump(result, f)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


def run_distributed(fn, world_size: int, *args, timeout: float = 240.0) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` processes; their return values."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(fn, world_size, tmp, args), nprocs=world_size,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        crashed = None
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    crashed = f"timed out after {timeout:.0f} s"
                    break
        except mp.ProcessExitedException as e:  # a rank failed: join() stops the others
            crashed = str(e)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results, errors = [], []
        for rank in range(world_size):
            path = os.path.join(tmp, f"rank{rank}.pkl")
            if not os.path.exists(path):
                errors.append(f"rank {rank}: no result (killed or crashed)")
                continue
            with open(path, "rb") as f:
                kind, value = pickle.load(f)
            if kind == "error":
                errors.append(f"rank {rank} raised:\n{value}")
            results.append(value)
        if crashed or errors:
            raise AssertionError(f"distributed run of {fn.__name__} on {world_size} ranks failed"
                                 f" ({crashed or 'a rank raised'}):\n" + "\n".join(errors))
        return results
