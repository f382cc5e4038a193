"""Run a function on N gloo processes from pytest (``hfcompress.testing.launch``, the launcher
the benchmarks use too).

``run_distributed(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` on every
rank (``fn`` defined at module level, imported by the ranks) and returns the ranks' return
values. A rank that raises, crashes or hangs stops the others; the parent raises one
AssertionError with every failing rank's traceback or log tail. Every rank ends with
``destroy_process_group(); flush; os._exit`` (gloo can abort at interpreter exit).
"""

from __future__ import annotations

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
