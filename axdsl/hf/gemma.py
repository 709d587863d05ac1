"""Gemma 2 and Gemma 3 (text), what the two families share: config.json rows (import), config
writers (export) and their facts (`GEMMA`).

Both are std's DecoderLM over a pattern of sandwich-norm Blocks with GeGLU, GemmaRMSNorm and an
embedding scaled by sqrt(dim). Gemma 2 alternates sliding and global layers and soft-caps its
logits. Gemma 3 normalizes q and k per head, soft-caps nothing, and gives its local and global
layers rotary embeddings of their own (`rope_parameters` keyed by layer type, or the older
`rope_theta` / `rope_local_base_freq` / `rope_scaling`); its default pattern is five sliding
layers then one global (`sliding_window_pattern` = 6).
"""

from __future__ import annotations

import math

from axdsl.hf.errors import HFError
from axdsl.hf.decoder_arch import DecoderFacts
from axdsl.hf.facts import Arch, Facts
from axdsl.hf.fields import (
    ROPE_ROWS,
    Config,
    Defaults,
    Row,
    Unsupported,
    _fact,
    _head_dim,
    _key,
    _layers,
    _when,
    rope_parameters,
    rope_type_check,
)

SLIDING, FULL = "sliding_attention", "full_attention"
_ACTS = {
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu_exact",
    "gelu_new": "gelu_tanh",
    "silu": "silu",
}
_ACTS_OUT = {"gelu_tanh": "gelu_pytorch_tanh", "gelu_exact": "gelu", "silu": "silu"}
# Gemma 3's rotary kinds: transformers' rope_type -> (axdsl's rope_scaling, whether it reads
# `factor`)
_GEMMA3_ROPE = {"default": "none", "linear": "linear"}
# transformers' Gemma config classes' defaults the shared rows read
GEMMA = Defaults(head_dim=256, layers=26)


def is_gemma(arch: Arch[Facts]) -> bool:
    """A DecoderLM with Gemma's GemmaRMSNorm or sandwich norms (post_norms)."""
    v = arch.facts
    return v.norm == "GemmaRMSNorm" or (isinstance(v, DecoderFacts) and bool(v.post_norms))


def _layer_types(c: Config, period: int) -> list[str]:
    """layer_types, else the family's default: every `period`-th layer global, the others
    sliding."""
    n = _layers(c)
    return c.get("layer_types") or [SLIDING if (i + 1) % period else FULL for i in range(n)]


def _windows(c: Config, period: int, default_window: int) -> tuple[int, ...]:
    w = c.get("sliding_window", default_window)
    return tuple(w if t == SLIDING else 0 for t in _layer_types(c, period))


def _gemma2_windows(c: Config) -> tuple[int, ...]:
    """layer_types (default: sliding on even layers, full on odd) with sliding_window."""
    return _windows(c, 2, 4096)


def _gemma3_period(c: Config) -> int:
    return int(c.get("sliding_window_pattern", 6))


def _gemma3_windows(c: Config) -> tuple[int, ...]:
    return _windows(c, _gemma3_period(c), 4096)


def _gemma3_rope_of(c: Config, kind: str) -> dict:
    """The rotary parameters of one layer type: transformers 5's rope_parameters[kind], or the older
    keys (rope_theta and rope_scaling for global layers, rope_local_base_freq for sliding ones)."""
    rp = c.cfg.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get(kind), dict):
        return {"rope_theta": 1e6 if kind == FULL else 1e4, **rp[kind]}
    if kind == SLIDING:
        return {"rope_type": "default", "rope_theta": c.get("rope_local_base_freq", 10000.0)}
    scaling = c.cfg.get("rope_scaling") or {}
    return {
        "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
        "rope_theta": c.get("rope_theta", 1e6),
        **{k: v for k, v in scaling.items() if k == "factor"},
    }


