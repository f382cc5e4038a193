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
                         CASES + [(torch.float32, 64, 5), (torch.float16, 64, 3),
                                  (torch.bfloat16, 32, 7)])
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


def wire_of(peers, levels, pad: int) -> torch.Tensor:
    """The peers' payloads (codes, lo, rng, levels) as the rows of one uint8 wire, each row
    followed by ``pad`` bytes: its fields are strided columns."""
    rows = [torch.cat([q[0], q[1].view(torch.uint8), q[2].view(torch.uint8),
                       lv.view(torch.uint8), torch.zeros(pad, dtype=torch.uint8)])
            for q, lv in zip(peers, levels)]
    return torch.stack(rows)


def wire_fields(wire: torch.Tensor, peers, levels) -> list[torch.Tensor]:
    """(codes, lo, rng, levels) of every row of ``wire_of``, as views of its columns."""
    sizes = [peers[0][0].numel(), 4 * peers[0][1].numel(), 4 * peers[0][2].numel(),
             4 * levels[0].numel()]
    fields, at = [], 0
    for i, n in enumerate(sizes):
        f = wire[:, at:at + n]
        fields.append(f if i == 0 else f.view(torch.float32))
        at += n
    return fields


@pytest.mark.parametrize("bits,bucket,rows,cut", [(5, 96, 1, 0), (5, 1024, 3, 700), (4, 64, 4, 9),
                                                  (3, 32, 2, 31), (8, 32, 2, 0),
                                                  (6, 64, 3, 5)])
def test_learned_levels_rows_of_a_wire_bit_exact(bits, bucket, rows, cut):
    """``dequantize_rows`` (each row its own codebook, the first numel values of a row into
    the caller's output) and ``dequantize_sum`` on a wire's strided columns: the Triton
    kernels read the packed codes and fields in place, same numbers as the twin."""
    gen = torch.Generator().manual_seed(bits)
    levels = [torch.rand(1 << bits, generator=gen).sort().values for _ in range(rows)]
    peers = [ll_twin.quantize(data(bucket, torch.float32, seed=r), levels[r], bits, bucket)
             for r in range(rows)]
    wire = wire_of(peers, levels, 4 * (bits % 3))
    fields = wire_fields(wire, peers, levels)
    numel = peers[0][1].numel() * bucket - cut
    for dtype in DTYPES:
        want = torch.full((rows, numel), 7.0, dtype=dtype)
        got = want.clone()
        ll_twin.dequantize_rows(*fields, bits, bucket, want)
        ll_tri.dequantize_rows(*fields, bits, bucket, got)
        assert same(want, got)
        for r in range(rows):  # row r is the dequantize of its payload
            one = ll_twin.dequantize(*peers[r], levels[r], bits, bucket, dtype)[:numel]
            assert same(got[r], one)
    assert same(ll_twin.dequantize_sum(*fields, bits, bucket),
                ll_tri.dequantize_sum(*fields, bits, bucket))


def test_learned_levels_given_midpoints_same_codes():
    x = data(64, torch.bfloat16)
    lv = torch.rand(32, generator=torch.Generator().manual_seed(0)).sort().values
    mids = ll_twin.midpoints(lv)
    want = ll_twin.quantize(x, lv, 5, 64)
    check_all(want, ll_twin.quantize(x, lv, 5, 64, mids))
    check_all(want, ll_tri.quantize(x, lv, 5, 64, mids))


@pytest.mark.parametrize("bits,bucket,numel", [(5, 64, 1), (5, 64, 130), (4, 96, 95), (3, 32, 33)])
def test_learned_levels_quantize_pads_the_last_bucket_with_the_last_value(bits, bucket, numel):
    x = data(bucket, torch.bfloat16)[-numel:]
    lv = torch.rand(1 << bits, generator=torch.Generator().manual_seed(1)).sort().values
    padded = torch.cat([x, x[-1:].expand(-numel % bucket)])
    want = ll_twin.quantize(padded, lv, bits, bucket)
    check_all(want, ll_twin.quantize(x, lv, bits, bucket))
    check_all(want, ll_tri.quantize(x, lv, bits, bucket))


def test_learned_packed_codes_misaligned_are_copied():
    """A packed-codes tensor not 4-byte aligned is decoded from an aligned copy (the kernel
    reads whole uint16 / uint32 pieces)."""
    x = data(32, torch.float32)
    lv = torch.linspace(0, 1, 16)
    codes, lo, rng = ll_twin.quantize(x, lv, 4, 32)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), codes])[1:]
    assert shifted.data_ptr() % 4
    assert same(ll_tri.dequantize(shifted, lo, rng, lv, 4, 32),
                ll_twin.dequantize(codes, lo, rng, lv, 4, 32))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("offset", [0, 1])
def test_learned_decompress_slots_and_reduce_rows(backend, offset):
    """The compressor's wire paths (one kernel over every row, fields read in place; a wire
    not 4-byte aligned is copied) give what per-payload decompress / reduce give."""
    c = get_compressor("learned", bits=5, bucket_size=64, fit_steps=0, backend=backend)
    x = torch.randn(3, 200).to(torch.bfloat16)
    packs = []
    for r in range(3):  # a different codebook per row
        c.update_levels(x[r].float() * (r + 1), lr=0.5)
        packs.append(c.compress(x[r]))
    flat = torch.stack([p.flat() for p in packs])
    buf = torch.zeros(flat.numel() + offset, dtype=torch.uint8)
    wire = buf[offset:].view(flat.shape)
    wire.copy_(flat)
    out = torch.empty(3, 200, dtype=torch.bfloat16)
    c.decompress_slots(wire, 200, out)
    for r in range(3):
        assert same(out[r], c.decompress(packs[r]))
    assert same(c.reduce_rows(wire, (200,), torch.bfloat16), c.reduce(packs))


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
