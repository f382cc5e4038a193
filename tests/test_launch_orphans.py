"""``hfcompress.testing.launch``'s ranks end with their launcher: a launcher killed by a
signal (``pkill`` of a benchmark) skips its own cleanup, and its ranks went on running a
benchmark's whole job list in the background, for no one."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAUNCHER = """
import sys, time
from hfcompress.testing import launch
launch("test_launch_orphans", "sleeper", (sys.argv[1],), ranks_per_node=2,
       path=[sys.argv[2]])
"""


def sleeper(folder: str) -> None:
    """A rank: note its pid, then work long past the test."""
    import torch.distributed as dist

    Path(folder, f"pid{dist.get_rank()}").write_text(str(os.getpid()))
    time.sleep(120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in \
        Path(f"/proc/{pid}/status").read_text().lower()


def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), str(Path(__file__).parent)],
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("pid*"))) < 2:
        assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("pid*"))]
    assert all(alive(p) for p in pids)
    launcher.send_signal(signal.SIGTERM)      # no cleanup in the launcher: a signal's default
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), "ranks outlived their launcher"
