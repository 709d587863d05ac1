"""The Llama-shaped families (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe): what they share.

They are one decoder (RoPE, RMSNorm, q/k/v/o projections, SwiGLU or MoE) that differ in a few
options, which each family's module states as a typed `Decoder`: whether config.json states a
sliding window, which projections attention_bias covers, q/k norms, and the MoE's defaults. From
a `Decoder`, this module makes the family's config.json rows, its unsupported keys, the
config.json export writes, and its tensor layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from axdsl.hf.decoder_arch import DecoderFacts
from axdsl.hf.facts import Arch, fact
from axdsl.hf.fields import (
    _PLAIN,
    ROPE_ROWS,
    Config,
    Row,
    Unsupported,
    _experts_key,
    _fact,
    _head_dim,
    _heads,
    _kv_heads,
    _layers,
    _uniform_windows,
    _when,
    rope_parameters,
    rope_type_check,
)
from axdsl.hf.layout import MoeNames, Rule, decoder_layout, llama_block, mlp_moe_names


@dataclass
class MoeFacts(DecoderFacts):
    """A DecoderLM of MoE blocks: the experts, beside the facts of `DecoderFacts`. The type of
    mixtral and qwen3_moe; DeepSeek's extends it."""

    experts: int = fact("MoE experts")
    top_k: int = fact("MoE top_k")
    normalize: bool = fact("MoE normalize")
    shared: int = fact("MoE shared experts")
    capacity_factor: float | None = fact("MoE capacity_factor")


@dataclass(frozen=True)
class Moe:
    """A mixture of experts' config.json defaults."""

    experts: int  # num_local_experts / num_experts
    top_k: int  # num_experts_per_tok
    hidden_key: str  # the experts' width: intermediate_size or moe_intermediate_size
    hidden: int
    normalize_key: (
        str | None
    )  # the key that says whether top-k weights are renormalized (None: always)


@dataclass(frozen=True)
class Decoder:
    """How one Llama-shaped family's config.json differs from Llama's."""

    windowed: bool = False  # sliding_window states the window (else use_sliding_window is false)
    default_window: int = 0  # the window when config.json has no sliding_window key
    qkv_bias_only: bool = False  # q, k and v have biases, the output projection none (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    moe: Moe | None = None  # the feed-forward is a MoE (else SwiGLU)
    unsupported: tuple[Unsupported, ...] = ()  # the family's own unsupported keys, reported last
    moe_names: MoeNames = mlp_moe_names  # the MoE module's tensor names in a checkpoint


def _window(d: Decoder) -> Callable[[Config], int]:
    def window(c: Config) -> int:
        return c.get("sliding_window", d.default_window if "sliding_window" not in c.cfg else 0)

    return window


def _window_rows(d: Decoder) -> tuple[Row, Row]:
    """The window and every layer's window: sliding_window, or 0 (use_sliding_window false)."""
    if d.windowed:
        raw = lambda c: c.cfg.get("sliding_window")  # noqa: E731
        return (
            Row("window", "sliding_window", _window(d), raw),
            Row("layer_windows", "sliding_window", _uniform_windows(_window(d)), raw),
        )
    flag = lambda c: c.flag("use_sliding_window", False)  # noqa: E731
    return (
        Row("window", "use_sliding_window", lambda c: 0, flag),
        Row("layer_windows", "use_sliding_window", _uniform_windows(lambda c: 0), flag),
    )


def _bias_rows(d: Decoder) -> tuple[Row, Row]:
    if d.qkv_bias_only:
        return _fact("attn_bias", True), _fact("out_bias", False)
    biased = lambda c: c.flag("attention_bias", False)  # noqa: E731 (covers o_proj too)
    return Row("attn_bias", "attention_bias", biased), Row("out_bias", "attention_bias", biased)


