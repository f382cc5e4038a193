"""The Trainer's communication totals (``hfcompress.trainer.metrics.CommStats``): warm-up
time apart from the steady state, inter- / intra-node bytes, totals carried through a
checkpoint. One process (no process group: the reduce is the identity)."""

import pytest

from hfcompress.comm.wire_meter import WireMeter
from hfcompress.trainer.metrics import WARMUP_STEPS, CommStats

STEP = {"intra_bytes": 10, "inter_bytes": 100, "uncompressed_intra_bytes": 40,
        "uncompressed_inter_bytes": 400}


def run_steps(stats: CommStats, seconds: list[float], log_every: int) -> list[dict]:
    """Each step spends ``seconds[i]`` in the collectives (added to the meter's CPU timer as
    ``with meter.timed(cpu)`` would: exact, whatever the machine's load); a reduce every
    ``log_every`` steps."""
    logs = []
    for i, s in enumerate(seconds):
        stats.meter.timer.seconds += s
        stats.close_step(STEP)
        if (i + 1) % log_every == 0:
            logs.append(stats.reduce())
    return logs


@pytest.mark.parametrize("log_every", [1, 2, 3])
def test_warmup_time_is_apart_from_the_steady_state(log_every):
    """A slow first two steps (compilation) do not count in the steady time per step,
    whatever the logging cadence; the total still holds every second."""
    stats = CommStats(WireMeter())
    assert WARMUP_STEPS == 2
    logs = run_steps(stats, [0.3, 0.15, 0.01, 0.01, 0.01, 0.01], log_every)
    t = stats.total_logs()
    assert t["comm/total_steps"] == 6 and t["comm/total_warmup_steps"] == 2
    assert t["comm/total_warmup_time_s"] == pytest.approx(0.45)
    assert t["comm/total_steady_time_s_per_step"] == pytest.approx(0.01)
    assert t["comm/total_time_s"] == pytest.approx(
        t["comm/total_warmup_time_s"] + 4 * t["comm/total_steady_time_s_per_step"])
    # the per-step logs keep every second too
    steps_per_log = [log_every] * len(logs)
    assert sum(log["comm/time_s"] * n for log, n in zip(logs, steps_per_log)) == \
        pytest.approx(t["comm/total_time_s"])
    assert t["comm/total_inter_node_bytes"] == 600 and t["comm/total_intra_node_bytes"] == 60
    assert t["comm/total_bytes"] == 660 and t["comm/total_uncompressed_bytes"] == 2640
    assert logs[0]["comm/compression_ratio"] == 4.0
    # the network's own figures: 400 of the 440 uncompressed bytes a step cross nodes
    assert t["comm/total_uncompressed_inter_node_bytes"] == 2400
    assert logs[0]["comm/uncompressed_inter_node_bytes"] == 400
    assert logs[0]["comm/inter_node_compression_ratio"] == 4.0


def test_no_steady_time_before_the_warmup_ends():
    stats = CommStats(WireMeter())
    run_steps(stats, [0.01, 0.01], 1)
    t = stats.total_logs()
    assert t["comm/total_warmup_steps"] == 2 and "comm/total_steady_time_s_per_step" not in t


def test_totals_continue_from_a_checkpoint():
    """A resumed run's totals cover the steps before the checkpoint too; its own first steps
    are a second warm-up (the kernels compile again in the new processes)."""
    first = CommStats(WireMeter())
    run_steps(first, [0.05, 0.05, 0.01, 0.01], 2)
    saved = first.state_dict()
    resumed = CommStats(WireMeter())
    resumed.load_state_dict(saved)
    run_steps(resumed, [0.05, 0.05, 0.01, 0.01], 2)
    t = resumed.total_logs()
    assert t["comm/total_steps"] == 8 and t["comm/total_warmup_steps"] == 4
    assert t["comm/total_bytes"] == 8 * 110
    assert t["comm/total_warmup_time_s"] == pytest.approx(0.2)
    assert t["comm/total_steady_time_s_per_step"] == pytest.approx(0.01)


def test_the_network_ratio_apart_from_the_node_local_bytes():
    """HSDP / a 2-hop layout: bytes that stay in a node exact (40 of 40) pull the overall
    ratio down (440 / 140 = 3.14); the inter-node ratio is the network's alone (4.0)."""
    stats = CommStats(WireMeter())
    stats.close_step({"intra_bytes": 40, "inter_bytes": 100, "uncompressed_intra_bytes": 40,
                      "uncompressed_inter_bytes": 400})
    log = stats.reduce()
    assert log["comm/compression_ratio"] == pytest.approx(440 / 140)
    assert log["comm/inter_node_compression_ratio"] == 4.0
