"""A/B of session 28's host-path changes that can be switched off in one process
(``benchmarks/host_ab.py``): sdp4bit with the 2-hop reduce-scatter's straight-line one-hop
path and the FSDP column sets as one ``tensor_split`` ("new"), and with
``TwoHopReduceScatter._one_hop`` answering None and ``SlotLayout.split`` / ``views`` as
column slices (``runs.take`` / ``runs.view``: the path before, "old"). The version-read
trims are in both.

    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 python benchmarks/results/one_hop_host/ab_one_hop.py
"""
from host_ab import compare

from hfcompress.comm.two_hop import TwoHopReduceScatter
from hfcompress.compressors.runs import take, view
from hfcompress.integrations.exact_params import SlotLayout

NEW = (TwoHopReduceScatter._one_hop, SlotLayout.split, SlotLayout.views)
OLD = (lambda self, key, chunks, s: None,
       lambda self, rows: (take(rows, self.compressed_runs), take(rows, self.exact_runs)),
       lambda self, t: (view(t, self.compressed_runs), view(t, self.exact_runs)))


def use(paths):
    TwoHopReduceScatter._one_hop, SlotLayout.split, SlotLayout.views = paths


compare("sdp4bit", lambda: use(OLD), lambda: use(NEW))
