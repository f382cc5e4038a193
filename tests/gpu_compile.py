"""Compile Triton kernels for a GPU target (sm_80, no GPU needed) in a clean subprocess.

The test process runs kernels under ``TRITON_INTERPRET=1``, whose patches of
``triton.language`` break a later real compile in the same process; a warm Triton cache
hides that (the kernel is never recompiled). So every GPU compile runs in a fresh
interpreter without ``TRITON_INTERPRET``, with an empty cache of its own.
"""

import os
import subprocess
import sys
import tempfile


def run_compile_script(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` with ``python -c`` without the interpreter and with an empty Triton
    cache; returns the finished process (check ``returncode``, ``stdout``, ``stderr``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=timeout)
