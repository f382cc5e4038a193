"""A/B of the riders' sum in the decode-sum (session 27, ``benchmarks/host_ab.py``):
sdp4bit's steps with the riders summed by the decode-sum's launch (``sums_riders`` True,
"new") and split off and summed by torch (False: the path before, "old").

    cd <repo> && PYTHONPATH=$PWD:$PWD/benchmarks HFCOMPRESS_COMPILE=0 python benchmarks/results/riders_in_decode_sum/ab_riders.py
"""
from host_ab import compare

from hfcompress.compressors.group_quant import GroupQuantizer
from hfcompress.compressors.hadamard import HadamardQuantizer


def sums_riders(on: bool) -> None:
    GroupQuantizer.sums_riders = HadamardQuantizer.sums_riders = on


compare("sdp4bit", lambda: sums_riders(False), lambda: sums_riders(True))
