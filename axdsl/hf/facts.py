"""The facts of a model that Hugging Face interop compares: `Arch`, and how the spec states each.

An `Arch` holds what a Hugging Face config.json states (dims, heads, norm, rope, window,
feed-forward kind, experts, ...) under the field names of `FIELDS`, plus every parameter's path,
shape and dtype, and the structure no HF family has (`problems`). This module sits below every
other module of axdsl/hf: the families and the readers of the IR build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Arch:
    """What a spec's model is, read from its IR: the facts a Hugging Face config states."""

    name: str
    values: dict[str, Any]  # field -> value (see FIELDS)
    params: dict[tuple[str, ...], tuple[tuple[int, ...], str]]  # path -> (shape, dtype name)
    problems: list[str] = field(default_factory=list)  # structure no HF family has
    pattern: int = (
        0  # the length of a repeated pattern of blocks (blocks/0, blocks/1, ...); 0: one block
    )
    tail: int = (
        0  # layers after the scanned groups when the pattern does not divide them (blocks/tail/<e>)
    )

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)


# field -> how the spec states it (for messages)
FIELDS = {
    "vocab": "vocab",
    "dim": "dim",
    "layers": "layers",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "head_dim": "attention head_dim",
    "max_seq": "max_seq",
    "positions": "positions",
    "tied": "tied",
    "norm": "norm layer",
    "norm_eps": "norm eps",
    "norm_bias": "LayerNorm bias",
    "causal": "attention causal",
    "rope": "attention rope",
    "rope_theta": "rope_theta",
    "rope_dim": "attention rope_dim",
    "rope_scaling": "attention rope_scaling",
    "rope_factor": "attention rope_factor",
    "rope_low_freq": "attention rope_low_freq",
    "rope_high_freq": "attention rope_high_freq",
    "rope_original_max_seq": "attention rope_original_max_seq",
    "rope_beta_fast": "attention rope_beta_fast",
    "rope_beta_slow": "attention rope_beta_slow",
    "rope_untruncated": "attention rope_untruncated",
    "rope_mscale": "attention rope_mscale",
    "rope_mscale_all_dim": "attention rope_mscale_all_dim",
    "rope_attention_factor": "attention rope_attention_factor",
    "window": "attention window",
    "attn_bias": "attention bias",
    "qk_norm": "attention qk_norm",
    "qk_norm_eps": "q_norm/k_norm eps",
    "mlp": "feed-forward layer",
    "hidden": "feed-forward hidden",
    "act": "MLP act",
    "mlp_bias": "MLP bias",
    "experts": "MoE experts",
    "top_k": "MoE top_k",
    "normalize": "MoE normalize",
    "shared": "MoE shared experts",
    "block": "block layer",
    "out_bias": "attention out_bias",
    "head_bias": "head_bias",
    "shared_norm": "ParallelBlock shared_norm",
    "post_norms": "Block post_norms",
    "scale": "attention scale",
    "softcap": "attention softcap",
    "embed_multiplier": "embed_multiplier",
    "logit_softcap": "logit_softcap",
    "layer_windows": "the layers' attention windows",
    "layer_ropes": "the layers' rotary (rope_theta, rope_scaling, rope_factor)",
    "ssm_expand": "Mamba2Mixer expand",
    "ssm_head_dim": "Mamba2Mixer head_dim",
    "ssm_state": "Mamba2Mixer state",
    "ssm_groups": "Mamba2Mixer groups",
    "conv_kernel": "Mamba2Mixer conv_kernel",
    "chunk": "Mamba2Mixer chunk",
    "conv_bias": "Mamba2Mixer conv_bias",
    "mixer_eps": "Mamba2Mixer eps (its gated norm)",
    "attn": "attention layer",
    "dense_layers": "dense_layers",
    "dense_hidden": "the dense blocks' SwiGLU hidden",
    "q_rank": "MLAttention q_rank",
    "kv_rank": "MLAttention kv_rank",
    "nope_dim": "MLAttention nope_dim",
    "v_head_dim": "MLAttention v_head_dim",
    "rope_interleaved": "attention rope_interleaved",
    "groups": "DeepSeekMoE groups",
    "top_groups": "DeepSeekMoE top_groups",
    "routed_scale": "DeepSeekMoE scale",
    "score": "DeepSeekMoE score",
    "latent_norm_eps": "MLAttention kv_norm eps",
    "type_vocab": "type_vocab",
    "root": "root layer",
    "height": "height",
    "width": "width",
    "patch": "patch",
    "channels": "channels",
    "classes": "classes",
    "dec_layers": "T5 dec_layers",
    "buckets": "T5 buckets",
    "max_distance": "T5 max_distance",
}


def hv(inst: Any, name: str, default: Any = None) -> Any:
    """The value of hyperparameter `name` of an IR instance (`default` when it or the instance is absent)."""
    h = inst.hparam(name) if inst is not None else None
    return default if h is None else h.value.value


def at(root: Any, path: str) -> Any:
    """The instance at `path` (a/b/c) below `root`, or None."""
    inst = root
    for part in path.split("/"):
        inst = None if inst is None else inst.child(part)
    return inst
