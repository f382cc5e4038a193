"""Test set-up: Triton kernels run on CPU tensors through the Triton interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so it is set before anything
imports hfcompress's Triton modules.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
