"""``benchmarks/gpu_check.py --device cpu --quick`` (the GPU check's dry run) runs to the end:
exit status 0, one CSV row per check and the overall summary row last."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"),
                           "--device", "cpu", "--quick", "--out", str(tmp_path)],
                          env={**os.environ, "HFCOMPRESS_COMPILE": "0"}, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "gpu_check.csv") as f:
        rows = list(csv.DictReader(f))
    parts = {r["part"] for r in rows}
    assert {"kernels", "steps", "correctness", "summary"} <= parts
    assert rows[-1]["part"] == "summary" and rows[-1]["status"] == "pass"
    assert all(r["status"] == "pass" for r in rows)
    assert "PASS summary/overall" in proc.stdout
    assert (tmp_path / "gpu_check_meta.csv").exists() and (tmp_path / "pytest_cuda.log").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_gpu_run_without_cuda_says_so_in_seconds(tmp_path):
    """``benchmarks/gpu_run.sh`` on a machine without CUDA: exit 2 with a clear line, the
    versions and its log written (a GPU's run writes 5 more files, ``--dry-run`` rehearses
    them on CPU: ``benchmarks/compat_venv.sh``)."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_run.sh"), str(out)],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_run.log", "versions.txt"]
    versions = (out / "versions.txt").read_text()
    assert "torch " in versions and "available: False" in versions
