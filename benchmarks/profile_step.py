"""Where a preset's training step spends its CPU time: the slow-link benchmark's model, one
variant, unthrottled loopback, ``cProfile`` on rank 0 over the timed steps.

    python benchmarks/profile_step.py --variant sdp4bit --topology 2x1

Prints the median step time of every rank and rank 0's functions sorted by own time
(``--sort cumulative`` for inclusive time); ``--out`` also saves the ``pstats`` file.
``--ops`` profiles torch operators instead (``torch.profiler``, self CPU time: the eager tensor
ops that ``cProfile`` folds into their Python caller).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _dist_common as dc  # noqa: E402
import cpu_compute  # noqa: E402
from bench_slow_link import DIMS  # noqa: E402


def worker(payload: dict) -> dict:
    import torch.distributed as dist

    variant = dc.Variant(payload["variant"], DIMS, dc.ranks_per_node())
    times = []
    rank0 = dist.get_rank() == 0
    ops = payload["ops"] and rank0
    prof = _OpProfile() if ops else cProfile.Profile()
    for i in range(payload["warmup"] + payload["steps"]):
        timed = i >= payload["warmup"]
        dist.barrier()
        t0 = time.perf_counter()
        if timed and rank0:
            prof.enable()
        variant.step(i)
        prof.disable()
        if timed:
            times.append(time.perf_counter() - t0)
    variant.close()
    out = {"median": statistics.median(times)}
    if ops:
        out["profile"] = prof.table(payload["top"])
    elif rank0:
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        if payload["out"]:
            stats.dump_stats(payload["out"])
        stats.sort_stats(payload["sort"]).print_stats(payload["top"])
        out["profile"] = text.getvalue()
    return out


class _OpProfile:
    """``torch.profiler`` behind ``cProfile``'s enable / disable: started at the first timed
    step and left running (the timed steps follow each other; between them run only the
    barriers)."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU])
        self.started = False

    def enable(self) -> None:
        if not self.started:
            self.prof.start()
            self.started = True

    def disable(self) -> None:
        """Keeps recording (see the class docstring)."""

    def table(self, top: int) -> str:
        self.prof.stop()
        rows = sorted(self.prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
        lines = [f"{'self ms':>9} {'calls':>6}  operator"]
        lines += [f"{e.self_cpu_time_total / 1e3:9.1f} {e.count:6d}  {e.key[:90]}" for e in rows]
        return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="sdp4bit", choices=dc.known_variants())
    ap.add_argument("--topology", default="2x1", help="nodes x ranks per node")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default="", help="also write rank 0's pstats file here")
    ap.add_argument("--ops", action="store_true",
                    help="torch operators' self CPU time (torch.profiler) instead of cProfile")
    ap.add_argument("--compute", default="auto", choices=cpu_compute.MODES,
                    help="as bench_slow_link.py (benchmarks/cpu_compute.py)")
    args = ap.parse_args()
    dc.set_compute(args.compute)
    nodes, per_node = (int(v) for v in args.topology.split("x"))
    payload = {"variant": args.variant, "warmup": args.warmup, "steps": args.steps,
               "sort": args.sort, "top": args.top, "out": args.out, "ops": args.ops}
    results = dc.launch("profile_step", "worker", payload, nodes, per_node)
    print(f"{args.variant} {args.topology}: median step (s) per rank: "
          + ", ".join(f"{r['median']:.3f}" for r in results))
    print(next(r["profile"] for r in results if "profile" in r))


if __name__ == "__main__":
    main()
