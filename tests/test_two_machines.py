"""A 2-machine launch, emulated by two ``torchrun`` launchers on this host (``--nnodes 2``,
``--node_rank 0`` / ``1``, one process each, a static rendezvous on 127.0.0.1): the Trainer
on global rank 0 logs the run's summary, and the other machine's local rank 0 says one line
of its own that hfcompress is on there (before, machine 2 printed nothing at all).
``HFCOMPRESS_HOSTNAME`` gives each launcher its own host name, so ``ranks_per_node`` resolves
from ``LOCAL_WORLD_SIZE`` (1) without the one-host warning, as on two real machines."""

import os
import subprocess
import sys
import textwrap

from hfcompress.testing import free_port
from test_readme_snippets import logged

SCRIPT = textwrap.dedent("""
    import sys, torch
    import hfcompress
    from hfcompress.testing import tiny_llama
    model = tiny_llama()
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 256, (16, 32))]
    args = hfcompress.TrainingArguments(
        output_dir=sys.argv[1], comm_compressor="sdp4bit", max_steps=2, logging_steps=1,
        per_device_train_batch_size=4, fsdp=True, fsdp_config={"version": 2},
        save_strategy="no", report_to=[], disable_tqdm=True)
    hfcompress.Trainer(model=model, args=args, train_dataset=data).train()
""")                                                    # and a plain exit, as a user's script


def test_the_other_machine_says_it_is_on(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    port = free_port()
    env_args = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *env_args, "--node_rank", str(node),
         str(tmp_path / "train.py"), str(tmp_path / "out")], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "HFCOMPRESS_COMPILE": "0", "HF_HUB_OFFLINE": "1",
             "HFCOMPRESS_HOSTNAME": f"machine{node}"})
        for node in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    first, second = outs
    line = "installed on this machine (rank 1 and its local peers)"
    assert line in second and second.count("hfcompress: comm_compressor") == 1, second[-3000:]
    assert "splits host" not in first + second       # two host names: the real layout
    assert line not in first and "hfcompress: FSDP2 comm_compressor 'sdp4bit'" in first, \
        first[-3000:]
    # transformers logs on each machine (log_on_each_node): the job's figures, the same
    assert logged(first, "comm/inter_node_bytes") == logged(second, "comm/inter_node_bytes")
    assert len(logged(first, "comm/inter_node_bytes")) == 2
