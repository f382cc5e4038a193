#!/usr/bin/env bash
# The README's main job: a small LLaMA trained on Shakespeare by 2 processes with FSDP2 and
# SDP4Bit communication (each process its own emulated node, so the 4-bit inter-node hop is
# used); prints the loss, the held-out loss and the bytes sent vs. exact collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
exec accelerate launch --config_file trainer_examples/configs/fsdp2.yaml --num_processes 2 \
    trainer_examples/finetune_llama.py --comm_compressor sdp4bit --ranks_per_node 1 "$@"
