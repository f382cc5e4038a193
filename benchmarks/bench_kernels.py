"""CPU throughput and accuracy of every registered compressor (and int4 / int8 group 128).

    python benchmarks/bench_kernels.py [--size-mib 64] [--threads 1] [--repeats 7]

For each scheme: compress and decompress throughput in GiB/s of the float32 input (median of
``--repeats`` timed calls after a warm-up; stateful schemes such as ``qwd`` first see the
tensor one optimizer step earlier), relative error ||x - x^|| / ||x||, and bits per value on the wire.
``x.clone()`` is the reference: its own row, and timed again interleaved with every row's
calls for that row's x-clone ratios (fair on a machine shared with other jobs). The CPU
kernels run as ``dispatch.pick`` chooses (compiled by default; the ``eager`` row sets
``HFCOMPRESS_COMPILE=0``). Prints a table, writes ``benchmarks/results/kernels.csv`` and
says whether the int4-g128 target is met (compress >= 1x and decompress >= 0.7x the speed
of ``clone``).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import hfcompress
from _dist_common import run_info, write_meta
from hfcompress import get_compressor

RESULTS = Path(__file__).resolve().parent / "results" / "kernels.csv"
TARGET = {"quantize": 1.0, "dequantize": 0.7}  # int4 g128 nearest, as a multiple of clone
FIELDS = ["scheme", "params", "quantize_gibs", "dequantize_gibs", "quantize_x_clone",
          "dequantize_x_clone", "rel_error", "bits_per_value", "note"]


def fix_mmap_threshold(nbytes: int) -> bool:
    """glibc only: serve every allocation >= ``nbytes`` with a fresh mmap (page faults
    included), instead of a dynamic threshold that sometimes reuses touched heap memory and
    makes a 64 MiB output several times cheaper at random."""
    try:
        return ctypes.CDLL("libc.so.6").mallopt(-3, nbytes) == 1  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        return False


def median_seconds(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Median wall time of each function, calls interleaved (fair on a shared machine)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def bench_compressor(label: str, make: Callable[[], hfcompress.Compressor], x: torch.Tensor,
                     repeats: int, gib: float) -> dict[str, Any]:
    """One row. A stateful scheme first sees ``prior``, x minus one optimizer step's drift
    (1e-3 relative), as in training: qwd then sends the difference, LoCo carries an error.
    Its timed compresses alternate between x and ``prior`` so that qwd's "unchanged input"
    shortcut never hides the real work."""
    c = make()
    prior = x - 1e-3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    if c.stateful:
        c.decompress(c.compress(prior))
    c.compress(x)  # warm-up (compilation)
    packed = c.compress(x)
    y = c.decompress(packed).float()
    err = float(torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(x))
    inputs = [x, prior] if c.stateful else [x]
    calls = iter(range(1 << 62))

    def compress() -> Any:
        return c.compress(inputs[next(calls) % len(inputs)])

    q_time, dq_time, clone_time = median_seconds(
        [compress, lambda: c.decompress(packed), lambda: x.clone()], repeats)
    params = " ".join(f"{k}={v}" for k, v in sorted(c.config().items()) if k != "name")
    return {"scheme": label, "params": params, "quantize_gibs": gib / q_time,
            "dequantize_gibs": gib / dq_time, "quantize_x_clone": clone_time / q_time,
            "dequantize_x_clone": clone_time / dq_time, "rel_error": err,
            "bits_per_value": c.wire_bits(x.numel()) / x.numel(), "note": ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=float, default=64.0, help="float32 input size")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per measurement")
    ap.add_argument("--out", type=Path, default=RESULTS, help="CSV output path")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    fixed = fix_mmap_threshold(32 << 20)
    numel = int(args.size_mib * 2**20) // 4
    gib = numel * 4 / 2**30
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    print(f"hfcompress {hfcompress.__version__}, torch {torch.__version__}, {args.threads} "
          f"thread(s), {args.size_mib:g} MiB float32 ({numel} values), median of "
          f"{args.repeats}; HFCOMPRESS_COMPILE={os.environ.get('HFCOMPRESS_COMPILE', '1')}; "
          f"{'fresh mmap for allocations >= 32 MiB' if fixed else 'default malloc'}")

    x.clone()
    clone_gibs = gib / median_seconds([lambda: x.clone()], args.repeats)[0]
    rows = [{"scheme": "clone", "params": "x.clone()", "quantize_gibs": clone_gibs,
             "dequantize_gibs": clone_gibs, "quantize_x_clone": 1.0, "dequantize_x_clone": 1.0,
             "rel_error": 0.0, "bits_per_value": 32.0, "note": "reference"}]

    explicit = [(f"int{b} g128 {r}", dict(bits=b, group_size=128, rounding=r))
                for b in (4, 8) for r in ("nearest", "stochastic")]
    cases = [(label, (lambda p=p: get_compressor("int", **p))) for label, p in explicit]
    cases += [(name, (lambda n=name: get_compressor(n))) for name in hfcompress.list_compressors()]
    for label, make in cases:
        try:
            rows.append(bench_compressor(label, make, x, args.repeats, gib))
        except Exception as err:  # noqa: BLE001 (a scheme that cannot run is reported, not fatal)
            print(f"skip {label}: {type(err).__name__}: {err}")
            rows.append({"scheme": label, "note": f"skipped: {type(err).__name__}: {err}"})

    saved = os.environ.get("HFCOMPRESS_COMPILE")
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    row = bench_compressor("int4 g128 nearest", lambda: get_compressor("int", bits=4),
                           x, args.repeats, gib)
    row["note"] = "eager (HFCOMPRESS_COMPILE=0)"
    rows.append(row)
    if saved is None:
        del os.environ["HFCOMPRESS_COMPILE"]
    else:
        os.environ["HFCOMPRESS_COMPILE"] = saved

    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"wrote {args.out}")
    info = run_info(" ".join(["python benchmarks/bench_kernels.py", *sys.argv[1:]]),
                    f"{args.size_mib:g} MiB float32 tensor (randn)",
                    f"{args.threads} thread(s), median of {args.repeats}, "
                    f"HFCOMPRESS_COMPILE={os.environ.get('HFCOMPRESS_COMPILE', '1')}")
    write_meta(args.out.with_name(args.out.stem + "_meta.csv"), info)

    int4 = next(r for r in rows if r["scheme"] == "int4 g128 nearest" and not r["note"])
    met = {k: int4[f"{k}_x_clone"] >= v for k, v in TARGET.items()}
    print("int4-g128 target (compress >= 1.0x clone, decompress >= 0.7x clone): "
          + ("MET" if all(met.values()) else "NOT MET")
          + f" (compress {int4['quantize_x_clone']:.2f}x, "
          f"decompress {int4['dequantize_x_clone']:.2f}x)")


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'scheme':<20} {'compress':>9} {'decomp':>9} {'c/clone':>8} {'d/clone':>8} " \
           f"{'rel.err':>9} {'bits/val':>8}  params / note"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "quantize_gibs" not in r:
            print(f"{r['scheme']:<20} {r['note']}")
            continue
        print(f"{r['scheme']:<20} {r['quantize_gibs']:>9.2f} {r['dequantize_gibs']:>9.2f} "
              f"{r['quantize_x_clone']:>8.2f} {r['dequantize_x_clone']:>8.2f} "
              f"{r['rel_error']:>9.2e} {r['bits_per_value']:>8.3f}  "
              f"{r['params']}{'  [' + r['note'] + ']' if r['note'] else ''}")
    print("(compress / decomp: GiB/s of float32 input; c/clone, d/clone: x the speed of a clone "
          "timed interleaved with the row)")


if __name__ == "__main__":
    main()
