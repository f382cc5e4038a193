#!/usr/bin/env bash
# The lent GPU machine's software on this CPU (issue 28): a venv with the GPU image's
# versions (torch 2.11.0, triton 3.6.0, transformers 5.17, accelerate 1.15; no datasets /
# evaluate / lm-eval / gguf / trl / matplotlib), then
#   1. benchmarks/gpu_run.sh --dry-run: `pytest -m cuda` and `gpu_check.py --device cpu --quick`
#      (what the GPU runs, on gloo with Triton interpreted);
#   2. the tests of every FSDP2 / DDP / HSDP code path that need no datasets or lm-eval
#      (N-D meshes: FSDP2 x TP, native HSDP through the Trainer, auto on a sub-mesh), and
#      the sm_90 instruction budgets of the hot kernels and every kernel's registers (<= 128,
#      no spill) as Triton 3.6 compiles them.
#
#   bash benchmarks/compat_venv.sh [VENV]          # default .venv-compat; reused when present
#   TORCH=2.12.0 bash benchmarks/compat_venv.sh .venv-2.12    # another torch (its own triton)
#
# torch from PyPI is the CUDA build (~3 GB with its CUDA wheels): it installs and runs on a
# CPU-only machine. numpy 2.3, not the image's 2.5: triton 3.6's interpreter int()s a
# one-element array, which numpy >= 2.4 refuses (compiled on a GPU, Triton does not).
# Exit status: that of the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-compat}
torch_version=${TORCH:-2.11.0}
if [ "$torch_version" = 2.11.0 ]; then pins="triton==3.6.0"; else pins=""; fi
py=$(PYENV_VERSION=3.12.1 pyenv which python3.12 2>/dev/null || command -v python3)
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==$torch_version" $pins "transformers==5.17.*" \
        "accelerate==1.15.*" "numpy==2.3.*" peft pytest pytest-xdist pytest-timeout
fi
out=$(mktemp -d)
PYTHON=$venv/bin/python bash benchmarks/gpu_run.sh "$out" --dry-run
PYTHONPATH=$PWD "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider \
    tests/test_fsdp_hotpath.py tests/test_fsdp_training.py tests/test_fsdp_units.py \
    tests/test_handle.py tests/test_stream_contract.py tests/test_one_rank.py \
    tests/test_ddp_async.py tests/test_all_reduce.py tests/test_fsdp_tp.py \
    tests/test_trainer_tp.py tests/test_auto_submesh.py tests/test_auto.py tests/test_riders.py \
    tests/test_gather_plans.py tests/test_kernel_isa.py tests/test_gpu_registers.py