def _gemma3_ropes(c: Config) -> tuple[tuple, ...]:
    """Each layer's (rope_theta, rope_scaling, rope_factor), as arch.py's `layer_ropes`."""
    out = []
    for kind in _layer_types(c, _gemma3_period(c)):
        p = _gemma3_rope_of(c, kind)
        scaling = _GEMMA3_ROPE.get(p.get("rope_type", "default"), p.get("rope_type"))
        factor = float(p.get("factor", 1.0)) if scaling == "linear" else 1.0
        out.append((float(p["rope_theta"]), scaling, factor))
    return tuple(out)


def _common(
    vocab: int, dim: int, hidden: int, softcap: float | None, logit_softcap: float | None
) -> tuple:
    """The rows Gemma 2 and 3 share, with the defaults of their transformers config classes."""
    return (
        _key("vocab_size", vocab, "vocab"),
        _key("hidden_size", dim, "dim"),
        Row("layers", "num_hidden_layers", _layers),
        _key("num_attention_heads", 8, "heads"),
        _key("num_key_value_heads", 4, "kv_heads"),
        Row("head_dim", "head_dim", _head_dim),
        _fact("positions", "rope"),
        Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", True)),
        _fact("norm", "GemmaRMSNorm"),
        Row("norm_eps", "rms_norm_eps", lambda c: c.rms_eps),
        _fact("causal", True),
        _fact("rope", True),
        Row("attn_bias", "attention_bias", lambda c: c.flag("attention_bias", False)),
        Row("out_bias", "attention_bias", lambda c: c.flag("attention_bias", False)),
        _fact("mlp", "GatedMLP"),
        Row("hidden", "intermediate_size", lambda c: c.get("intermediate_size", hidden)),
        Row(
            "act",
            "hidden_activation",
            lambda c: _ACTS.get(
                c.get("hidden_activation", "gelu_pytorch_tanh"), c.get("hidden_activation")
            ),
            lambda c: c.get("hidden_activation", "gelu_pytorch_tanh"),
        ),
        _fact("block", "Block"),
        _fact("post_norms", True),
        _fact("head_bias", False),
        Row(
            "scale",
            "query_pre_attn_scalar",
            lambda c: float(c.get("query_pre_attn_scalar", 256)) ** -0.5,
            lambda c: c.get("query_pre_attn_scalar", 256),
        ),
        Row(
            "softcap",
            "attn_logit_softcapping",
            lambda c: float(c.cfg.get("attn_logit_softcapping", softcap) or 0.0),
            lambda c: c.cfg.get("attn_logit_softcapping", softcap),
        ),
        Row(
            "logit_softcap",
            "final_logit_softcapping",
            lambda c: float(c.cfg.get("final_logit_softcapping", logit_softcap) or 0.0),
            lambda c: c.cfg.get("final_logit_softcapping", logit_softcap),
        ),
        Row(
            "embed_multiplier",
            "hidden_size",
            lambda c: c.get("hidden_size", dim) ** 0.5,
            lambda c: c.get("hidden_size", dim),
        ),
    )


GEMMA2_FIELDS = (
    *_common(256000, 2304, 9216, 50.0, 30.0),
    *ROPE_ROWS,
    Row(
        "layer_windows",
        "layer_types",
        _gemma2_windows,
        lambda c: [c.get("sliding_window", 4096), c.get("layer_types")],
    ),
    _fact("qk_norm", False),
)
GEMMA3_FIELDS = (
    *_common(262208, 2304, 9216, None, None),
    Row("rope_dim", "head_dim", _head_dim),
    Row(
        "layer_windows",
        "layer_types",
        _gemma3_windows,
        lambda c: [
            c.get("sliding_window", 4096),
            c.get("layer_types") or f"every {_gemma3_period(c)}th global",
        ],
    ),
    Row(
        "layer_ropes",
        "rope_parameters",
        _gemma3_ropes,
        lambda c: {k: _gemma3_rope_of(c, k) for k in (SLIDING, FULL)},
    ),
    _fact("qk_norm", True),
    Row("qk_norm_eps", "rms_norm_eps", lambda c: c.rms_eps),
)


def _layer_types_check(c: Config) -> str | None:
    return _when(
        any(t not in (SLIDING, FULL) for t in c.get("layer_types") or []),
        f"layer_types={c.get('layer_types')} (sliding_attention and full_attention only)",
    )


