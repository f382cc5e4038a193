"""Callbacks chained to futures are counted until destroyed, and drained at exit
(``comm/exit_drain.py``): the SIGABRT after a finished gloo run came from gloo's worker
thread destroying a Python callback while the interpreter finalized."""

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dist_utils import run_distributed
from hfcompress.comm import exit_drain
from hfcompress.comm.futures import chain, finish

ROOT = Path(__file__).resolve().parents[1]


def settles_to(count: int, timeout: float = 2.0) -> bool:
    """The live count comes back to ``count`` (other tests of this process may have left
    callbacks of their own, which ``drain`` would wait for too)."""
    deadline = time.monotonic() + timeout
    while exit_drain.live() > count and time.monotonic() < deadline:
        time.sleep(0.001)
    return exit_drain.live() == count


def test_a_callback_counts_until_destroyed():
    start = exit_drain.live()
    fut = torch.futures.Future()
    out = exit_drain.add_callback(fut, lambda f: f.value() + 1)
    assert exit_drain.live() == start + 1
    assert not exit_drain.drain(0.01)               # pending: the exit would wait (bounded)
    fut.set_result(1)
    assert out.wait() == 2
    del fut, out
    assert settles_to(start)


def test_chained_stages_leave_nothing_behind():
    """``chain`` with a stage that launches the next future: both callbacks of the chain are
    gone once the result is collected."""
    start = exit_drain.live()
    first, second = torch.futures.Future(), torch.futures.Future()
    out = chain(first, lambda v, nxt=second: nxt)
    first.set_result(0)
    second.set_result(7)
    assert out.wait() == 7
    del first, second, out
    assert settles_to(start)


def _worker(rank, world, tmp):
    """Real gloo work: a CPU collective ending with a chained decode, as hfcompress runs
    one; gloo's thread runs and destroys the callback."""
    t = torch.full((1000,), float(rank))
    start = exit_drain.live()
    done = []
    fut = finish(dist.all_reduce(t, async_op=True), lambda: done.append(t.sum().item()), True,
                 t.device)
    fut.wait()
    del fut
    drained = exit_drain.drain(5.0)
    return {"done": done, "drained": drained, "left": exit_drain.live() - start}


def test_gloo_thread_destroys_the_callback_before_exit(tmp_path):
    for r in run_distributed(_worker, 2, str(tmp_path)):
        assert r["done"] == [1000.0] and r["drained"] and r["left"] == 0


SLOW_EXIT = """
import sys, time, torch, torch.distributed as dist
from hfcompress.comm.exit_drain import add_callback

mode, rank, init = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class SlowDel:
    def __del__(self):
        time.sleep(0.5)     # on gloo's thread, the GIL released, while the main thread exits

dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
if rank == 1:                                              # joins late: rank 0's is pending
    time.sleep(1.0)
    dist.all_reduce(torch.ones(10))
    sys.exit(0)
fut = dist.all_reduce(torch.ones(10), async_op=True).get_future()
if fut.done():
    print("not pending"); sys.exit(0)                      # the race was not set up
keep = SlowDel()
cb = lambda f, keep=keep: None                             # noqa: E731
out = fut.then(cb) if mode == "raw" else add_callback(fut, cb)
del keep, cb
out.wait()
print("trained", flush=True)                               # the script's work is done
"""


def _exit(tmp_path, mode: str) -> subprocess.CompletedProcess:
    """The script above as rank 0 of two; rank 1 joins its all-reduce a second late, so the
    callback is always chained while the all-reduce is pending."""
    script, init = tmp_path / "slow_exit.py", tmp_path / f"init_{mode}"
    script.write_text(SLOW_EXIT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    late = subprocess.Popen([sys.executable, str(script), mode, "1", str(init)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = subprocess.run([sys.executable, str(script), mode, "0", str(init)],
                              capture_output=True, text=True, timeout=120, env=env)
    finally:     # rank 1 is done once rank 0 is; stopped if rank 0 failed before it joined
        try:
            late.wait(timeout=30)
        except subprocess.TimeoutExpired:
            late.kill()
            late.wait()
    assert "not pending" not in proc.stdout, "rank 1 joined before rank 0 chained"
    return proc


def test_an_exit_while_gloo_destroys_a_callback_is_clean(tmp_path):
    """gloo's thread destroys the callback slowly (its closure's ``__del__`` sleeps) while
    the script ends: chained with ``Future.then`` the process aborts after its work
    ("terminate called without an active exception"); through ``add_callback`` the exit
    waits for it and is clean."""
    proc = _exit(tmp_path, "counted")
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
    if sys.version_info < (3, 14):      # 3.14 hangs such a thread instead of ending it
        raw = _exit(tmp_path, "raw")
        assert "trained" in raw.stdout and raw.returncode != 0, raw.returncode
        assert "terminate called without an active exception" in raw.stderr, raw.stderr[-2000:]
