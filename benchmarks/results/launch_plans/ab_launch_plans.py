"""A/B of session 29's host-path changes in one process (``benchmarks/host_ab.py``):
sdp4bit with the kernel wrappers' launch plans, ``payload_spec`` cached and equally spaced
column runs as one strided copy ("new"), against the wrappers of commit a5e987d (loaded
from git as modules of their own), an uncached ``payload_spec`` and the runs taken by a
``cat`` of slices and put back by a copy per run ("old").

    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 \\
        python benchmarks/results/launch_plans/ab_launch_plans.py
"""
import importlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from host_ab import compare

from hfcompress.comm import frozen, reference_gather
from hfcompress.compressors import runs
from hfcompress.compressors.bucketed import BucketQuantizer
from hfcompress.integrations import exact_params, fsdp

BASE = "a5e987d"
WRAPPERS = {"triton_hadamard": ("quantize_rows", "dequantize_sum_wire"),
            "triton_dequantize_sum": ("dequantize_sum_wire",),
            "triton_group_quant": ("_rows", "dequantize_add_wire")}


def base_module(name: str):
    """``hfcompress.kernels.<name>`` as it was at ``BASE``, a module of its own."""
    source = subprocess.run(["git", "show", f"{BASE}:hfcompress/kernels/{name}.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"hfcompress.kernels._{name}_{BASE}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def old_take(rows, cols):
    if len(cols) <= 1:
        return NEW["take"](rows, cols)
    return torch.cat([rows[:, a:b] for a, b in cols], dim=1)


def old_put(rows, cols, values):
    offset = 0
    for a, b in cols:
        rows[..., a:b].copy_(values[..., offset:offset + b - a])
        offset += b - a


def old_payload_spec(self, numel):
    n = -(-numel // self._size) * self._size
    return {"codes": (torch.uint8, self.codes_nbytes(n, self.bits)),
            **{k: (self.bucket_dtypes.get(k, torch.float32), n // self._size)
               for k in self.bucket_params}}


NEW = {"take": runs.take, "put": runs.put, "payload_spec": BucketQuantizer.payload_spec}
OLD = {"take": old_take, "put": old_put, "payload_spec": old_payload_spec}
for name, functions in WRAPPERS.items():
    current, before = importlib.import_module(f"hfcompress.kernels.{name}"), base_module(name)
    for f in functions:
        NEW[(current, f)], OLD[(current, f)] = getattr(current, f), getattr(before, f)


def use(paths: dict) -> None:
    for key, fn in paths.items():
        if isinstance(key, tuple):
            setattr(*key, fn)
    exact_params.take = frozen.take = paths["take"]
    exact_params.put = fsdp.put = reference_gather.put = frozen.put = paths["put"]
    BucketQuantizer.payload_spec = paths["payload_spec"]


compare("sdp4bit", lambda: use(OLD), lambda: use(NEW))
