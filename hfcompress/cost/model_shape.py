"""The parameter shapes of a LLaMA-style decoder (LLaMA, Mistral, Mixtral, Qwen2 / Qwen3), from
an HF ``config.json`` or a few numbers, and its FSDP units on a cluster layout: what the
planner prices.

A decoder layer holds the attention projections (``q`` / ``o``: hidden x heads * head_dim,
``k`` / ``v``: hidden x kv_heads * head_dim: grouped-query attention), a gated MLP (gate, up,
down: hidden x ffn; a mixture of experts has ``experts`` of them and a router, and all of
them are communicated: FSDP gathers every expert), two RMSNorms (and Qwen3's q / k norms,
Qwen2's q / k / v biases). The root holds the embeddings, the final norm and the LM head
(one matrix with the embeddings when tied).

Units, as ``hfcompress.apply`` shards them (``integrations/fsdp.py``): one per decoder layer,
and the root, which backward does not gather again. Values are per data-parallel rank after
the tensor-parallel split (Megatron: q / k / v / gate / up and the vocabulary by rows,
o / down by columns; norms replicated) and FSDP2's dim-0 sharding (each tensor's rows padded
to a multiple of the DP size). Pipeline stages (``pp``) split the layers: the units are
those of the heaviest stage, ``ceil(layers / pp)`` layers and, with ``pp > 1``, one of the
embeddings / the head (the step waits for the slowest stage). Norms and biases (the
config's ``exact_patterns`` / ``min_numel``, QSDP 5.1) are counted as ``exact_numel``.

Training state per GPU (:meth:`ModelShape.train_state_bytes`): :data:`TRAIN_STATE_BYTES` per
parameter value a GPU holds after TP, PP and DP sharding: mixed-precision Adam as FSDP2 shards
it, bf16 parameter 2 + fp32 master 4 + two fp32 moments 8 + fp32 gradient 4 = 18 bytes (ZeRO,
Rajbhandari et al. 2020, 3.1: 16 with fp16 gradients). Not counted: activations, the gathered
units and communication buffers (so a lower bound), and Megatron's unsharded bf16 parameters
and gradient buffer (its distributed optimizer shards only the fp32 states).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..config import is_exact
from .cluster import ClusterLayout
from .units import Unit


#: bytes of training state per parameter value (module doc)
TRAIN_STATE_BYTES = 2 + 4 + 4 + 4 + 4


class ModelShapeError(ValueError):
    """A model that cannot be read into a :class:`ModelShape` (the message says why)."""


@dataclass(frozen=True)
class Tensor:
    """One parameter: its name (for ``exact_patterns``), rows x cols, and the dimension
    tensor parallelism splits (None: replicated on every TP rank)."""

    name: str
    rows: int
    cols: int = 1
    tp_dim: int | None = None

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    def per_dp_rank(self, tp: int, dp: int) -> int:
        """Values one DP rank holds: the TP shard, then FSDP2's dim-0 shard (rows padded)."""
        rows = self.rows // tp if self.tp_dim == 0 else self.rows
        cols = self.cols // tp if self.tp_dim == 1 else self.cols
        return -(-rows // dp) * cols


def default_ffn(hidden: int) -> int:
    """LLaMA's MLP width: 2/3 of 4 x hidden, rounded up to a multiple of 256 (4096 -> 11008)."""
    return 256 * -(-(8 * hidden // 3) // 256)


@dataclass(frozen=True)
class ModelShape:
    """A LLaMA-style decoder's sizes (module doc). ``heads`` defaults to hidden / 128,
    ``kv_heads`` to ``heads`` (no GQA), ``ffn`` to :func:`default_ffn`; ``experts_per_token``
    is the MoE's top-k (compute only: communication moves every expert)."""

    hidden: int
    layers: int
    ffn: int | None = None
    vocab: int = 32000
    heads: int | None = None
    kv_heads: int | None = None
    experts: int = 1
    tied_embeddings: bool = False
    head_dim: int | None = None
    experts_per_token: int | None = None
    shared_ffn: int = 0          # Qwen-MoE's shared expert (0: none)
    qkv_bias: bool = False       # Qwen2
    qk_norm: bool = False        # Qwen3
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ("hidden", "layers", "vocab", "experts"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelShapeError(f"{key}={value!r} must be a positive integer")
        for key in ("ffn", "heads", "kv_heads", "head_dim", "experts_per_token"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ModelShapeError(f"{key}={value!r} must be a positive integer or unset")
        if self.head_dim is None and self.hidden % self.n_heads:
            raise ModelShapeError(f"hidden={self.hidden} is not a multiple of heads="
                                  f"{self.n_heads}: give --heads (or the config's head_dim)")
        if self.n_heads % self.n_kv_heads:
            raise ModelShapeError(f"heads={self.n_heads} must be a multiple of kv_heads="
                                  f"{self.n_kv_heads} (grouped-query attention)")
        if isinstance(self.shared_ffn, bool) or not isinstance(self.shared_ffn, int) \
                or self.shared_ffn < 0:
            raise ModelShapeError(f"shared_ffn={self.shared_ffn!r} must be an integer >= 0")
        self._check_top_k()

    def _check_top_k(self) -> None:
        """``experts_per_token`` (the top-k) only with ``experts`` > 1, and at most them."""
        k = self.experts_per_token
        if k is None:
            return
        if self.experts == 1:
            raise ModelShapeError(f"experts_per_token={k} needs experts > 1 (the top-k of "
                                  f"a mixture of experts): give --experts N too, or no top-k")
        if k > self.experts:
            raise ModelShapeError(f"experts_per_token={k} is more than experts="
                                  f"{self.experts}: a token computes with at most every "
                                  f"expert; give a top-k <= {self.experts}")

    # -- sizes -------------------------------------------------------------------------
    @property
    def n_heads(self) -> int:
        return self.heads or max(1, self.hidden // 128)

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.n_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def mlp_width(self) -> int:
        return self.ffn or default_ffn(self.hidden)

    def layer_tensors(self) -> list[Tensor]:
        """One decoder layer's parameters (HF LLaMA / Mixtral names)."""
        h, d = self.hidden, self.dim_per_head
        q, kv = self.n_heads * d, self.n_kv_heads * d
        out = [Tensor("self_attn.q_proj.weight", q, h, 0),
               Tensor("self_attn.k_proj.weight", kv, h, 0),
               Tensor("self_attn.v_proj.weight", kv, h, 0),
               Tensor("self_attn.o_proj.weight", h, q, 1)]
        if self.qkv_bias:
            out += [Tensor("self_attn.q_proj.bias", q, 1, 0),
                    Tensor("self_attn.k_proj.bias", kv, 1, 0),
                    Tensor("self_attn.v_proj.bias", kv, 1, 0)]
        if self.qk_norm:
            out += [Tensor("self_attn.q_norm.weight", d), Tensor("self_attn.k_norm.weight", d)]

        def mlp(prefix: str, width: int) -> list[Tensor]:
            return [Tensor(f"{prefix}.gate_proj.weight", width, h, 0),
                    Tensor(f"{prefix}.up_proj.weight", width, h, 0),
                    Tensor(f"{prefix}.down_proj.weight", h, width, 1)]

        if self.experts == 1:
            out += mlp("mlp", self.mlp_width)
        else:
            out.append(Tensor("mlp.gate.weight", self.experts, h))      # the router
            for e in range(self.experts):
                out += mlp(f"mlp.experts.{e}", self.mlp_width)
            if self.shared_ffn:
                out += mlp("mlp.shared_expert", self.shared_ffn)
                out.append(Tensor("mlp.shared_expert_gate.weight", 1, h))
        return out + [Tensor("input_layernorm.weight", h),
                      Tensor("post_attention_layernorm.weight", h)]

    def embedding_tensors(self) -> list[Tensor]:
        return [Tensor("model.embed_tokens.weight", self.vocab, self.hidden, 0)]

    def head_tensors(self) -> list[Tensor]:
        head = [] if self.tied_embeddings else \
            [Tensor("lm_head.weight", self.vocab, self.hidden, 0)]
        return [Tensor("model.norm.weight", self.hidden)] + head

    @property
    def params(self) -> int:
        """All parameters (every expert)."""
        per_layer = sum(t.numel for t in self.layer_tensors())
        return self.layers * per_layer + sum(
            t.numel for t in self.embedding_tensors() + self.head_tensors())

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: a MoE's top-k experts of ``experts``."""
        if self.experts == 1 or self.experts_per_token is None:
            return self.params
        idle = self.experts - self.experts_per_token
        return self.params - self.layers * idle * 3 * self.hidden * self.mlp_width

    def train_flops(self, tokens: int, seq_len: int | None = None) -> float:
        """FLOPs of a training step on ``tokens`` tokens: ``6 x active_params x tokens``
        (forward 2, backward 4 per parameter and token; Kaplan et al. 2020), plus, with
        ``seq_len``, the attention scores and their use, ``12 x layers x heads x head_dim x
        seq_len`` per token (heads x head_dim = hidden in most models; PaLM, Chowdhery et
        al. 2022, App. B; no causal-mask saving)."""
        per_token = 6.0 * self.active_params
        if seq_len:
            per_token += 12.0 * self.layers * self.n_heads * self.dim_per_head * seq_len
        return per_token * tokens

    def compute_seconds(self, layout: ClusterLayout, micro_batch: int, seq_len: int,
                        gpu_tflops: float) -> float:
        """Seconds of one micro-batch's forward and backward on one GPU: the
        :meth:`train_flops` of a DP rank's ``micro_batch x seq_len`` tokens, split over its
        ``tp x pp x cp`` GPUs, at ``gpu_tflops`` TFLOP/s achieved (not the datasheet peak:
        e.g. 40% of it; no pipeline bubble)."""
        if not gpu_tflops > 0:
            raise ModelShapeError(f"gpu_tflops={gpu_tflops!r} must be > 0 TFLOP/s")
        gpus = layout.tp * layout.pp * layout.cp
        return self.train_flops(micro_batch * seq_len, seq_len) / gpus / (gpu_tflops * 1e12)

    def activation_bytes(self, layout: ClusterLayout, micro_batch: int, seq_len: int,
                         value_bytes: int = 2) -> int:
        """Bytes one pipeline-stage boundary passes per micro-batch and direction for one DP
        rank (the activations forward, their gradients backward: ``micro_batch x seq_len x
        hidden`` values, bf16, split over the rank's tp x cp GPUs); 0 without pipeline
        parallelism."""
        if layout.pp == 1:
            return 0
        return micro_batch * seq_len * self.hidden * value_bytes

    # -- FSDP units --------------------------------------------------------------------
    def units(self, layout: ClusterLayout, exact_patterns: Sequence[str] = ("norm", "bias"),
              min_numel: int = 0) -> list[Unit]:
        """The FSDP units one DP rank of the heaviest pipeline stage holds on ``layout``
        (module doc), one per layer: :meth:`unit_counts` spelled out."""
        (layer, count), (root, _) = self.unit_counts(layout, exact_patterns, min_numel)
        return [Unit(f"layers.{i}", layer.numel, layer.exact_numel)
                for i in range(count)] + [root]

    def unit_counts(self, layout: ClusterLayout,
                    exact_patterns: Sequence[str] = ("norm", "bias"),
                    min_numel: int = 0) -> list[tuple[Unit, int]]:
        """The units of :meth:`units` as ``(unit, count)`` pairs in forward order: the
        stage's decoder layers (all alike) once with their count, then the root, so a model
        of any depth is priced at the cost of one layer (``price_step`` takes either). A
        parameter matching ``exact_patterns`` or with fewer than ``min_numel`` values
        counts as exact."""
        tp, pp, dp = layout.tp, layout.pp, layout.dp
        self._check_split(tp, pp)

        def unit(name: str, tensors: list[Tensor], backward_gather: bool) -> Unit:
            numel = exact = 0
            for t in tensors:
                n = t.per_dp_rank(tp, dp)
                if is_exact(t.name, t.numel, exact_patterns, min_numel):
                    exact += n
                else:
                    numel += n
            return Unit(name, numel, exact, backward_gather)

        root = self.embedding_tensors() + self.head_tensors()
        if pp > 1:      # the heaviest stage: the first (embeddings) or the last (norm, head)
            root = max(self.embedding_tensors(), self.head_tensors(),
                       key=lambda ts: sum(t.numel for t in ts))
        return [(unit("layers", self.layer_tensors(), True), -(-self.layers // pp)),
                (unit("root", root, False), 1)]

    def train_state_bytes(self, layout: ClusterLayout) -> int:
        """Bytes of parameters, gradients and Adam states one GPU of the heaviest pipeline
        stage holds on ``layout``: :data:`TRAIN_STATE_BYTES` per value (module doc)."""
        return TRAIN_STATE_BYTES * sum(n * (u.numel + u.exact_numel)
                                       for u, n in self.unit_counts(layout))

    def _check_split(self, tp: int, pp: int) -> None:
        for what, size in (("heads", self.n_heads), ("kv_heads", self.n_kv_heads),
                           ("ffn", self.mlp_width), ("vocab", self.vocab)):
            if size % tp:
                raise ModelShapeError(f"tensor parallelism tp={tp} must divide {what}={size}: "
                                      f"choose a tp that divides it")
        if pp > self.layers:
            raise ModelShapeError(f"pp={pp} pipeline stages but only {self.layers} layers: "
                                  f"use pp <= {self.layers}")

    def describe(self) -> str:
        moe = f", {self.experts} experts" + (f" (top-{self.experts_per_token})"
                                            if self.experts_per_token else "") \
            if self.experts > 1 else ""
        return (f"{self.name}: {self.params / 1e9:.2f}B parameters, hidden {self.hidden}, "
                f"{self.layers} layers, ffn {self.mlp_width}, heads {self.n_heads} / kv "
                f"{self.n_kv_heads}, vocab {self.vocab}{moe}"
                f"{', tied embeddings' if self.tied_embeddings else ''}")

    # -- reading configs ---------------------------------------------------------------
    @classmethod
    def from_config(cls, name_or_path: str) -> ModelShape:
        """From an HF ``config.json``: a file, a directory holding one, or a hub id whose
        config is in the local HF cache (never the network: a hub id not cached fails at
        once). Reads the JSON itself (no transformers import)."""
        path = os.path.expanduser(name_or_path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
            if not os.path.isfile(path):
                raise ModelShapeError(f"{name_or_path!r} is a directory without config.json")
        elif not os.path.isfile(path):
            path = _cached_hub_config(name_or_path)
        try:
            with open(path) as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ModelShapeError(f"cannot read the model config {path!r}: {e}") from e
        return cls.from_dict(config, name=name_or_path)

    @classmethod
    def from_dict(cls, config: dict[str, Any], name: str = "custom") -> ModelShape:
        """From the dict of an HF ``config.json`` (LLaMA / Mistral / Mixtral / Qwen2 /
        Qwen3 and their MoE variants; a multimodal config's ``text_config``)."""
        if not isinstance(config, dict):
            raise ModelShapeError(f"model config {name!r} is a JSON {_json_kind(config)}, not "
                                  f"an object: give an HF config.json (an object with "
                                  f"hidden_size, num_hidden_layers, ...) or --hidden / --layers")
        if isinstance(config.get("text_config"), dict):
            config = {**config["text_config"],
                      "tie_word_embeddings": config["text_config"].get(
                          "tie_word_embeddings", config.get("tie_word_embeddings", False))}
        missing = [k for k in ("hidden_size", "num_hidden_layers") if k not in config]
        if missing:
            raise ModelShapeError(f"model config {name!r} has no {', '.join(missing)}: not a "
                                  f"LLaMA-style decoder config (model_type "
                                  f"{config.get('model_type')!r}); give --hidden / --layers")
        model_type = str(config.get("model_type", ""))
        experts = config.get("num_local_experts") or config.get("num_experts") or 1
        if isinstance(experts, bool) or not isinstance(experts, int):
            raise ModelShapeError(f"model config {name!r}: num_local_experts / num_experts="
                                  f"{experts!r} must be a positive integer")
        ffn = config.get("intermediate_size")
        if experts > 1 and config.get("moe_intermediate_size"):
            ffn = config["moe_intermediate_size"]
        return cls(hidden=config["hidden_size"], layers=config["num_hidden_layers"], ffn=ffn,
                   vocab=config.get("vocab_size", 32000),
                   heads=config.get("num_attention_heads"),
                   kv_heads=config.get("num_key_value_heads"), experts=experts,
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   head_dim=config.get("head_dim"),
                   experts_per_token=config.get("num_experts_per_tok") if experts > 1 else None,
                   shared_ffn=config.get("shared_expert_intermediate_size") or 0,
                   qkv_bias=bool(config.get("attention_bias",
                                            model_type.startswith("qwen2"))),
                   qk_norm=model_type.startswith("qwen3"), name=name)


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type: array, number, string, ..."""
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _cached_hub_config(name: str) -> str:
    """The cached ``config.json`` of hub id ``name`` (huggingface_hub's cache lookup: no
    network); ModelShapeError at once when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
        path = try_to_load_from_cache(name, "config.json")
    except ImportError:
        path = None
    except Exception:  # noqa: BLE001 (huggingface_hub rejects an invalid repo id)
        path = None
    if not isinstance(path, str):
        raise ModelShapeError(
            f"{name!r} is neither a config.json file, a directory with one, nor a hub id in "
            f"the local Hugging Face cache (the planner never downloads). Download it once "
            f"(huggingface-cli download {name} config.json), pass the path of its "
            f"config.json, or give the sizes: --hidden H --layers L [--ffn F --vocab V]")
    return path

