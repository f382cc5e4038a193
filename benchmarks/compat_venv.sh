#!/usr/bin/env bash
# The lent GPU machine's software, on this CPU (issue 28): a venv with the GPU image's
# versions (torch 2.11.0, triton 3.6.0, transformers 5.17, accelerate 1.15, numpy 2.5; no
# datasets / evaluate / lm-eval / gguf / trl / matplotlib), then the CPU dry runs of what
# benchmarks/gpu_run.sh runs there: `pytest -m cuda` and `gpu_check.py --device cpu --quick`.
#
#   bash benchmarks/compat_venv.sh [VENV]      # default .venv-compat; reused when present
#
# torch 2.11.0 from PyPI is the cu130 build (~3 GB with its CUDA wheels): it installs and
# runs on a CPU-only machine. Exit status: that of the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-compat}
py=$(PYENV_VERSION=3.12.1 pyenv which python3.12 2>/dev/null || command -v python3)
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q torch==2.11.0 triton==3.6.0 "transformers==5.17.*" \
        "accelerate==1.15.*" "numpy==2.5.*" peft pytest pytest-xdist pytest-timeout
fi
"$venv/bin/python" -c "import sys, torch, triton, transformers, accelerate, numpy
print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__,
      '| transformers', transformers.__version__, '| accelerate', accelerate.__version__,
      '| numpy', numpy.__version__)"
export PYTHONPATH=$PWD HFCOMPRESS_CUDA_TESTS_DEVICE=cpu
"$venv/bin/python" -m pytest -m cuda -q -n 0 tests/test_cuda.py
out=$(mktemp -d)
"$venv/bin/python" benchmarks/gpu_check.py --device cpu --quick --out "$out"
