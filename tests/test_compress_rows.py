"""``compress_rows`` / ``reduce_rows``: one call over a ``[rows, S]`` tensor gives exactly the
bytes (and the RNG state) of ``rows`` successive ``compress`` calls, on the torch twin and the
Triton kernels (interpreted), for sizes that are not a multiple of the group size; and the
row-keyed noise of ``kernels/noise.py`` is the noise of one call per row."""

from __future__ import annotations

import sys

import pytest
import torch
import triton.runtime.interpreter

from hfcompress import get_compressor
from hfcompress.compressors.base import Packed
from hfcompress.compressors.registry import get_compressor as build_compressor
from hfcompress.kernels import dispatch, noise, triton_noise  # noqa: F401
from hfcompress.compressors.rng import SeededRNG
from torch.utils._python_dispatch import TorchDispatchMode

SCHEMES = [
    ("int", {"bits": 4, "group_size": 128, "rounding": "stochastic"}),
    ("int", {"bits": 8, "group_size": 64, "rounding": "nearest"}),
    ("int", {"bits": 2, "group_size": 32, "rounding": "stochastic"}),
    ("int", {"bits": 6, "group_size": 96, "rounding": "nearest"}),   # byte units: joined
    ("qsgd", {"bits": 8, "bucket_size": 64}),
    ("random_shift", {"bits": 4, "bucket_size": 32}),
    ("hadamard", {"bits": 4, "group_size": 128, "hadamard_size": 32}),
    ("hadamard", {"bits": 8, "group_size": 64, "hadamard_size": 32, "rounding": "nearest"}),
]
BACKENDS = ["torch", "auto", "triton"]   # auto on CPU: the compiled twin


def _rows(rows: int, s: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 1000 + s)
    x = torch.randn(rows, s, generator=g) * torch.logspace(-2, 2, s)
    return x.to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params", SCHEMES)
@pytest.mark.parametrize("rows,s", [(4, 256), (3, 200), (2, 33), (5, 7)])
def test_compress_rows_is_one_compress_per_row(name, params, rows, s, backend):
    """Bit-identical wire and the same RNG state afterwards (the next call draws the same)."""
    batched = build_compressor(name, backend=backend, seed=3, **params)
    single = build_compressor(name, backend=backend, seed=3, **params)
    x = _rows(rows, s, torch.bfloat16 if s == 200 else torch.float32)
    wire = batched.compress_rows(x)
    want = torch.stack([single.compress(r).flat() for r in x])
    assert wire.dtype == torch.uint8 and wire.shape == want.shape
    assert torch.equal(wire, want)
    assert torch.equal(batched.compress(x[0]).flat(), single.compress(x[0]).flat())


TAILS = [(torch.float32, 3), (torch.bfloat16, 5), (torch.bfloat16, 6)]   # 5: not whole words


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params", SCHEMES)
def test_compress_rows_carries_a_tail(name, params, backend):
    """``compress_rows(x, tail)``: each row's payload as without a tail, then the bytes of
    that row of ``tail`` (exact values riding along, ``comm/riders.py``), for tails of whole
    int32 words or not (then the fields and the tail are joined)."""
    for dtype, e in TAILS:
        batched = build_compressor(name, backend=backend, seed=3, **params)
        single = build_compressor(name, backend=backend, seed=3, **params)
        x = _rows(3, 200)
        tail = torch.randn(3, 2 * e).to(dtype)[:, ::2]      # strided rows: any strides
        wire = batched.compress_rows(x, tail)
        want = torch.cat([single.compress_rows(x), tail.contiguous().view(torch.uint8)], 1)
        assert torch.equal(wire, want), (dtype, e)


