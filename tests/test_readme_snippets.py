"""Every ```python block of README.md runs as printed.

A snippet's first line names its file and how it is started: ``# NAME.py; run: COMMAND``
(``python``, ``accelerate launch`` or ``torchrun``; a parenthesised remark may follow). Each is
written, unchanged, to NAME.py in its own temporary directory and started by that command in
a fresh subprocess, offline, with this interpreter; only a free rendezvous port is added, so
parallel test runs do not collide. What the README promises next to a snippet is checked in
its output (the Trainer's ``comm/*`` log keys, fewer bytes than the exact collectives).

docs/checkpoints.md's checkpoint table (quoted in the README) has numbers that are ``cost.state.estimate_state_bytes`` of the model
size it names (that estimate matched the saved state to 0.1%: docs/checkpoints.md).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from hfcompress.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHECKPOINTS = (ROOT / "docs" / "checkpoints.md").read_text()
HEADER = re.compile(r"# (\w+\.py); run: (.+?)(?: \(.*\))?")
COMM_KEYS = ("comm/inter_node_bytes", "comm/compression_ratio", "comm/time_s")


def snippets() -> dict[str, tuple[list[str], str]]:
    """{file name: (command, code)} of every ```python block, in README order."""
    out = {}
    for code in re.findall(r"```python\n(.*?)```", README, re.S):
        first = code.splitlines()[0]
        m = HEADER.fullmatch(first)
        assert m, f"a README snippet must start with '# NAME.py; run: COMMAND': {first!r}"
        assert m[1] not in out, f"two README snippets are named {m[1]}"
        out[m[1]] = (shlex.split(m[2]), code)
    return out


def argv_for(command: list[str], name: str) -> list[str]:
    """The printed command, started with this interpreter (and a free port)."""
    assert command[-1] == name, f"{name}: the command {command} does not run {name}"
    tool, rest = command[0], command[1:]
    if tool == "python":
        return [sys.executable, *rest]
    if tool == "accelerate" and rest[0] == "launch":
        return [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port",
                str(free_port()), *rest[1:]]
    if tool == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--master_port",
                str(free_port()), *rest]
    raise AssertionError(f"{name}: unknown launcher {tool!r} (python, accelerate, torchrun)")


def run_snippet(name: str, tmp_path: Path) -> str:
    command, code = SNIPPETS[name]
    (tmp_path / name).write_text(code)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT),
           # eager CPU kernels (as the rest of the suite): the same numbers, no ~90 s compile
           "HFCOMPRESS_COMPILE": os.environ.get("HFCOMPRESS_COMPILE", "0")}
    proc = subprocess.run(argv_for(command, name), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    # no abort at exit tolerated: hfcompress drains its gloo callbacks (comm/exit_drain.py)
    assert proc.returncode == 0, f"{name} ({' '.join(command)}) failed:\n{out[-4000:]}"
    return out


def logged(out: str, key: str) -> list[float]:
    """Every value the Trainer logged under ``key`` (its console dicts)."""
    return [float(v) for v in re.findall(rf"'{re.escape(key)}': '?([-\d.e+]+)'?", out)]


SNIPPETS = snippets()


def test_every_snippet_is_tested():
    assert list(SNIPPETS) == ["train.py", "sft.py", "loop.py", "codec.py"], list(SNIPPETS)


def test_trainer_snippet(tmp_path):
    """The promised keys appear in the logs (every ``logging_steps``) and it compresses."""
    out = run_snippet("train.py", tmp_path)
    for key in COMM_KEYS:
        assert len(logged(out, key)) == 2, (key, out[-3000:])      # steps 5 and 10
    assert min(logged(out, "comm/compression_ratio")) > 3, out[-3000:]
    assert min(logged(out, "comm/inter_node_bytes")) > 0, out[-3000:]
    assert (tmp_path / "out" / "checkpoint-10" / "hfcompress_rank1.pt").exists()


def test_sft_lora_snippet(tmp_path):
    """TRL's SFTTrainer with the mixin and LoRA: trains on a CPU-only machine and compresses
    (the frozen base weights cross the emulated nodes once)."""
    out = run_snippet("sft.py", tmp_path)
    for key in COMM_KEYS:
        assert len(logged(out, key)) == 2, (key, out[-3000:])      # steps 2 and 4
    assert min(logged(out, "comm/compression_ratio")) > 3, out[-3000:]
    ckpt = tmp_path / "out-sft" / "checkpoint-4"
    assert (ckpt / "adapter_model.safetensors").exists() and (ckpt / "hfcompress_rank0.pt").exists()


def test_apply_snippet(tmp_path):
    """Each rank prints its bytes to the other node, well under the exact collectives' (the
    two ranks' lines may interleave on one line: not anchored)."""
    out = run_snippet("loop.py", tmp_path)
    sent = re.findall(r"sent ([\d,]*\d) bytes to the other node, not ([\d,]*\d)", out)
    assert len(sent) == 2, out[-3000:]
    for got, exact in sent:
        assert 0 < int(got.replace(",", "")) < int(exact.replace(",", "")) / 3, sent
    assert {p.name for p in tmp_path.glob("comm_state_rank*.pt")} == \
        {"comm_state_rank0.pt", "comm_state_rank1.pt"}


def test_compressor_snippet(tmp_path):
    out = run_snippet("codec.py", tmp_path)
    m = re.search(r"^(\d+) bytes on the wire \(scales, padding\) instead of 40000; "
                  r"largest error ([\d.]+)$", out, re.M)
    assert m, out[-2000:]
    # 4-bit codes plus one scale per group of 128: about 5,000 bytes, 8x fewer than fp32
    assert 5000 <= int(m[1]) < 5500 and float(m[2]) < 1.0, m.groups()


def test_checkpoint_table_is_the_estimate():
    """docs/checkpoints.md's per-rank state (the README quotes it) at P = 1B, bf16, 8 ranks
    per node (2 nodes), and 1 rank per node; the LoRA adapter of Llama-3.2-1B's shapes (r=8 on
    q/v, fp32)."""
    import torch

    from hfcompress.cost.state import estimate_state_bytes

    def total(preset, world, per_node):
        return sum(estimate_state_bytes(preset, [10**9 // world], world, per_node,
                                        torch.bfloat16).values())

    table = CHECKPOINTS.split("| preset | state per rank and checkpoint |", 1)[1].split("\n\n")[0]
    rows = {cells[1].strip(): cells[3].strip()
            for cells in (line.split("|") for line in table.splitlines()[2:])}
    assert total("sdp4bit", 16, 8) == total("qwd", 16, 8) == 250 * 10**6
    assert total("sdp4bit", 2, 1) == 2 * 10**9
    assert rows["`sdp4bit`, `qwd`"] == "250 MB (2.0 GB at X = 1)"
    assert round(total("loco", 16, 8) / 1e9, 2) == round(total("loco_zeropp", 16, 8) / 1e9,
                                                         2) == 1.16
    assert round(total("loco", 16, 1) / 1e9, 2) == 1.03
    assert rows["`loco`, `loco_zeropp`"] == "1.16 GB (1.03 GB at X = 1)"
    for preset in ("qw", "ulq", "tlq", "tlq_hs", "zeropp", "qsdp", "qsdp_learned"):
        assert total(preset, 16, 8) == 0, preset        # RNG streams and levels: not counted
    # r=8 LoRA on q_proj (2048 -> 2048) and v_proj (2048 -> 512) of 16 layers, fp32
    adapter = 16 * 8 * ((2048 + 2048) + (2048 + 512)) * 4
    assert rows["LoRA adapter, for scale"] == f"{adapter / 1e6:.1f} MB" == "3.4 MB"