GEMMA2_UNSUPPORTED: tuple[Unsupported, ...] = (
    rope_type_check,
    _layer_types_check,
)
GEMMA3_UNSUPPORTED: tuple[Unsupported, ...] = (
    _layer_types_check,
    lambda c: _when(
        any(s not in _GEMMA3_ROPE.values() for _, s, _ in _gemma3_ropes(c)),
        f"rope_parameters={c.cfg.get('rope_parameters') or c.cfg.get('rope_scaling')} "
        f"(Gemma 3's rope types here: {', '.join(_GEMMA3_ROPE)})",
    ),
    lambda c: _when(
        c.cfg.get("use_bidirectional_attention", False),
        "use_bidirectional_attention=true (axdsl's Gemma 3 is causal)",
    ),
)


def _query_pre_attn_scalar(v: DecoderFacts) -> int:
    """Gemma states its attention scale as scale = query_pre_attn_scalar ** -0.5 (an int)."""
    if not v.scale:
        return v.head_dim
    scalar = 1.0 / v.scale**2
    if not math.isclose(scalar, round(scalar), rel_tol=1e-9):
        raise HFError(
            f"attention scale {v.scale} is not query_pre_attn_scalar ** -0.5 for an int scalar",
            ["Gemma's config.json states the scale as an int query_pre_attn_scalar"],
        )
    return round(scalar)


def _shared_config(v: DecoderFacts, family: str, architecture: str, dtype: str) -> dict:
    windows = v.layer_windows
    sliding = {w for w in windows if w}
    if len(sliding) > 1:
        raise HFError(
            f"the sliding layers' windows differ ({', '.join(map(str, sorted(sliding)))})",
            [f"{architecture}'s config.json states one sliding_window"],
        )
    return {
        "architectures": [architecture],
        "model_type": family,
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "intermediate_size": v.hidden,
        "num_hidden_layers": v.layers,
        "num_attention_heads": v.heads,
        "num_key_value_heads": v.kv_heads,
        "head_dim": v.head_dim,
        "hidden_activation": _ACTS_OUT.get(v.act, v.act),
        "max_position_embeddings": v.max_seq,
        "rms_norm_eps": v.norm_eps,
        "attention_bias": v.attn_bias,
        "tie_word_embeddings": v.tied,
        "query_pre_attn_scalar": _query_pre_attn_scalar(v),
        "attn_logit_softcapping": v.softcap or None,
        "final_logit_softcapping": v.logit_softcap or None,
        "sliding_window": sliding.pop() if sliding else None,
        "layer_types": [SLIDING if w else FULL for w in windows],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def gemma2_config(arch: Arch[DecoderFacts], dtype: str) -> dict:
    """Gemma 2: sandwich norms, GeGLU, soft caps, alternating sliding and full attention."""
    v = arch.facts
    theta = v.rope_theta if v.rope_theta is not None else 10000.0
    return {
        **_shared_config(v, "gemma2", "Gemma2ForCausalLM", dtype),
        "rope_theta": theta,
        "rope_parameters": rope_parameters(v, theta),
    }


def gemma3_config(arch: Arch[DecoderFacts], dtype: str) -> dict:
    """Gemma 3 (text): Gemma 2's layout plus q/k norms and a rotary embedding per layer type."""
    v = arch.facts
    out = _shared_config(v, "gemma3_text", "Gemma3ForCausalLM", dtype)
    params: dict[str, dict] = {}
    for kind, (theta, scaling, factor) in zip(out["layer_types"], v.layer_ropes, strict=True):
        p = {"rope_type": "default" if scaling == "none" else scaling, "rope_theta": theta}
        if scaling == "linear":
            p["factor"] = factor
        if params.setdefault(kind, p) != p:
            raise HFError(
                f"the {kind} layers' rotary embeddings differ",
                ["Gemma 3's config.json states one rotary embedding per layer type"],
            )
    return {**out, "rope_parameters": params}
