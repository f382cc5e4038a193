"""A dead or stalled rank makes the others raise a clear CommunicationError naming the process
group's timeout, instead of hanging (2 gloo processes, FSDP on a 3 s group; a hang fails at
the launcher's 90 s; no duration is asserted: a loaded machine only makes it later)."""

import pytest

from dist_utils import run_distributed
from fsdp_workers import failure_worker

TIMEOUT_S = 3


def test_stalled_rank_raises_naming_the_timeout():
    results = run_distributed(failure_worker, 2, "stall", TIMEOUT_S, timeout=90)
    r0 = results[0]
    print(f"rank 0 after {r0['seconds']:.2f} s: {r0['error']}")
    assert "Timed out" in r0["error"] or "timeout" in r0["error"].lower(), r0["error"]


def test_dead_rank_raises_naming_the_timeout():
    # rank 1 exits without writing a result: the harness reports it as missing; rank 0 ran its
    # own checks (error type, message, time) and returned, so it is not among the failures
    with pytest.raises(AssertionError) as info:
        run_distributed(failure_worker, 2, "dead", TIMEOUT_S, timeout=90)
    msg = str(info.value)
    assert "rank 1: no result" in msg, msg
    assert "rank 0" not in msg, msg