class _Ops(TorchDispatchMode):
    """The aten ops a block runs, those of the Triton interpreter's own copies left out."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename != triton.runtime.interpreter.__file__:
            f = f.f_back
        if f is None:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name,params", [SCHEMES[0], SCHEMES[2], SCHEMES[6]])
def test_triton_rows_and_payloads_need_no_copy(name, params):
    """The Triton quantizers write the wire themselves (GPU path, no ``cat`` of the fields)
    and a payload's codes and scales back to back: ``Packed.flat()`` is a view."""
    comp = build_compressor(name, backend="triton", seed=3, **params)
    x = _rows(4, 256)
    with _Ops() as ops:
        wire = comp.compress_rows(x)
        packed = comp.compress(x[0])
        flat = packed.flat()
    assert "cat" not in ops.names and "copy_" not in ops.names, ops.names
    assert wire.shape[0] == 4 and flat.data_ptr() == packed.payload["codes"].data_ptr()
    assert torch.equal(flat, torch.cat([t.view(torch.uint8) for t in packed.payload.values()]))
    tail = torch.randn(8, 6)[::2]   # strided rows: read where they lie
    with _Ops() as ops:     # a tail of whole words: written after the payload by the kernel
        wire = comp.compress_rows(x, tail)
    assert "cat" not in ops.names and "copy_" not in ops.names, ops.names
    assert torch.equal(wire[:, -24:], tail.contiguous().view(torch.uint8))


@pytest.mark.parametrize("name,params", [SCHEMES[i] for i in (0, 1, 2, 6, 7)])
def test_triton_rows_read_strided_rows_in_place(name, params):
    """A reduce-scatter's compressed columns (``[P, S_c]`` of its ``[P, S]`` input, rows of
    whole groups) are quantized where they lie: the Triton kernels read the strided rows in
    place (no copy of the float32 input) where the row stride is a multiple of 16 values
    (else copied flat first), every backend with the numbers of the same rows made
    contiguous."""
    for extra in (48, 40):
        x = _rows(4, 256 + extra)[:, :256]
        want = build_compressor(name, backend="torch", seed=3, **params).compress_rows(
            x.contiguous())
        for backend in BACKENDS:
            comp = build_compressor(name, backend=backend, seed=3, **params)
            with _Ops() as ops:
                wire = comp.compress_rows(x)
            assert torch.equal(wire, want), (backend, extra)
            if backend == "triton":
                copied = {"clone", "copy_", "contiguous", "cat"} & set(ops.names)
                assert bool(copied) == (extra % 16 != 0), (extra, ops.names)


@pytest.mark.parametrize("name,params", [SCHEMES[0], SCHEMES[4], SCHEMES[6]])
def test_payload_rows_are_views_of_the_wire(name, params):
    """A receiver reads every peer's fields in place (the decoders take strided rows): no
    copy of the codes or the scales per receive, also with exact values after each payload;
    copies only where a field's start or the row stride is not a multiple of its dtype's
    size (a bf16 tail of odd length), with the same numbers."""
    comp = build_compressor(name, backend="triton", seed=3, **params)
    x = _rows(3, 256)
    for dtype, e in ((torch.float32, 0), *TAILS):
        wire = comp.compress_rows(x, torch.zeros(3, e, dtype=dtype) if e else None)
        with _Ops() as ops:
            fields = comp.payload_rows(wire, 256)
        aligned = wire.shape[1] % 4 == 0
        lo, hi = wire.data_ptr(), wire.data_ptr() + wire.numel()
        assert aligned == all(lo <= f.data_ptr() < hi for f in fields), (dtype, e)
        assert aligned == (not {"copy_", "clone", "contiguous"} & set(ops.names)), ops.names
        payload = wire[:, :wire.shape[1] - e * dtype.itemsize].contiguous()
        assert all(torch.equal(f, w) for f, w in zip(fields, comp.payload_rows(payload, 256)))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype,e", TAILS)
