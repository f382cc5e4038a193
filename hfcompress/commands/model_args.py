"""The model flags ``plan`` and ``probe`` share: ``--model`` or the decoder's sizes."""

from __future__ import annotations

import argparse

from ..cost.model_shape import ModelShape

SHAPE_FLAGS = ("hidden", "layers", "ffn", "vocab", "heads", "kv_heads", "experts",
               "experts_per_token", "tied_embeddings")


def add_model_arguments(m) -> None:
    """``--model`` or the sizes of :data:`SHAPE_FLAGS`, to a parser or a group."""
    m.add_argument("--model", metavar="NAME_OR_PATH", help="an HF config.json, a folder with "
                   "one, or a hub id already in the local HF cache (never downloaded)")
    m.add_argument("--hidden", type=int, help="hidden size")
    m.add_argument("--layers", type=int, help="decoder layers")
    m.add_argument("--ffn", type=int, help="MLP width (default: LLaMA's, 8/3 x hidden rounded "
                   "up to 256)")
    m.add_argument("--vocab", type=int, help="vocabulary (default 32000)")
    m.add_argument("--heads", type=int, help="attention heads (default hidden / 128)")
    m.add_argument("--kv-heads", type=int, help="key / value heads (GQA; default: heads)")
    m.add_argument("--experts", type=int, help="MoE experts per layer (all communicated)")
    m.add_argument("--experts-per-token", type=int, help="MoE top-k (compute only; default: "
                   "every expert computes)")
    m.add_argument("--tied-embeddings", action="store_true", default=None,
                   help="the LM head shares the embedding matrix")


def sizes_given(args: argparse.Namespace) -> bool:
    """Whether ``--model`` or any size flag was given."""
    return args.model is not None or any(getattr(args, k) is not None for k in SHAPE_FLAGS)


def model_shape(args: argparse.Namespace) -> ModelShape:
    """The model of ``--model`` or of the size flags; ValueError naming the fix."""
    given = [f"--{k.replace('_', '-')}" for k in SHAPE_FLAGS if getattr(args, k) is not None]
    if args.model is not None:
        if given:
            raise ValueError(f"--model {args.model} and {' '.join(given)}: give the model "
                             f"either as --model or as its sizes, not both")
        return ModelShape.from_config(args.model)
    if args.hidden is None or args.layers is None:
        raise ValueError("no model: give --model NAME_OR_PATH (an HF config.json, a folder, "
                         "or a cached hub id) or --hidden H --layers L [--ffn F --vocab V]")
    sizes = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    return ModelShape(**sizes, name="LLaMA-style decoder")
