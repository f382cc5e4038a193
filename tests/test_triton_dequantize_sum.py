"""Decode-and-sum kernel (kernels/triton_dequantize_sum.py) == the torch twins
``group_quant.dequantize_sum`` / ``hadamard.dequantize_sum`` bit for bit, under the Triton
interpreter (TRITON_INTERPRET=1, set in conftest.py): word and byte paths, peer counts
unrolled and looped, strided views of one wire read in place, 16-bit outputs, non-finite
groups; and the kernel compiles for a GPU without FMA."""

import pytest
import torch

from gpu_compile import run_compile_script
from hfcompress.kernels import dispatch
from hfcompress.kernels import group_quant as twin
from hfcompress.kernels import hadamard as hk

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not dispatch.triton_available(), reason="Triton not installed"),
    # inf * 0 and NaN compares inside the interpreter's numpy are expected
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


@pytest.fixture(scope="module")
def ds():
    from hfcompress.kernels import triton_dequantize_sum
    return triton_dequantize_sum


def bits_of(t):
    """The tensor's bits as integers, every NaN the same (its payload may differ)."""
    t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def same(a, b):
    """Same dtype, shape and bits (-0.0 != 0.0), NaN == NaN."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits_of(a), bits_of(b))


def payloads(p, groups, bits, gs, seed=0):
    """``p`` peers' (packed, scale) of ``groups`` groups; peer 1 has an Inf group and a NaN
    group (of 3 groups or more), peer 0 an all-zero group (-0.0 products), magnitudes differ
    per peer."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(p):
        x = torch.randn(groups * gs, generator=g) * 3.0 ** (i % 5 - 2)
        if i == 1 and groups > 2:
            x[gs + 3], x[2 * gs] = float("inf"), float("nan")
        if i == 0:
            x[:gs] = 0
        out.append(twin.quantize(x, bits, gs))
    return torch.stack([q[0] for q in out]), torch.stack([q[1] for q in out])