def test_qwd_decode_reads_the_wire_in_place(dtype, e, rows):
    """qWD's decode of the Y > 1 gathered slots (``decompress_rows``, the Triton update
    interpreted) reads every row's codes and scales in place in the wire, exact values after
    each payload: no copy of the fields where the rows are whole words (a bf16 tail of odd
    length: copied flat first), the references the torch twin rebuilds, bit for bit; given
    their place (``riders``), the exact values are copied there by the same kernel."""
    shard = 256
    make = lambda backend: get_compressor("qwd", inner=build_compressor(  # noqa: E731
        "int", bits=4, group_size=128, rounding="nearest", backend=backend))
    qwds = {b: make(b) for b in ("triton", "torch")}
    riding = make("triton")
    w = _rows(rows, shard, torch.bfloat16)
    tails = torch.randn(rows, e).to(dtype)
    for step in range(2):
        sender = qwds["torch"]    # the same rows for both (the first call: exact)
        wire = torch.cat([sender.wire_slot(w[r], r, rows, tails[r:r + 1]) for r in range(rows)])
        n = wire.shape[1] - e * dtype.itemsize
        for backend, q in qwds.items():
            with _Ops() as ops:
                q.decompress_rows(wire[:, :n], shard, torch.bfloat16)
            if step and backend == "triton":   # one row: read flat, its stride never stepped
                copied = {"copy_", "clone", "contiguous", "cat"} & set(ops.names)
                assert bool(copied) == (rows > 1 and wire.shape[1] % 4 != 0), ops.names
        assert torch.equal(qwds["triton"].reference, qwds["torch"].reference)
        # the riders copied out of the wire too (by the Triton decode where whole words)
        got = torch.full((rows, e + 3), 7.0, dtype=dtype)[:, 1:1 + e]
        with _Ops() as ops:
            riding.decompress_rows(wire, shard, torch.bfloat16, riders=got)
        assert torch.equal(got, tails)
        assert torch.equal(riding.reference, qwds["torch"].reference)
        if step:
            copied = {"copy_", "clone", "contiguous", "cat"} & set(ops.names)
            assert bool(copied) == (wire.shape[1] % 4 != 0), ops.names
        w = (w.float() + 0.01 * _rows(rows, shard)).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 3])
