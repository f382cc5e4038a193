"""Run a function on N gloo processes from pytest (``hfcompress.testing.launch``, the launcher
the benchmarks use too).

``run_distributed(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` on every
rank (``fn`` defined at module level, imported by the ranks) and returns the ranks' return
values. A rank that raises, crashes or hangs stops the others; the parent raises one
AssertionError with every failing rank's traceback or log tail. ``run_jobs(world_size, (fn,
*args), ...)`` runs several such functions one after another in one launch (one process
start-up, seconds of imports per rank, for all of them). Every rank ends with
``destroy_process_group(); flush; os._exit`` (gloo can abort at interpreter exit).
"""

from __future__ import annotations

import importlib
import os
import sys

from hfcompress.testing import LaunchError, launch

INIT_TIMEOUT_S = 60


def run_distributed(fn, world_size: int, *args, timeout: float = 240.0) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` processes; their return values."""
    where = os.path.dirname(os.path.abspath(sys.modules[fn.__module__].__file__))
    try:
        return launch(fn.__module__, fn.__name__, args, ranks_per_node=world_size,
                      rank_args=True, timeout=timeout, init_timeout=INIT_TIMEOUT_S,
                      path=[where])
    except LaunchError as err:
        raise AssertionError(f"distributed run of {fn.__name__} on {world_size} ranks "
                             f"failed: {err}") from None


def run_jobs(world_size: int, *jobs: tuple, timeout: float = 240.0) -> list[list]:
    """``(fn, *args)`` jobs, one after another on the same ``world_size`` processes; per job,
    the ranks' return values. ``timeout`` is for the whole launch."""
    specs = tuple((fn.__module__, fn.__name__, tuple(args)) for fn, *args in jobs)
    try:
        per_rank = run_distributed(_jobs, world_size, specs, timeout=timeout)
    except AssertionError as err:
        names = ", ".join(name for _, name, _ in specs)
        raise AssertionError(f"jobs [{names}]: {err}") from None
    return [[r[i] for r in per_rank] for i in range(len(specs))]


def _jobs(rank: int, world: int, specs: tuple) -> list:
    return [getattr(importlib.import_module(module), name)(rank, world, *args)
            for module, name, args in specs]
