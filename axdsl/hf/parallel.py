"""Phi and GPT-NeoX: parallel residual blocks, LayerNorm, biased dense layers, partial rotary.

What the two families share: their config.json rows (`parallel_rows`, from each family's typed
`Parallel`), their unsupported rope types and the config.json keys both write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from axdsl.hf.decoder_arch import DecoderFacts
from axdsl.hf.facts import Arch
from axdsl.hf.fields import (
    _PLAIN,
    ROPE_ROWS,
    TANH_GELU,
    Config,
    Row,
    _fact,
    _heads,
    _kv_heads,
    _layers,
    _uniform_windows,
    rope_parameters,
)

_ACTS = {
    "gelu": "gelu_exact",
    **{a: "gelu" for a in TANH_GELU},
    "relu": "relu",
    "silu": "silu",
}


@dataclass(frozen=True)
class Parallel:
    """How Phi's and GPT-NeoX's config.json differ (transformers' defaults, and facts of each)."""

    act: str  # hidden_act's default
    biased: Row | None  # attention_bias (None: q, k, v and the output projection are biased)
    shared_norm: bool  # one LayerNorm before attention and the MLP (Phi)
    head_bias: bool  # lm_head has a bias (Phi)


def _act(p: Parallel):
    def act(c: Config) -> str:
        name = c.get("hidden_act", p.act)
        return _ACTS.get(name, name)

    return act


def _split_dim(c: Config) -> int:
    """hidden_size // num_attention_heads (both classes ignore a head_dim key)."""
    return int(c.get("hidden_size", c.defaults.dim)) // _heads(c)


def parallel_rows(p: Parallel) -> tuple[Row, ...]:
    """config.json -> the facts of a parallel-residual family."""
    if p.biased is None:
        biases: tuple[Row, ...] = (_fact("attn_bias", True), _fact("out_bias", True))
    else:
        biases = (p.biased, Row("out_bias", p.biased.key, p.biased.value))
    return (
        Row("vocab", "vocab_size", lambda c: c.get("vocab_size", c.defaults.vocab)),
        Row("dim", "hidden_size", lambda c: c.get("hidden_size", c.defaults.dim)),
        Row("layers", "num_hidden_layers", _layers),
        Row("heads", "num_attention_heads", _heads),
        Row("kv_heads", "num_key_value_heads", _kv_heads),
        Row("head_dim", "hidden_size/num_attention_heads", _split_dim),
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
            lambda c: c.get("intermediate_size", c.defaults.hidden),
        ),
        Row("act", "hidden_act", _act(p), lambda c: c.get("hidden_act")),
        _fact("mlp_bias", True),
        _fact("block", "ParallelBlock"),
        *biases,
        _fact("shared_norm", p.shared_norm),
        _fact("head_bias", p.head_bias),
        *_PLAIN,
        Row(
            "layer_windows",
            "num_hidden_layers",
            _uniform_windows(lambda c: 0),
            lambda c: _layers(c),
        ),
    )


def parallel_config(
    arch: Arch[DecoderFacts], family: str, hf_class: str, dtype: str
) -> dict[str, Any]:
    """The config.json keys Phi and GPT-NeoX both write; each adds its own."""
    v = arch.facts
    theta = v.rope_theta if v.rope_theta is not None else 10000.0
    acts = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}
    out: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": family,
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "intermediate_size": v.hidden,
        "num_hidden_layers": v.layers,
        "num_attention_heads": v.heads,
        "hidden_act": acts.get(v.act, v.act),
        "max_position_embeddings": v.max_seq,
        "layer_norm_eps": v.norm_eps,
        "rope_theta": theta,
        "rope_parameters": rope_parameters(v, theta),
        "tie_word_embeddings": v.tied,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }
    out["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    return out