def test_qwd_decode_writes_the_output_too(rows):
    """qWD's update also writes the new references into the all-gather's output columns
    (``also``: a strided ``[rows, S]`` block, or the flat one row): the Triton kernel stores
    them a second time, so no copy follows; the numbers the torch twin places there."""
    shard = 256
    make = lambda backend: get_compressor("qwd", inner=build_compressor(  # noqa: E731
        "int", bits=4, group_size=128, rounding="nearest", backend=backend))
    qwds = {b: make(b) for b in ("triton", "torch")}
    w = _rows(rows, shard, torch.bfloat16)
    for step in range(3):
        wire = torch.cat([qwds["torch"].wire_slot(w[r], r, rows) for r in range(rows)])
        outs = {}
        for backend, q in qwds.items():
            out = torch.full((rows, shard + 32), 5.0, dtype=torch.bfloat16)
            with _Ops() as ops:
                q.decompress_rows(wire, shard, torch.bfloat16, out[:, 16:16 + shard])
            outs[backend] = out
            if step and backend == "triton":
                assert not {"copy_", "clone", "contiguous", "cat"} & set(ops.names), ops.names
            assert torch.equal(out[:, 16:16 + shard], q.reference.view(rows, shard))
        assert torch.equal(outs["triton"], outs["torch"])
        w = (w.float() + 0.01 * _rows(rows, shard)).to(torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params", SCHEMES)
def test_reduce_rows_is_reduce_of_the_rows(name, params, backend):
    c = build_compressor(name, backend=backend, seed=1, **params)
    x = _rows(3, 200)
    wire = c.compress_rows(x)
    got = c.reduce_rows(wire, (200,), torch.float32)
    want = c.reduce([c.unflatten(w, (200,), torch.float32) for w in wire])
    assert got.dtype == torch.float32 and got.shape == (200,)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params", SCHEMES)
@pytest.mark.parametrize("s", [256, 200, 100])
def test_reduce_rows_into_out(name, params, backend, s):
    """``out=``: the same sum written into the caller's float32 buffer (by the kernel where
    the values are whole groups, else copied), the rotated-domain sum too."""
    c = build_compressor(name, backend=backend, seed=1, **params)
    wire = c.compress_rows(_rows(3, s))
    want = c.reduce_rows(wire, (s,), torch.float32)
    out = torch.full((s,), 7.0)
    assert c.reduce_rows(wire, (s,), torch.float32, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, want)
    if name == "hadamard":
        rotated = c.reduce_rotated_rows(wire, (s,), torch.float32)
        assert torch.equal(c.reduce_rotated_rows(wire, (s,), torch.float32, out=out), rotated)
        assert torch.equal(out, rotated)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotated_rows_are_the_rotated_calls(backend):
    h = build_compressor("hadamard", backend=backend, bits=4, group_size=128, hadamard_size=32)
    g = build_compressor("hadamard", backend=backend, bits=4, group_size=128, hadamard_size=32)
    for s in (256, 100):   # whole blocks; an incomplete last block (identity)
        x = _rows(3, s)
        assert torch.equal(h.rotate_rows(x), torch.stack([g.rotate(r) for r in x]))
        strided = _rows(3, s + 64)[:, 32:s + 32]   # column slices of wider rows
        assert torch.equal(h.rotate_rows(strided), torch.stack([g.rotate(r) for r in strided]))
        y = h.rotate_rows(x)
        wire = h.compress_rotated_rows(y)
        assert torch.equal(wire, torch.stack([g.compress_rotated(r).flat() for r in y]))
        want = g.reduce_rotated([g.unflatten(w, (s,), torch.float32) for w in wire])
        assert torch.equal(h.reduce_rotated_rows(wire, (s,), torch.float32), want)


def test_loco_rows_fall_back_to_one_call_per_row():
    """A stateful scheme's default ``compress_rows``: one ``compress`` per row, in order."""
    a = build_compressor("loco", inner="int")
    b = build_compressor("loco", inner="int")
    x = _rows(3, 256)
    assert torch.equal(a.compress_rows(x), torch.stack([b.compress(r).flat() for r in x]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_keys_are_one_call_per_row(backend):
    """``(rows, 2)`` keys: row r of the noise is the noise of one call keyed by row r; the
    Triton noise kernel and the twin agree."""
    rng, ref = SeededRNG(7), SeededRNG(7)
    keys = rng.next_keys("cpu", 3)
    assert keys.shape == (3, 2) and rng.calls == 3
    x = torch.empty(3, 1000)
    impl = dispatch.pick(x, backend, noise, "triton_noise")
    got = impl.uniform_like(x, keys)
    want = torch.stack([noise.uniform_like(x[0], ref.next_keys("cpu")) for _ in range(3)])
    assert torch.equal(got, want)


def test_bad_row_keys_are_refused():
    with pytest.raises(ValueError, match="rows dividing"):
        triton_noise.noise_operand(torch.zeros(3, 2, dtype=torch.int64), 100, torch.empty(1))


def test_compiled_twins_take_row_keys():
    """The CPU path (``torch.compile`` of the twins, ``backend="auto"`` without
    ``HFCOMPRESS_COMPILE=0``): row keys give the eager twin's numbers."""
    from hfcompress.kernels import group_quant, qsgd
    keys = SeededRNG(5).next_keys("cpu", 3)
    x = _rows(3, 256).reshape(-1)
    for twin in (group_quant, qsgd):
        want = twin.quantize(x, 4, 128, keys)
        fn = dispatch.compiled(twin).quantize
        got = fn(x, 4, 128, keys)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), twin.__name__
        assert fn.graphs and None not in fn.graphs.values()   # compiled, not the eager fallback


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits,block,width", [(8, None, 37), (4, None, 37), (8, 32, 64),
                                              (4, 32, 64), (4, 32, 50)])
def test_exponential_rows_are_the_per_row_calls(bits, block, width, backend):
    """Global-QSGD's exponential all-reduce steps over all chunks at once: the numbers of the
    per-chunk calls (compress, the ``reduce_packed`` tree, decompress), the RNG in step."""
    n = 5
    make = lambda: get_compressor("global_qsgd_exp", num_peers=n, bits=bits, seed=2,  # noqa: E731
                                  backend=backend, block_size=block)
    fast, slow = make(), make()
    rows = _rows(n, width)
    local = fast.local_scale_rows(rows)
    assert torch.equal(local, torch.cat([slow.local_scale(r) for r in rows]))
    scale = local.view(n, -1).amax(0).repeat(n) if block else rows.abs().amax().reshape(1)
    per = scale.view(n, -1) if block else scale.expand(n, 1)
    codes = fast.quantize_rows(rows, scale)
    want = [slow.compress(r, scale=s) for r, s in zip(rows, per)]
    assert torch.equal(codes, torch.stack([p.payload["codes"] for p in want]))
    mine = per[0]
    got = [Packed({"scale": mine, "codes": c}, torch.Size([width]), torch.float32)
           for c in codes]
    assert torch.equal(fast.combine_rows(codes), slow.reduce_packed(got).payload["codes"])
    values = fast.dequantize_rows(codes, scale, width)
    assert torch.equal(values, torch.stack([slow.decompress(
        Packed({"scale": s, "codes": p.payload["codes"]}, torch.Size([width]), torch.float32))
        for s, p in zip(per, want)]))
    assert fast.rng.calls == slow.rng.calls


