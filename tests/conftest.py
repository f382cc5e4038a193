"""Test set-up: Triton kernels run on CPU tensors through the Triton interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so it is set before anything
imports hfcompress's Triton modules. ``HFCOMPRESS_COMPILE=0`` keeps the CPU twins eager
(compilation costs seconds per kernel); the tests of the compiled path turn it back on.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HFCOMPRESS_COMPILE", "0")