def wire(packed, scale, lead=0):
    """The peers' rows as one uint8 wire ``[P, lead + nbytes + 4 * groups (+ pad)]`` and its
    column views (packed at byte ``lead``, scales at the next multiple of 4)."""
    p, nbytes = packed.shape
    off = -(-(lead + nbytes) // 4) * 4
    row = off + 4 * scale.shape[1] + 4
    w = torch.zeros(p, row, dtype=torch.uint8)
    w[:, lead:lead + nbytes] = packed
    w[:, off:off + 4 * scale.shape[1]] = scale.view(torch.uint8)
    return w[:, lead:lead + nbytes], w.view(torch.float32)[:, off // 4:off // 4 + scale.shape[1]]


@pytest.mark.parametrize("bits, gs", [(4, 128), (8, 128), (2, 96), (6, 64), (4, 36)])
@pytest.mark.parametrize("p", [1, 3, 8, 17])
def test_sum_equals_twin(ds, bits, gs, p):
    """Every peer count (unrolled up to MAX_UNROLL, a loop beyond), word rows (whole words
    in a group) and 4-code rows (6 bits; 4 bits in groups of 36), a ragged last tile."""
    packed, scale = payloads(p, 37, bits, gs)
    want = twin.dequantize_sum(packed, scale, bits, gs)
    assert same(ds.dequantize_sum(packed, scale, bits, gs), want)
    assert (p > ds.MAX_UNROLL) == (p == 17)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_output_dtypes(ds, dtype):
    """bfloat16 rounded to nearest even as torch does; 16-bit Hadamard outputs clipped."""
    packed, scale = payloads(3, 9, 4, 128)
    scale[2, 4] = 3e38 / 8  # sums past the 16-bit ranges
    want = twin.decode_sum(packed, scale, 4, 128).to(dtype)
    assert same(ds.dequantize_sum(packed, scale, 4, 128, dtype), want)
    one = ds.dequantize_sum(packed[2:], scale[2:], 4, 128, dtype, 32, True, clip=True)
    assert same(one, hk.dequantize(packed[2], scale[2], 4, 128, 32, dtype))


@pytest.mark.parametrize("bits, gs, n", [(4, 128, 32), (8, 128, 32), (2, 32, 2), (6, 96, 32),
                                         (4, 256, 128), (4, 128, 1)])
@pytest.mark.parametrize("p", [1, 3, 8])
def test_hadamard_sum_equals_twin(ds, bits, gs, n, p):
    """The inverse rotation fused after the sum (blocks in a thread's row up to ROW_MAX,
    across rows beyond), and without it."""
    packed, scale = payloads(p, 11, bits, gs, seed=p)
    for inverse in (True, False):
        got = ds.dequantize_sum(packed, scale, bits, gs, torch.float32, n, inverse, clip=True)
        assert same(got, hk.dequantize_sum(packed, scale, bits, gs, n, inverse)), inverse


def test_older_tritons_loop_past_their_unroll_bytes(ds, monkeypatch):
    """Triton < 3.9 keeps every unrolled peer's loads in flight (16 peers of int8 rows of 32
    values: 150 registers): there peers past ``OLDER_UNROLL_ROW_BYTES`` per thread run in the
    loop; 8 of them, and 16 of int4, stay unrolled; Triton 3.9 unrolls all 16. The loop's sum
    is the twin's."""
    consts = lambda bits, peers: ds._sum_consts(  # noqa: E731
        bits, 128, 32, True, True, torch.bfloat16, peers, 4)["PEERS"]
    monkeypatch.setattr(ds, "OLDER_TRITON", True)
    ds._sum_consts.cache_clear()
    try:
        assert (consts(8, 16), consts(8, 8), consts(4, 16)) == (0, 8, 16)
        packed, scale = payloads(16, 3, 8, 128, seed=5)
        got = ds.dequantize_sum(packed, scale, 8, 128, torch.float32, 32, True, clip=True)
        assert same(got, hk.dequantize_sum(packed, scale, 8, 128, 32, True))
        monkeypatch.setattr(ds, "OLDER_TRITON", False)
        ds._sum_consts.cache_clear()
        assert consts(8, 16) == 16
    finally:
        ds._sum_consts.cache_clear()


class Launches:
    """Stands in for the kernel: records each launch's arguments, runs nothing."""

    def __init__(self):
        self.args, self.calls = [], []

    def __getitem__(self, grid):
        def launch(*args, **consts):
            self.args.append(args)
            self.calls.append((grid, args, consts))
        return launch


@pytest.mark.parametrize("bits, lead", [(4, 0), (4, 2), (8, 0), (8, 1), (6, 0)])
def test_strided_wire_views_read_in_place(ds, monkeypatch, bits, lead):
    """``packed`` and ``scale`` as column views of one wire ``[P, row]`` (row stride !=
    nbytes): the kernel gets views of the wire (no copy) and sums as the twins; a start off
    the 4-byte grid is read byte by byte."""
    packed, scale = payloads(5, 13, bits, 128)
    cp, cs = wire(packed, scale, lead)
    assert cp.stride(0) != cp.shape[1] and cs.stride(0) != cs.shape[1]
    assert same(ds.dequantize_sum(cp, cs, bits, 128), twin.dequantize_sum(packed, scale, bits, 128))
    rot = ds.dequantize_sum(cp, cs, bits, 128, torch.bfloat16, 32, True, clip=True)
    assert same(rot, hk.dequantize_sum(packed, scale, bits, 128, 32).bfloat16())
    launches = Launches()
    monkeypatch.setattr(ds, "_dequantize_sum_kernel", launches)
    ds.dequantize_sum(cp, cs, bits, 128)
    [(src, sc, *_)] = launches.args
    storage = cp.untyped_storage().data_ptr()
    assert src.untyped_storage().data_ptr() == sc.untyped_storage().data_ptr() == storage
    assert src.dtype == (torch.int32 if bits != 6 and lead % 4 == 0 else torch.uint8)


def test_entry_points_read_strided_views(ds):
    """``triton_group_quant`` / ``triton_hadamard`` decode-sums take the wire's views too."""
    from hfcompress.kernels import triton_group_quant as tq
    from hfcompress.kernels import triton_hadamard as th
    packed, scale = payloads(4, 6, 4, 128)
    cp, cs = wire(packed, scale)
    assert same(tq.dequantize_sum(cp, cs, 4, 128), twin.dequantize_sum(packed, scale, 4, 128))
    assert same(th.dequantize_sum(cp, cs, 4, 128, 32),
                hk.dequantize_sum(packed, scale, 4, 128, 32))
    assert same(tq.dequantize(cp[1], cs[1], 4, 128, torch.bfloat16),
                twin.dequantize(packed[1], scale[1], 4, 128, torch.bfloat16))


@pytest.mark.parametrize("offset", [0, 4, 1])
def test_sum_into_callers_output(ds, monkeypatch, offset):
    """``out=``: the twins' and the entry points' sums written into the caller's float32
    buffer (e.g. a reduce-scatter's output), the kernel's own store where it is 16-byte
    aligned (no copy), else through one copy; same bits as without ``out``."""
    from hfcompress.kernels import triton_group_quant as tq
    from hfcompress.kernels import triton_hadamard as th
    packed, scale = payloads(3, 5, 4, 128)
    cp, cs = wire(packed, scale, 2)
    for fn, ref, args in ((tq.dequantize_sum, twin.dequantize_sum, ()),
                          (th.dequantize_sum, hk.dequantize_sum, (32,))):
        want = ref(packed, scale, 4, 128, *args)
        for impl in (fn, ref):
            buf = torch.full((offset + want.numel(),), 7.0)
            out = buf[offset:]
            assert impl(cp, cs, 4, 128, *args, out=out).data_ptr() == out.data_ptr()
            assert same(out, want) and torch.all(buf[:offset] == 7.0)
    launches = Launches()
    monkeypatch.setattr(ds, "_dequantize_sum_kernel", launches)
    out = torch.empty(5 * 128 + offset)[offset:]
    ds.dequantize_sum(cp, cs, 4, 128, out=out)
    [(_, _, dst, *_)] = launches.args
    assert (dst.data_ptr() == out.data_ptr()) == (offset % 4 == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("post", [None, ("div", 3), ("mul", 1 / 3)])
def test_reduce_op_in_the_epilogue(dtype, post):
    """``post`` (a reduce-scatter's AVG / PREMUL_SUM, ``post_op.py``): the decode-sum of a
    wire divides / multiplies its sum (rotated back first) and rounds once into the
    caller's output of any float dtype, aligned or not (then through one copy): the same
    bits as the twins, which equal the float32 sum put through ``write_post`` (what the
    reduce-scatters wrote in a pass of their own before)."""
    from hfcompress.kernels import triton_group_quant as tq
    from hfcompress.kernels import triton_hadamard as th
    from hfcompress.kernels.post_op import write_post
    packed, scale = payloads(3, 5, 4, 128)
    w = torch.cat([packed, scale.view(torch.uint8)], 1)
    args = (w, packed.shape[1], scale.shape[1], 4, 128)
    for fn, ref, extra in ((tq.dequantize_sum_wire, twin.dequantize_sum_wire, ()),
                           (th.dequantize_sum_wire, hk.dequantize_sum_wire, (32, True))):
        want = write_post(ref(*args, *extra), torch.empty(5 * 128, dtype=dtype), post)
        for offset in (0, 1):
            for impl in (fn, ref):
                out = torch.empty(offset + 5 * 128, dtype=dtype)[offset:]
                got = impl(*args, *extra, out=out, post=post)
                assert got.data_ptr() == out.data_ptr() and same(out, want), (impl, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("post", [None, ("div", 3), ("mul", 1 / 3)])
def test_riders_summed_in_the_same_launch(ds, monkeypatch, dtype, post):
    """``riders``: the exact values ending each peer's wire row (``comm/riders.py``) summed
    in float32 in peer order, their reduce op's step applied, into their output by programs
    of the decode-sum's own launch: the bits of the twins' ``post_op.sum_riders`` (peers of
    different magnitudes: the order shows), the payload's sum untouched, one launch; on
    the byte path (6-bit codes, rows not whole words) and through a misaligned output too."""
    from hfcompress.kernels import triton_group_quant as tq
    from hfcompress.kernels import triton_hadamard as th
    from hfcompress.kernels.post_op import sum_riders

    def rows(bits, p, e):
        packed, scale = payloads(p, 5, bits, 128)
        g = torch.Generator().manual_seed(p)
        riding = torch.randn(p, e, generator=g) * 10.0 ** (torch.arange(p)[:, None] % 3)
        w = torch.cat([packed, scale.view(torch.uint8), riding.to(dtype).view(torch.uint8)], 1)
        return w, (w, packed.shape[1], scale.shape[1], bits, 128)
    for bits, p, e in ((4, 3, 38), (4, 17, 38), (6, 3, 38), (8, 1, 38), (4, 3, 37)):
        w, args = rows(bits, p, e)
        want = sum_riders(w, (torch.empty(e, dtype=dtype), dtype, post))
        for fn, ref, extra in ((tq.dequantize_sum_wire, twin.dequantize_sum_wire, ()),
                               (th.dequantize_sum_wire, hk.dequantize_sum_wire, (32, True))):
            if bits == 6 and extra:
                continue
            plain = ref(*args, *extra)
            for impl in (fn, ref):
                for offset in (0, 1):
                    out = torch.empty(offset + 5 * 128)[offset:]
                    got = torch.full((e,), 7.0, dtype=dtype)
                    impl(*args, *extra, out=out, riders=(got, dtype, post))
                    assert same(got, want), (impl, bits, p, e, offset)
                    assert same(out, plain), (impl, bits, p, e, offset)
    launches = Launches()
    monkeypatch.setattr(ds, "_dequantize_sum_kernel", launches)
    w, args = rows(8, 2, 38)
    ds.dequantize_sum_wire(*args, riders=(torch.empty(38, dtype=dtype), dtype, post))
    [(grid, args, kwargs)] = launches.calls
    assert kwargs["TAIL"] and grid[0] == args[-2] + 1     # the main programs, then the riders'


def test_empty_and_row_layouts(ds):
    packed, scale = payloads(2, 1, 4, 128)
    assert ds.dequantize_sum(packed[:, :0], scale[:, :0], 4, 128).numel() == 0
    assert ds.row_layout(4, 128) == dict(ROWV=16, UPR=2, UB=4, UC=8)
    assert ds.row_layout(4, 128, 32) == dict(ROWV=32, UPR=4, UB=4, UC=8)
    assert ds.row_layout(6, 96, 32) == dict(ROWV=32, UPR=8, UB=3, UC=4)
    assert ds.row_layout(6, 96) == dict(ROWV=8, UPR=2, UB=3, UC=4)
    assert ds.row_layout(4, 36) == dict(ROWV=4, UPR=1, UB=2, UC=4)
    with pytest.raises(ValueError, match="multiple of 4"):
        ds.row_layout(8, 6)


_COMPILE = r"""
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hfcompress.kernels import triton_dequantize_sum as ds
for bits, gs, n, words, peers, bf16, post, tail in ((4, 128, 1, True, 8, True, 0, False),
                                                    (8, 128, 32, True, 0, True, 1, True),
                                                    (6, 256, 128, False, 3, False, 2, False),
                                                    (4, 128, 1, True, 3, False, 2, True)):
    k = ds.row_layout(bits, gs, n)
    consts = dict(PEERS=peers, GS=gs, BITS=bits, **k, V=min(k["UPR"], 4) if words else 1,
                  WORDS=words, R=ds.GPU_ROWS, N=n,
                  LOG2N=n.bit_length() - 1, SCALE=ds.inv_sqrt(n), INVERSE=n > 1,
                  CLIP=bf16 and not post, OUT_BF16=bf16, POST=post, TAIL=tail,
                  TAIL_BLOCK=1024, TAIL_IN_BF16=bf16, TAIL_OUT_BF16=bf16, TAIL_POST=post,
                  RUNS=tail)
    # a wire's words carry the scales' bits where the codes are words (dequantize_sum_wire)
    sig = dict(src_ptr="*i32" if words else "*u8", scale_ptr="*i32" if words else "*fp32",
               out_ptr="*u16" if bf16 else "*fp32", n_rows="i32", n_peers="i32",
               src_stride="i32", scale_stride="i32", scale_off="i32", BIG="fp32", post="fp32",
               tail_ptr="*u16" if bf16 else "*fp32", tail_off="i32", tail_stride="i32",
               tail_out_ptr="*u16" if bf16 else "*fp32", n_tail="i32", n_main="i32",
               tail_post="fp32", run_tiles="i32", run_gap="i32")
    sig.update({c: "constexpr" for c in consts})
    src = ASTSource(fn=ds._dequantize_sum_kernel, signature=sig, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 80, 32),
                         options={"enable_fp_fusion": False}).asm["ptx"]
    assert not re.search(r"\bfma\.", ptx), "contracted multiply-add"
print("ok")
"""


def test_kernel_compiles_for_a_gpu_without_fma():
    """The interpreter misses GPU-only compile errors: compile the kernel for sm_80 (no GPU
    needed) in each path (words / bytes, unrolled / looped peers, rotation in a row and
    across rows, the reduce op's division / multiplication after the sum, the riders'
    sum), without a contracted multiply-add (bit-exactness with the twins)."""
    pytest.importorskip("triton.backends.nvidia")
    r = run_compile_script(_COMPILE)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
