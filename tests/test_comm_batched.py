"""One decode for every all-gather slot (``Compressor.decompress_slots``): bit for bit what
decoding the slots one by one gives, for every registered scheme that compresses a plain
tensor, any size (bucket-aligned or not), fp32 / bf16 / fp16."""

import pytest
import torch

from hfcompress import get_compressor, list_compressors
from hfcompress.compressors.base import ReferenceCoded

# schemes built from another (loco) or needing a reference (qwd) decode through their own paths
SCHEMES = [n for n in list_compressors() if n not in ("loco",)]


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decompress_slots_equals_slot_by_slot(name, dtype):
    c = get_compressor(name)
    if isinstance(c, ReferenceCoded):
        pytest.skip("qwd decodes its rows against references (decompress_rows)")
    g = torch.Generator().manual_seed(0)
    for numel in (1, 37, 1030, 4096):
        for rows in (1, 3):
            xs = [torch.randn(numel, generator=g).to(dtype) for _ in range(rows)]
            wire = torch.stack([c.compress(x).flat() for x in xs])
            one = torch.empty(rows, numel, dtype=dtype)
            c.decompress_slots(wire, numel, one)
            for r in range(rows):
                expect = c.decompress(c.unflatten(wire[r].clone(), (numel,), dtype))
                assert torch.equal(one[r], expect), (name, dtype, numel, rows, r)
