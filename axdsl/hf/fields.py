"""config.json -> the facts an `Arch` states: one table row per field and family.

`hf_values` walks the family's table (`GPT2_FIELDS` or `DECODER_FIELDS`) and the config keys
axdsl cannot express (`GPT2_UNSUPPORTED`, `DECODER_UNSUPPORTED`). Missing keys take the defaults
of transformers' config classes. Each row names the config.json key a mismatch message quotes
(`model_type` for a fact of the family itself, such as GPT-2's LayerNorm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

# GELU variants that equal jax.nn.gelu's default (the tanh approximation).
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_GPT2_ACTS = {**{a: "gelu" for a in TANH_GELU}, "relu": "relu", "silu": "silu", "swish": "silu"}
# family -> (rms_norm_eps, rope_theta) defaults
_DECODER_DEFAULTS = {
    "deepseek_v3": (1e-6, 10000.0),
    "llama": (1e-6, 10000.0),
    "mistral": (1e-6, 10000.0),
    "mixtral": (1e-5, 1e6),
    "qwen2": (1e-6, 10000.0),
    "qwen3": (1e-6, 10000.0),
    "qwen3_moe": (1e-6, 10000.0),
    "phi": (1e-5, 10000.0),
    "gpt_neox": (1e-5, 10000.0),
    "gemma2": (1e-6, 10000.0),
    "gemma3_text": (1e-6, 10000.0),
}
# The parallel-residual families' partial rotary defaults (transformers' config classes)
_PARTIAL_DEFAULTS = {"phi": 0.5, "gpt_neox": 0.25}


@dataclass(frozen=True)
class Config:
    """One config.json and its family, as the rows read them."""

    family: str
    cfg: dict

    def get(self, key: str, default: Any = None) -> Any:
        """`cfg[key]`, or `default` when the key is missing or null."""
        return self.cfg[key] if self.cfg.get(key) is not None else default

    def flag(self, key: str, default: bool) -> bool:
        return bool(self.cfg.get(key, default))

    @property
    def rms_eps(self) -> float:
        return float(self.get("rms_norm_eps", _DECODER_DEFAULTS[self.family][0]))

    @property
    def rope(self) -> tuple[float, str]:
        """(theta, rope_type) from rope_parameters, rope_scaling or the top level."""
        rp = self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}
        theta = rp.get("rope_theta", self.cfg.get("rope_theta", self.cfg.get("rotary_emb_base")))
        kind = rp.get("rope_type", rp.get("type", "default"))
        return float(_DECODER_DEFAULTS[self.family][1] if theta is None else theta), kind

    @property
    def rope_params(self) -> dict:
        """rope_parameters (transformers 5) or rope_scaling (older configs)."""
        return self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}

    @property
    def partial_rotary(self) -> float:
        """The rotating fraction of each head (rope_parameters, the top level, or GPT-NeoX's rotary_pct)."""
        default = self.get("rotary_pct", _PARTIAL_DEFAULTS.get(self.family, 1.0))
        return float(
            self.rope_param("partial_rotary_factor", self.get("partial_rotary_factor", default))
        )

    def rope_param(self, key: str, default: Any) -> Any:
        value = self.rope_params.get(key)
        return default if value is None else value


@dataclass(frozen=True)
class Row:
    """One Arch field read from config.json, for the families named (None: every one)."""

    field: str
    key: str | Callable[[Config], str]  # what a mismatch message quotes
    value: Callable[[Config], Any]
    raw: Callable[[Config], Any] | None = None  # the quoted value, when not `value`
    families: tuple[str, ...] | None = None


def _key(key: str, default: Any, field: str) -> Row:
    """A field that is one config key, with transformers' default."""
    return Row(field, key, lambda c: c.get(key, default))


def _fact(field: str, value: Any, families: tuple[str, ...] | None = None) -> Row:
    """A field the family fixes (quoted as `model_type=<family>`)."""
    return Row(field, "model_type", lambda c: value, lambda c: c.family, families)


def _experts_key(c: Config) -> str:
    return "num_experts" if "num_experts" in c.cfg else "num_local_experts"


def _head_dim(c: Config) -> int:
    dim, heads = c.get("hidden_size", 4096), c.get("num_attention_heads", 32)
    default = {"qwen3": 128, "gemma2": 256, "gemma3_text": 256}.get(c.family, dim // heads)
    return c.get("head_dim", default)


def _layers(c: Config) -> int:
    return c.get(
        "num_hidden_layers", c.get("n_layer", 26 if c.family in ("gemma2", "gemma3_text") else 32)
    )


def _uniform_windows(window: Callable[[Config], int]) -> Callable[[Config], tuple[int, ...]]:
    return lambda c: (window(c),) * _layers(c)


# Facts every family without Gemma's extras states: no attention scale or soft cap of its own, no
# embedding multiplier or final soft cap.
_PLAIN = (
    _fact("scale", 0.0),
    _fact("softcap", 0.0),
    _fact("embed_multiplier", 1.0),
    _fact("logit_softcap", 0.0),
)


def _window(c: Config) -> int:
    return c.get(
        "sliding_window", 4096 if c.family == "mistral" and "sliding_window" not in c.cfg else 0
    )


# Hugging Face rope_type -> axdsl's Attention(rope_scaling = ...)
_SCALINGS = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}
# which of the rope_* fields each scaling reads (the others are not compared)
ROPE_SCALING_FIELDS = {
    "none": (),
    "linear": ("rope_factor",),
    "llama3": ("rope_factor", "rope_low_freq", "rope_high_freq", "rope_original_max_seq"),
    "yarn": (
        "rope_factor",
        "rope_original_max_seq",
        "rope_beta_fast",
        "rope_beta_slow",
        "rope_untruncated",
        "rope_mscale",
        "rope_mscale_all_dim",
        "rope_attention_factor",
    ),
}
ROPE_FIELDS = tuple(sorted({f for fields in ROPE_SCALING_FIELDS.values() for f in fields}))

_WINDOWED = ("mistral", "mixtral")
_UNWINDOWED = ("llama", "qwen2", "qwen3", "qwen3_moe")
_O_BIASED = (
    "llama",
    "mistral",
    "mixtral",
    "qwen3",
    "qwen3_moe",
)  # attention_bias covers o_proj too
_QWEN3 = ("qwen3", "qwen3_moe")
_MOE = ("mixtral", "qwen3_moe")
_SWIGLU = ("llama", "mistral", "qwen2", "qwen3")

ROPE_ROWS = (
    Row("rope_theta", "rope_theta", lambda c: c.rope[0]),
    Row("rope_scaling", "rope_type", lambda c: _SCALINGS.get(c.rope[1], c.rope[1])),
    Row("rope_factor", "factor", lambda c: float(c.rope_param("factor", 1.0))),
    Row("rope_low_freq", "low_freq_factor", lambda c: float(c.rope_param("low_freq_factor", 1.0))),
    Row(
        "rope_high_freq", "high_freq_factor", lambda c: float(c.rope_param("high_freq_factor", 4.0))
    ),
    Row(
        "rope_original_max_seq",
        "original_max_position_embeddings",
        lambda c: c.rope_param("original_max_position_embeddings", 0),
    ),
    Row("rope_beta_fast", "beta_fast", lambda c: float(c.rope_param("beta_fast", 32.0))),
    Row("rope_beta_slow", "beta_slow", lambda c: float(c.rope_param("beta_slow", 1.0))),
    Row("rope_untruncated", "truncate", lambda c: not c.rope_param("truncate", True)),
    Row("rope_mscale", "mscale", lambda c: float(c.rope_param("mscale", 1.0) or 0.0)),
    Row(
        "rope_mscale_all_dim",
        "mscale_all_dim",
        lambda c: float(c.rope_param("mscale_all_dim", 0.0) or 0.0),
    ),
    Row(
        "rope_attention_factor",
        "attention_factor",
        lambda c: float(c.rope_param("attention_factor", 0.0)),
    ),
    Row(
        "rope_dim",
        "partial_rotary_factor",
        lambda c: int(_head_dim(c) * c.partial_rotary),
        lambda c: c.partial_rotary,
    ),
)

GPT2_FIELDS = (
    _key("vocab_size", 50257, "vocab"),
    _key("n_embd", 768, "dim"),
    _key("n_layer", 12, "layers"),
    _key("n_head", 12, "heads"),
    _key("n_head", 12, "kv_heads"),
    Row("head_dim", "n_embd/n_head", lambda c: c.get("n_embd", 768) // c.get("n_head", 12)),
    _key("n_positions", 1024, "max_seq"),
    _fact("positions", "learned"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", True)),
    _fact("norm", "LayerNorm"),
    Row("norm_eps", "layer_norm_epsilon", lambda c: float(c.get("layer_norm_epsilon", 1e-5))),
    _fact("norm_bias", True),
    _fact("causal", True),
    _fact("rope", False),
    _fact("window", 0),
    _fact("attn_bias", True),
    _fact("qk_norm", False),
    _fact("mlp", "MLP"),
    Row("hidden", "n_inner", lambda c: c.get("n_inner", 4 * c.get("n_embd", 768))),
    Row(
        "act",
        "activation_function",
        lambda c: _GPT2_ACTS.get(
            c.get("activation_function", "gelu_new"), c.get("activation_function", "gelu_new")
        ),
        lambda c: c.get("activation_function", "gelu_new"),
    ),
    _fact("mlp_bias", True),
    _fact("block", "Block"),
    _fact("post_norms", False),
    _fact("out_bias", True),
    _fact("head_bias", False),
    *_PLAIN,
    Row("layer_windows", "n_layer", lambda c: (0,) * _layers(c), lambda c: c.get("n_layer", 12)),
)

DECODER_FIELDS = (  # llama, mistral, mixtral, qwen3, qwen3_moe
    _key("vocab_size", 32000, "vocab"),
    _key("hidden_size", 4096, "dim"),
    _key("num_hidden_layers", 32, "layers"),
    _key("num_attention_heads", 32, "heads"),
    Row(
        "kv_heads",
        "num_key_value_heads",
        lambda c: c.get("num_key_value_heads", c.get("num_attention_heads", 32)),
    ),
    Row("head_dim", "head_dim", _head_dim),
    _fact("positions", "rope"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", False)),
    _fact("norm", "RMSNorm"),
    Row("norm_eps", "rms_norm_eps", lambda c: c.rms_eps),
    _fact("causal", True),
    _fact("rope", True),
    *ROPE_ROWS,
    Row("window", "sliding_window", _window, lambda c: c.cfg.get("sliding_window"), _WINDOWED),
    Row(
        "window",
        "use_sliding_window",
        lambda c: 0,
        lambda c: c.flag("use_sliding_window", False),
        _UNWINDOWED,
    ),
    Row(
        "attn_bias", "attention_bias", lambda c: c.flag("attention_bias", False), families=_O_BIASED
    ),
    Row(
        "out_bias", "attention_bias", lambda c: c.flag("attention_bias", False), families=_O_BIASED
    ),
    _fact(
        "attn_bias", True, ("qwen2",)
    ),  # Qwen2: q, k and v have biases, the output projection none
    _fact("out_bias", False, ("qwen2",)),
    _fact("block", "Block"),
    _fact("post_norms", False),
    _fact("head_bias", False),
    *_PLAIN,
    Row(
        "layer_windows",
        "sliding_window",
        _uniform_windows(_window),
        lambda c: c.cfg.get("sliding_window"),
        _WINDOWED,
    ),
    Row(
        "layer_windows",
        "use_sliding_window",
        _uniform_windows(lambda c: 0),
        lambda c: c.flag("use_sliding_window", False),
        _UNWINDOWED,
    ),
    _fact("qk_norm", True, _QWEN3),
    _fact("qk_norm", False, ("llama", "mistral", "mixtral", "qwen2")),
    Row("qk_norm_eps", "rms_norm_eps", lambda c: c.rms_eps, families=_QWEN3),
    _fact("mlp", "MoE", _MOE),
    _fact("mlp", "SwiGLU", _SWIGLU),
    Row(
        "experts",
        _experts_key,
        lambda c: c.get(_experts_key(c), 8 if c.family == "mixtral" else 128),
        families=_MOE,
    ),
    Row(
        "top_k",
        "num_experts_per_tok",
        lambda c: c.get("num_experts_per_tok", 2 if c.family == "mixtral" else 8),
        families=_MOE,
    ),
    _fact("shared", 0, _MOE),
    Row(
        "hidden",
        "intermediate_size",
        lambda c: c.get("intermediate_size", 14336),
        families=("mixtral",),
    ),
    Row(
        "hidden",
        "moe_intermediate_size",
        lambda c: c.get("moe_intermediate_size", 768),
        families=("qwen3_moe",),
    ),
    Row(
        "hidden", "intermediate_size", lambda c: c.get("intermediate_size", 11008), families=_SWIGLU
    ),
    _fact("normalize", True, ("mixtral",)),
    Row(
        "normalize",
        "norm_topk_prob",
        lambda c: c.flag("norm_topk_prob", False),
        families=("qwen3_moe",),
    ),
)


def _dense_layers(c: Config) -> int:
    return min(c.get("first_k_dense_replace", 3), _layers(c))


def _yarn_mscale(c: Config) -> float:
    """transformers' yarn_get_mscale(factor, mscale_all_dim), when a rope scaling sets mscale_all_dim."""
    factor, all_dim = float(c.rope_param("factor", 1.0)), float(
        c.rope_param("mscale_all_dim", 0.0) or 0.0
    )
    if c.rope[1] == "default" or not all_dim or factor <= 1:
        return 1.0
    return 0.1 * all_dim * math.log(factor) + 1.0


def _mla_scale(c: Config) -> float:
    """DeepseekV3Attention's scaling: qk_head_dim^-0.5, times mscale^2 under a rope scaling."""
    qk = c.get("qk_nope_head_dim", 128) + c.get("qk_rope_head_dim", 64)
    return qk**-0.5 * _yarn_mscale(c) ** 2


# DeepSeek-V3: multi-head latent attention, the first `first_k_dense_replace` layers dense (SwiGLU
# of intermediate_size), the rest DeepSeek's MoE (sigmoid router with a selection bias, expert
# groups, shared experts). The spec's `layers` counts the MoE layers only.
DEEPSEEK_FIELDS = (
    _key("vocab_size", 129280, "vocab"),
    _key("hidden_size", 7168, "dim"),
    Row(
        "layers", "num_hidden_layers", lambda c: _layers(c) - _dense_layers(c), lambda c: _layers(c)
    ),
    Row("dense_layers", "first_k_dense_replace", _dense_layers),
    _key("num_attention_heads", 128, "heads"),
    Row(
        "kv_heads",
        "num_key_value_heads",
        lambda c: c.get("num_key_value_heads", c.get("num_attention_heads", 128)),
    ),
    _fact("attn", "MLAttention"),
    Row("q_rank", "q_lora_rank", lambda c: c.get("q_lora_rank", 0)),
    _key("kv_lora_rank", 512, "kv_rank"),
    _key("qk_nope_head_dim", 128, "nope_dim"),
    _key("qk_rope_head_dim", 64, "rope_dim"),
    _key("v_head_dim", 128, "v_head_dim"),
    Row("rope_interleaved", "rope_interleave", lambda c: c.flag("rope_interleave", True)),
    _fact("positions", "rope"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", False)),
    _fact("norm", "RMSNorm"),
    Row("norm_eps", "rms_norm_eps", lambda c: c.rms_eps),
    Row(
        "latent_norm_eps", "rms_norm_eps", lambda c: 1e-6
    ),  # q_a/kv_a_layernorm keep RMSNorm's default
    _fact("causal", True),
    _fact("rope", True),
    *(r for r in ROPE_ROWS if r.field != "rope_dim"),
    Row(
        "scale",
        "qk_nope_head_dim+qk_rope_head_dim",
        _mla_scale,
        lambda c: c.get("qk_nope_head_dim", 128) + c.get("qk_rope_head_dim", 64),
    ),
    _fact("softcap", 0.0),
    _fact("embed_multiplier", 1.0),
    _fact("logit_softcap", 0.0),
    _fact("window", 0),
    Row("attn_bias", "attention_bias", lambda c: c.flag("attention_bias", False)),
    _fact("qk_norm", False),
    _fact("block", "Block"),
    _fact("post_norms", False),
    _fact("head_bias", False),
    _fact("mlp", "DeepSeekMoE"),
    _fact("score", "sigmoid"),
    _key("moe_intermediate_size", 2048, "hidden"),
    Row("dense_hidden", "intermediate_size", lambda c: c.get("intermediate_size", 18432)),
    Row("experts", "n_routed_experts", lambda c: c.get("n_routed_experts", 256)),
    _key("num_experts_per_tok", 8, "top_k"),
    Row("groups", "n_group", lambda c: c.get("n_group", 8)),
    Row("top_groups", "topk_group", lambda c: c.get("topk_group", 4)),
    Row(
        "routed_scale",
        "routed_scaling_factor",
        lambda c: float(c.get("routed_scaling_factor", 2.5)),
    ),
    Row("normalize", "norm_topk_prob", lambda c: c.flag("norm_topk_prob", True)),
    _key("n_shared_experts", 1, "shared"),
)
DEEPSEEK_UNSUPPORTED: tuple = (
    (
        None,
        lambda c: _when(
            c.rope[1] not in _SCALINGS,
            f"rope_type={c.rope[1]!r} (axdsl's rope scalings are {', '.join(_SCALINGS)})",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("hidden_act", "silu") != "silu",
            f"hidden_act={c.cfg.get('hidden_act')!r} (SwiGLU and MoE experts use silu)",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("scoring_func", "sigmoid") != "sigmoid",
            f"scoring_func={c.cfg.get('scoring_func')!r} (DeepSeekMoE scores with sigmoid)",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("topk_method", "noaux_tc") != "noaux_tc",
            f"topk_method={c.cfg.get('topk_method')!r} (group-limited top-k with a selection "
            "bias is noaux_tc)",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("moe_layer_freq", 1) != 1,
            f"moe_layer_freq={c.cfg.get('moe_layer_freq')} (every layer after the dense ones is MoE)",
        ),
    ),
)


_NEOX_ACTS = {
    "gelu": "gelu_exact",
    **{a: "gelu" for a in TANH_GELU},
    "relu": "relu",
    "silu": "silu",
}


def _neox_act(c: Config) -> str:
    act = c.get("hidden_act", "gelu_new" if c.family == "phi" else "gelu")
    return _NEOX_ACTS.get(act, act)


# Phi (1, 1.5, 2) and GPT-NeoX (Pythia): parallel residual blocks, LayerNorm, biased dense layers,
# partial rotary embeddings.
PARALLEL_FIELDS = (
    Row(
        "vocab", "vocab_size", lambda c: c.get("vocab_size", 51200 if c.family == "phi" else 50432)
    ),
    _key("hidden_size", 2048, "dim"),
    _key("num_hidden_layers", 24, "layers"),
    _key("num_attention_heads", 32, "heads"),
    Row(
        "kv_heads",
        "num_key_value_heads",
        lambda c: c.get("num_key_value_heads", c.get("num_attention_heads", 32)),
    ),
    Row(
        "head_dim",
        "hidden_size/num_attention_heads",
        lambda c: c.get("hidden_size", 2048) // c.get("num_attention_heads", 32),
    ),
    _fact("positions", "rope"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", False)),
    _fact("norm", "LayerNorm"),
    Row("norm_eps", "layer_norm_eps", lambda c: float(c.get("layer_norm_eps", 1e-5))),
    _fact("norm_bias", True),
    _fact("causal", True),
    _fact("rope", True),
    *ROPE_ROWS,
    _fact("window", 0),
    _fact("qk_norm", False),
    _fact("mlp", "MLP"),
    Row(
        "hidden",
        "intermediate_size",
        lambda c: c.get("intermediate_size", 4 * c.get("hidden_size", 2048)),
    ),
    Row("act", "hidden_act", _neox_act, lambda c: c.get("hidden_act")),
    _fact("mlp_bias", True),
    _fact("block", "ParallelBlock"),
    _fact("attn_bias", True, ("phi",)),
    _fact("out_bias", True, ("phi",)),
    Row(
        "attn_bias",
        "attention_bias",
        lambda c: c.flag("attention_bias", True),
        families=("gpt_neox",),
    ),
    Row(
        "out_bias",
        "attention_bias",
        lambda c: c.flag("attention_bias", True),
        families=("gpt_neox",),
    ),
    _fact("shared_norm", True, ("phi",)),
    _fact("shared_norm", False, ("gpt_neox",)),
    _fact("head_bias", True, ("phi",)),
    _fact("head_bias", False, ("gpt_neox",)),
    *_PLAIN,
    Row("layer_windows", "num_hidden_layers", _uniform_windows(lambda c: 0), lambda c: _layers(c)),
)

PARALLEL_UNSUPPORTED: tuple = (
    (
        None,
        lambda c: _when(
            c.rope[1] not in _SCALINGS,
            f"rope_type={c.rope[1]!r} (axdsl's rope scalings are {', '.join(_SCALINGS)})",
        ),
    ),
    (
        ("phi",),
        lambda c: _when(
            c.cfg.get("qk_layernorm", False), "qk_layernorm=true (LayerNorm q/k norms)"
        ),
    ),
    (
        ("gpt_neox",),
        lambda c: _when(
            not c.cfg.get("use_parallel_residual", True),
            "use_parallel_residual=false (write it as std's Block)",
        ),
    ),
)


# Mamba-2 (transformers' Mamba2Config): attention-free MambaBlocks, one eps for every norm.
MAMBA2_FIELDS = (
    _key("vocab_size", 32768, "vocab"),
    _key("hidden_size", 4096, "dim"),
    _key("num_hidden_layers", 64, "layers"),
    _key("num_heads", 128, "heads"),
    _key("head_dim", 64, "ssm_head_dim"),
    _key("expand", 2, "ssm_expand"),
    _key("state_size", 128, "ssm_state"),
    _key("n_groups", 8, "ssm_groups"),
    _key("conv_kernel", 4, "conv_kernel"),
    _key("chunk_size", 256, "chunk"),
    Row("conv_bias", "use_conv_bias", lambda c: c.flag("use_conv_bias", True)),
    _fact("positions", "none"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", False)),
    _fact("norm", "RMSNorm"),
    Row("norm_eps", "layer_norm_epsilon", lambda c: float(c.get("layer_norm_epsilon", 1e-5))),
    Row("mixer_eps", "layer_norm_epsilon", lambda c: float(c.get("layer_norm_epsilon", 1e-5))),
    _fact("block", "MambaBlock"),
    _fact("head_bias", False),
    _fact("embed_multiplier", 1.0),
    _fact("logit_softcap", 0.0),
)


def _number(v: Any) -> float:
    """A float of config.json; transformers 5 writes infinity as {"__float__": "Infinity"}."""
    return float(v["__float__"]) if isinstance(v, dict) and "__float__" in v else float(v)


def _time_step_limit(c: Config) -> bool:
    """A dt clamp other than transformers' default (0, inf), which softplus already satisfies."""
    low, high = (c.cfg.get("time_step_limit") or (0.0, float("inf")))[:2]
    return _number(low) > 0.0 or _number(high) != float("inf")


def _when(cond: bool, message: str) -> str | None:
    return message if cond else None


MAMBA2_UNSUPPORTED: tuple = (
    (
        None,
        lambda c: _when(
            c.cfg.get("use_bias", False), "use_bias=true (Mamba2Mixer's projections have no biases)"
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("hidden_act", "silu") != "silu",
            f"hidden_act={c.cfg.get('hidden_act')!r} (Mamba2Mixer uses silu)",
        ),
    ),
    (
        None,
        lambda c: _when(
            _time_step_limit(c),
            f"time_step_limit={c.cfg.get('time_step_limit')} " "(Mamba2Mixer does not clamp dt)",
        ),
    ),
)


# config keys axdsl cannot express: (families or None, config -> message or None), in report order
Unsupported = tuple[tuple[str, ...] | None, Callable[[Config], str | None]]
GPT2_UNSUPPORTED: tuple[Unsupported, ...] = (
    (
        None,
        lambda c: _when(
            not c.cfg.get("scale_attn_weights", True),
            "scale_attn_weights=false (axdsl scales by 1/sqrt(head_dim))",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.cfg.get("scale_attn_by_inverse_layer_idx", False),
            "scale_attn_by_inverse_layer_idx=true",
        ),
    ),
    (None, lambda c: _when(c.cfg.get("add_cross_attention", False), "add_cross_attention=true")),
)
DECODER_UNSUPPORTED: tuple[Unsupported, ...] = (
    (
        None,
        lambda c: _when(
            c.rope[1] not in _SCALINGS,
            f"rope_type={c.rope[1]!r} (axdsl's rope scalings are {', '.join(_SCALINGS)})",
        ),
    ),
    (
        _UNWINDOWED,
        lambda c: _when(
            c.cfg.get("use_sliding_window", False),
            "use_sliding_window=true (per-layer windows are not mapped)",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("hidden_act", "silu") != "silu",
            f"hidden_act={c.cfg.get('hidden_act')!r} (SwiGLU and MoE experts use silu)",
        ),
    ),
    (None, lambda c: _when(c.cfg.get("mlp_bias", False), "mlp_bias=true (SwiGLU has no biases)")),
    (
        ("qwen3_moe",),
        lambda c: _when(
            c.cfg.get("mlp_only_layers"),
            f"mlp_only_layers={c.cfg.get('mlp_only_layers')} " "(every axdsl block is MoE)",
        ),
    ),
    (
        ("qwen3_moe",),
        lambda c: _when(
            c.get("decoder_sparse_step", 1) != 1,
            f"decoder_sparse_step={c.cfg.get('decoder_sparse_step')} " "(every axdsl block is MoE)",
        ),
    ),
)


# Arch field -> rope_parameters key, for the fields each scaling reads
_ROPE_KEYS = {
    "rope_factor": "factor",
    "rope_low_freq": "low_freq_factor",
    "rope_high_freq": "high_freq_factor",
    "rope_original_max_seq": "original_max_position_embeddings",
    "rope_beta_fast": "beta_fast",
    "rope_beta_slow": "beta_slow",
    "rope_mscale": "mscale",
    "rope_mscale_all_dim": "mscale_all_dim",
    "rope_attention_factor": "attention_factor",
}


def rope_parameters(v: dict, theta: float) -> dict:
    """transformers 5's rope_parameters: the rope type and the values its scaling reads."""
    scaling = v.get("rope_scaling") or "none"
    out: dict[str, Any] = {
        "rope_type": "default" if scaling == "none" else scaling,
        "rope_theta": theta,
    }
    for fld in ROPE_SCALING_FIELDS.get(scaling, ()):
        if fld == "rope_untruncated":
            out["truncate"] = not v[fld]
        elif fld in ("rope_mscale_all_dim", "rope_attention_factor") and not v[fld]:
            continue  # transformers' default (None) is "not given"
        else:
            out[_ROPE_KEYS[fld]] = v[fld]
    if v.get("rope_dim") and v.get("head_dim") and v["rope_dim"] != v["head_dim"]:
        out["partial_rotary_factor"] = v["rope_dim"] / v["head_dim"]
    return out
