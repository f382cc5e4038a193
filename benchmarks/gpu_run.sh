#!/usr/bin/env bash
# The GPU check in one command, for a lent GPU (issue 28, ../shared/GPU.md):
#
#   bash benchmarks/gpu_run.sh OUTDIR            # on the GPU machine
#   bash benchmarks/gpu_run.sh OUTDIR --dry-run  # the same steps on CPU (gloo, Triton
#                                                # interpreted, --quick): this script's rehearsal
#
# No network, no install: the machine's own python3 / torch (PYTHON overrides), the checkout
# on PYTHONPATH. Hard-bounded under 8 minutes (pytest 250 s, gpu_check 190 s, each killed at
# its limit). Writes 7 files directly under OUTDIR as it goes, so a cut run keeps what is done:
#   gpu_run.log         what this script did, each step's exit status and seconds
#   versions.txt        python, torch (CUDA, NCCL), triton, transformers, accelerate, nvidia-smi
#   pytest_cuda.log     `pytest -m cuda -v tests/test_cuda.py`, streamed
#   pytest_cuda.xml     its junit report
#   gpu_check.log       `benchmarks/gpu_check.py --skip-tests` (kernels, steps), streamed
#   gpu_check.csv       one row per check (PASS / FAIL, GB/s, ms/step), the last the summary
#   gpu_check_meta.csv  machine, versions, GPU
# Without a CUDA device (and no --dry-run) it says so and exits 2 after writing the first two.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_run.sh OUTDIR [--dry-run]}
dry=${2:-}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log=$out/gpu_run.log
say() { echo "gpu_run: $*" | tee -a "$log"; }

say "$(date -u +%FT%TZ) in $PWD, python: $(command -v "$py")"
"$py" - >"$out/versions.txt" 2>&1 <<'PY'
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for name in ("torch", "triton", "transformers", "accelerate", "numpy", "pytest", "xdist"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as err:  # noqa: BLE001
        print(name, "not importable:", err)
import torch
print("cuda", torch.version.cuda, "| available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          p.total_memory >> 30, "GiB | nccl", ".".join(map(str, torch.cuda.nccl.version())))
PY
nvidia-smi >>"$out/versions.txt" 2>&1 || echo "nvidia-smi: not found" >>"$out/versions.txt"
cat "$out/versions.txt" >>"$log"

if [ "$dry" = "--dry-run" ]; then
    say "dry run on CPU: gloo, Triton interpreted, gpu_check --quick"
    export HFCOMPRESS_CUDA_TESTS_DEVICE=cpu TRITON_INTERPRET=1
    device=cpu; quick=--quick
elif ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    say "no CUDA device: nothing to check here (versions.txt written); on CPU use --dry-run"
    exit 2
else
    export TRITON_INTERPRET=0
    device=cuda; quick=
fi

step() {   # step NAME SECONDS LOGFILE CMD...: run CMD bounded, streaming into LOGFILE
    local name=$1 limit=$2 file=$3; shift 3
    local start=$SECONDS
    say "$name: $* (limit ${limit} s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$file"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && say "$name: TIMED OUT after ${limit} s"
    say "$name: exit $rc in $((SECONDS - start)) s"
    return "$rc"
}

# addopts cleared: the image's pytest-xdist may predate --no-loadscope-reorder
step "pytest -m cuda" 250 "$out/pytest_cuda.log" "$py" -m pytest -m cuda -v -o addopts= \
    -p no:cacheprovider --junitxml="$out/pytest_cuda.xml" --durations=15 tests/test_cuda.py
tests=$?
step "gpu_check" 190 "$out/gpu_check.log" "$py" benchmarks/gpu_check.py --device "$device" \
    $quick --skip-tests --out "$out"
check=$?
say "done: pytest exit $tests, gpu_check exit $check; files: $(cd "$out" && ls | tr '\n' ' ')"
[ "$tests" = 0 ] && [ "$check" = 0 ]
