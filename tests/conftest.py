"""Test set-up: Triton kernels run on CPU tensors through the Triton interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so it is set before anything
imports hfcompress's Triton modules. ``HFCOMPRESS_COMPILE=0`` keeps the CPU twins eager
(compilation costs seconds per kernel); the tests of the compiled path turn it back on.
A parallel run (``-n 2``, the README's) gets one thread per worker and the longest files
first.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HFCOMPRESS_COMPILE", "0")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a parallel run (-n 2) has a worker per core: one thread each, for the processes the
    # tests start too (their ranks already run one thread each)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

#: the test files of tens of seconds each (process launches, cold compiles, a real model),
#: longest first (measured on 2 AVX2 cores): they start first, so the README's parallel run
#: (``-n 2``, one file per worker at a time, in this order: ``--dist loadfile
#: --no-loadscope-reorder``) ends on short files instead of waiting for one long one.
#: Order only: a file missing here runs after them, in collection order.
LONGEST_FIRST = (
    "test_real_model.py", "test_fsdp_training.py", "test_transients.py",
    "test_trainer_dist.py", "test_fsdp_tp.py", "test_trainer_tp.py", "test_loco.py",
    "test_faults_trainer.py", "test_trainer_cluster.py", "test_example_resume.py",
    "test_eval_end_to_end.py", "test_group_quant.py",
    "test_compress_rows.py", "test_fsdp_hotpath.py", "test_examples.py", "test_lm_eval_cli.py",
    "test_ddp_hook.py", "test_ddp_async.py", "test_gpu_check.py", "test_gpu_registers.py",
    "test_kernel_isa.py", "test_step_ops.py",
    "test_global_qsgd.py", "test_all_reduce.py", "test_eval_errors.py", "test_trl_peft.py",
    "test_qsdp.py", "test_stream_contract.py", "test_readme_snippets.py",
    "test_frozen_updates.py", "test_fsdp_memory.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
