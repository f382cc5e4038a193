"""QSDP's Triton kernels against their torch twins, bit for bit given the same noise (run on
CPU under TRITON_INTERPRET=1, set by conftest.py): ``triton_qsgd``, ``triton_random_shift``,
``triton_learned_levels``. Sizes are modest: the interpreter costs ~ms per program."""

import pytest
import torch

pytest.importorskip("triton")

from hfcompress.compressors import get_compressor  # noqa: E402
from hfcompress.kernels import learned_levels as ll_twin  # noqa: E402
from hfcompress.kernels import qsgd as qsgd_twin  # noqa: E402
from hfcompress.kernels import random_shift as rs_twin  # noqa: E402
from hfcompress.kernels import triton_learned_levels as ll_tri  # noqa: E402
from hfcompress.kernels import triton_qsgd as qsgd_tri  # noqa: E402
from hfcompress.kernels import triton_random_shift as rs_tri  # noqa: E402

# the interpreter's numpy warns about inf/nan arithmetic in the non-finite buckets
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and values; NaN where the other has NaN (any NaN payload)."""
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            and torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)))


def data(bucket: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """11 buckets: normal values, a NaN, an Inf, a zero bucket, a constant bucket, a [0, 1]
    ramp, wide and tiny ranges."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(11, bucket, generator=gen) * 3 + 0.5
    x[1, 5] = float("nan")
    x[2, 7] = -float("inf")
    x[3] = 0
    x[4] = 0.75
    x[5] = torch.linspace(0, 1, bucket)
    x[6] *= 1e4
    x[7] *= 1e-30
    return x.reshape(-1).to(dtype)


def check_all(twin_out, tri_out):
    for a, b in zip(twin_out, tri_out):
        assert same(a, b)


CASES = [(torch.float32, 1024, bits) for bits in (2, 4, 6, 8)] + \
        [(dt, 96, 4) for dt in DTYPES] + [(torch.bfloat16, 32, 8)]


@pytest.mark.parametrize("dtype,bucket,bits", CASES)
def test_qsgd_kernels_bit_exact(dtype, bucket, bits):
    x = data(bucket, dtype)
    noise = torch.rand(x.numel(), generator=torch.Generator().manual_seed(1))
    q = qsgd_twin.quantize(x, bits, bucket, noise)
    check_all(q, qsgd_tri.quantize(x, bits, bucket, noise))
    assert same(qsgd_twin.dequantize(*q, bits, bucket, dtype),
                qsgd_tri.dequantize(*q, bits, bucket, dtype))
    peers = [qsgd_twin.quantize(x * (p + 1), bits, bucket, torch.rand(x.numel())) for p in range(3)]
    codes, scales = torch.stack([p[0] for p in peers]), torch.stack([p[1] for p in peers])
    assert same(qsgd_twin.dequantize_sum(codes, scales, bits, bucket),
                qsgd_tri.dequantize_sum(codes, scales, bits, bucket))


@pytest.mark.parametrize("dtype,bucket,bits", CASES)
def test_random_shift_kernels_bit_exact(dtype, bucket, bits):
    x = data(bucket, dtype)
    nb = x.numel() // bucket
    noise = torch.rand(nb, generator=torch.Generator().manual_seed(2))
    q = rs_twin.quantize(x, bits, bucket, noise)
    check_all(q, rs_tri.quantize(x, bits, bucket, noise))
    assert same(rs_twin.dequantize(*q, bits, bucket, dtype),
                rs_tri.dequantize(*q, bits, bucket, dtype))
    peers = [rs_twin.quantize(x * (p + 1), bits, bucket, torch.rand(nb)) for p in range(3)]
    parts = [torch.stack([p[i] for p in peers]) for i in range(3)]
    assert same(rs_twin.dequantize_sum(*parts, bits, bucket),
                rs_tri.dequantize_sum(*parts, bits, bucket))


@pytest.mark.parametrize("dtype,bucket,bits",
                         CASES + [(torch.float32, 64, 5), (torch.float16, 64, 3)])
def test_learned_levels_kernels_bit_exact(dtype, bucket, bits):
    x = data(bucket, dtype)
    gen = torch.Generator().manual_seed(3)
    levels = torch.rand(1 << bits, generator=gen).sort().values
    levels[2] = levels[1]  # a repeated level
    uniform = torch.linspace(0, 1, 1 << bits)
    ties = ll_twin.midpoints(uniform).repeat(bucket)[:bucket]  # values exactly on midpoints
    ties[0], ties[-1] = 0, 1  # bucket range [0, 1]: normalized v == x
    x = x.reshape(-1, bucket).clone()
    x[5] = ties.to(dtype)
    x = x.reshape(-1)
    for lv in (levels, uniform):
        q = ll_twin.quantize(x, lv, bits, bucket)
        check_all(q, ll_tri.quantize(x, lv, bits, bucket))
        assert same(ll_twin.dequantize(*q, lv, bits, bucket, dtype),
                    ll_tri.dequantize(*q, lv, bits, bucket, dtype))
    peers = [ll_twin.quantize(x * (p + 1), lv, bits, bucket)
             for p, lv in enumerate((levels, uniform))]
    parts = [torch.stack([p[i] for p in peers]) for i in range(3)]
    lvs = torch.stack([levels, uniform])
    assert same(ll_twin.dequantize_sum(*parts, lvs, bits, bucket),
                ll_tri.dequantize_sum(*parts, lvs, bits, bucket))


@pytest.mark.parametrize("name", ["qsgd", "random_shift", "learned"])
def test_compressors_same_through_either_backend(name):
    x = torch.randn(3, 1000).to(torch.bfloat16)
    extra = {"fit_steps": 20} if name == "learned" else {}
    a = get_compressor(name, bits=4, bucket_size=128, backend="torch", **extra)
    b = get_compressor(name, bits=4, bucket_size=128, backend="triton", **extra)
    pa, pb = a.compress(x), b.compress(x)
    assert all(same(pa.payload[k], pb.payload[k]) for k in pa.payload)
    assert same(a.decompress(pa), b.decompress(pb))
    assert same(a.reduce([pa, pa]), b.reduce([pb, pb]))
    empty = b.compress(torch.empty(0, 3))
    assert b.decompress(empty).shape == (0, 3)