def _feed_forward_rows(d: Decoder) -> tuple[Row, ...]:
    m = d.moe
    if m is None:
        return (
            _fact("mlp", "SwiGLU"),
            Row(
                "hidden",
                "intermediate_size",
                lambda c: c.get("intermediate_size", c.defaults.hidden),
            ),
        )
    key = m.normalize_key
    normalize = (
        _fact("normalize", True)
        if key is None
        else Row("normalize", key, lambda c: c.flag(key, False))
    )
    return (
        _fact("mlp", "MoE"),
        Row("experts", _experts_key, lambda c: c.get(_experts_key(c), m.experts)),
        Row("top_k", "num_experts_per_tok", lambda c: c.get("num_experts_per_tok", m.top_k)),
        _fact("shared", 0),
        Row("hidden", m.hidden_key, lambda c: c.get(m.hidden_key, m.hidden)),
        normalize,
    )


def decoder_rows(d: Decoder) -> tuple[Row, ...]:
    """config.json -> the facts of a Llama-shaped family, with transformers' defaults."""
    window, layer_windows = _window_rows(d)
    qk = (
        (_fact("qk_norm", True), Row("qk_norm_eps", "rms_norm_eps", lambda c: c.rms_eps))
        if d.qk_norm
        else (_fact("qk_norm", False),)
    )
    return (
        Row("vocab", "vocab_size", lambda c: c.get("vocab_size", c.defaults.vocab)),
        Row("dim", "hidden_size", lambda c: c.get("hidden_size", c.defaults.dim)),
        Row("layers", "num_hidden_layers", _layers),
        Row("heads", "num_attention_heads", _heads),
        Row("kv_heads", "num_key_value_heads", _kv_heads),
        Row("head_dim", "head_dim", _head_dim),
        _fact("positions", "rope"),
        Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", False)),
        _fact("norm", "RMSNorm"),
        Row("norm_eps", "rms_norm_eps", lambda c: c.rms_eps),
        _fact("causal", True),
        _fact("rope", True),
        *ROPE_ROWS,
        window,
        *_bias_rows(d),
        _fact("block", "Block"),
        _fact("post_norms", False),
        _fact("head_bias", False),
        *_PLAIN,
        layer_windows,
        *qk,
        *_feed_forward_rows(d),
    )


def decoder_unsupported(d: Decoder) -> tuple[Unsupported, ...]:
    """The config keys a Llama-shaped family may set that axdsl cannot express, in report order."""
    sliding: tuple[Unsupported, ...] = ()
    if not d.windowed:
        sliding = (
            lambda c: _when(
                c.cfg.get("use_sliding_window", False),
                "use_sliding_window=true (per-layer windows are not mapped)",
            ),
        )
    return (
        rope_type_check,
        *sliding,
        lambda c: _when(
            c.get("hidden_act", "silu") != "silu",
            f"hidden_act={c.cfg.get('hidden_act')!r} (SwiGLU and MoE experts use silu)",
        ),
        lambda c: _when(c.cfg.get("mlp_bias", False), "mlp_bias=true (SwiGLU has no biases)"),
        *d.unsupported,
    )


def decoder_config(
    arch: Arch[DecoderFacts], family: str, hf_class: str, dtype: str
) -> dict[str, Any]:
    """The config.json keys every Llama-shaped family writes; a family adds its own."""
    v = arch.facts
    theta = v.rope_theta if v.rope_theta is not None else 10000.0
    return {
        "architectures": [hf_class],
        "model_type": family,
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "intermediate_size": v.hidden,
        "num_hidden_layers": v.layers,
        "num_attention_heads": v.heads,
        "num_key_value_heads": v.kv_heads,
        "head_dim": v.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": v.max_seq,
        "rms_norm_eps": v.norm_eps,
        "rope_theta": theta,
        "rope_parameters": rope_parameters(v, theta),
        "tie_word_embeddings": v.tied,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def decoder_rules(d: Decoder) -> Callable[[Arch[DecoderFacts], set[str] | None], list[Rule]]:
    """The tensor layout of a Llama-shaped family."""
    return decoder_layout(lambda r: llama_block(r, moe_names=d.moe_names))
