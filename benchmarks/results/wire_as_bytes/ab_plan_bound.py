"""What a per-unit plan could buy (issue 35, session 32): sdp4bit's host time per step with
parts of its path replaced by straight-line code that decides nothing ("new"), against the
real path ("old"), in one process (``benchmarks/host_ab.py``). Not a fix: the replacements
serve only this benchmark's case (world size 1 under the one-rank switch, one hop, exact
columns riding, launches stubbed), so the gain is an upper bound of what planning that part
once per unit saves.

    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 \\
        python benchmarks/results/wire_as_bytes/ab_plan_bound.py layers|wrappers|both [rounds]

``layers``: the reduce-scatter's one hop (``TwoHopReduceScatter._single``: the compressor's
``compress_rows`` / ``reduce_rows``, ``Exchange``, the rider and result decisions) and the
all-gather's one-node path (``ShardedReferences.__call__``) as the kernel-wrapper calls,
their collective and a meter record, nothing between. ``wrappers``: the four kernel
wrappers (qWD difference row, dequantize-add, Hadamard quantize rows, decode-sum) as a
lookup of their first result per operands (no plan lookup, no launch call). ``both``: the
two together.
"""
import sys

import torch
import torch.distributed as dist
from host_ab import compare

from hfcompress.comm import reference_gather as RG
from hfcompress.comm import two_hop
from hfcompress.comm.hop import all_gather_single
from hfcompress.comm.reduce_scatter import result_target
from hfcompress.kernels import triton_group_quant as GQ
from hfcompress.kernels import triton_hadamard as TH


def single_hop(self, hop, output, rows, op, exact):
    c = self.streams[hop].compressor
    target, post = result_target(output, op, 1, hop in self._spaced_hops)
    noise = c._q._keys(rows.device, rows.shape[0])
    send = TH.quantize_rows(rows, rows.shape[0], c.bits, c.group_size, c.hadamard_size, noise,
                            exact[0])
    recv = torch.empty_like(send)
    work = dist.all_to_all_single(recv, send, group=self.topology.inter_group, async_op=True)
    self.meter.record(self.tag, 0, 0)
    work.wait()
    spec = c.payload_spec(output.numel())
    TH.dequantize_sum_wire(recv, spec["codes"][1], spec["scales"][1], c.bits, c.group_size,
                           c.hadamard_size, True, out=target, post=post,
                           riders=(exact[1], exact[0].dtype, None))


def one_node(self, out, slot, group, unchanged, meter, tag, async_op=False, sent=None,
             exact=None, columns=None):
    if self.qwd.reference is None:   # the first, exact, gather
        return REAL[(RG.ShardedReferences, "__call__")](self, out, slot, group, unchanged, meter,
                                                        tag, async_op, sent, exact, columns)
    s = slot.numel()
    row = self.qwd.wire_slot(slot, 0, 1, exact[0])
    wire = torch.empty(1, row.shape[1], dtype=torch.uint8, device=row.device)
    all_gather_single(wire, row, group=self.route(group).inter)
    meter.record(tag, 0, 0)
    self.qwd.decompress_rows(wire, s, slot.dtype, RG._placed_view(out, columns, 1, s), exact[1])


def first_result(f):
    cache = {}

    def call(*args, **kwargs):
        key = tuple((a.shape, a.stride(), a.data_ptr()) if isinstance(a, torch.Tensor) else a
                    for a in args[:2])
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = f(*args, **kwargs)
        return hit
    return call


PARTS = {"layers": {(two_hop.TwoHopReduceScatter, "_single"): single_hop,
                    (RG.ShardedReferences, "__call__"): one_node},
         "wrappers": {(m, n): first_result(getattr(m, n)) for m, n in
                      ((GQ, "quantize_difference_row"), (GQ, "dequantize_add_wire"),
                       (TH, "quantize_rows"), (TH, "dequantize_sum_wire"))}}
PARTS["both"] = {**PARTS["layers"], **PARTS["wrappers"]}
REAL = {k: getattr(*k) for part in PARTS.values() for k in part}

if __name__ == "__main__":
    part = PARTS[sys.argv[1]]
    compare("sdp4bit", lambda: [setattr(*k, REAL[k]) for k in part],
            lambda: [setattr(*k, v) for k, v in part.items()],
            rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 10)