@pytest.mark.parametrize("params", [{"bits": 8, "group_size": 2048, "rounding": "nearest"},
                                    {"bits": 4, "group_size": 128, "rounding": "stochastic"}])
def test_group_slots_decode_in_place(params):
    """A gathered wire's slots (ZeRO++'s int8 weights) are decoded where they lie: the Triton
    kernel reads every row's codes and scales in the wire (exact values riding after them)
    and writes each slot into its row of the output, a strided column block of the
    all-gather's buffer, in its dtype: no copy of the fields, no decoded buffer; the numbers
    of the torch twin, for slots that are not whole groups, one slot or several; the exact
    values riding after them copied into their columns of the output by the same launch
    (``riders=``, as the all-gather's decode passes them)."""
    from hfcompress.kernels.packing import split_tail
    for rows, numel, dtype in ((3, 2048 * 2 + 100, torch.bfloat16), (1, 300, torch.float32),
                               (2, 256, torch.float16)):
        x = _rows(rows, numel, dtype)
        twin = build_compressor("int", backend="torch", **params)
        riding = torch.randn(rows, 6).to(dtype)
        wire = twin.compress_rows(x, riding)   # riders after
        body, values = split_tail(wire, wire.shape[1] - 6 * dtype.itemsize, dtype)
        assert torch.equal(values, riding)
        want = torch.full((rows, numel + 40), 7.0, dtype=dtype)
        twin.decompress_slots(body, numel, want[:, 8:8 + numel])
        want[:, 8 + numel:14 + numel] = riding
        fast = build_compressor("int", backend="triton", **params)
        for impl in (twin, fast):
            got = torch.full((rows, numel + 40), 7.0, dtype=dtype)
            with _Ops() as ops:
                impl.decompress_slots(body, numel, got[:, 8:8 + numel],
                                      riders=(got[:, 8 + numel:14 + numel], values))
            assert torch.equal(got, want), (impl.backend, rows, numel, dtype)
        assert not {"clone", "copy_", "contiguous", "cat", "_to_copy"} & set(ops.names), ops.names


def test_lattice_slots_decode_in_place():
    """QSDP's 8-bit random-shift weights: the gathered slots decoded where they lie into
    their rows of a strided output (no copy of the fields, no decoded buffer), the twin's
    numbers; 4-bit codes (packed) decode flat first, the same numbers."""
    for bits, rows, numel, dtype in ((8, 3, 32 * 5 + 7, torch.bfloat16),
                                     (8, 1, 64, torch.float32), (4, 2, 100, torch.float16)):
        x = _rows(rows, numel, dtype)
        twin = build_compressor("random_shift", backend="torch", bits=bits, bucket_size=32)
        wire = twin.compress_rows(x)
        want = torch.full((rows, numel + 24), 7.0, dtype=dtype)
        twin.decompress_slots(wire, numel, want[:, 4:4 + numel])
        fast = build_compressor("random_shift", backend="triton", bits=bits, bucket_size=32)
        got = torch.full((rows, numel + 24), 7.0, dtype=dtype)
        with _Ops() as ops:
            fast.decompress_slots(wire, numel, got[:, 4:4 + numel])
        assert torch.equal(got, want), (bits, rows, numel, dtype)
        copied = {"clone", "copy_", "contiguous", "cat", "_to_copy"} & set(ops.names)
        assert bool(copied) == (bits != 8), ops.names
