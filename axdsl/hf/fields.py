"""config.json -> the facts an `Arch` states: the pieces every family's table of rows is made of.

Each family (axdsl/hf/families/) lists its rows, one per Arch field, and the config keys axdsl
cannot express; `hf_values` walks them. Missing keys take the defaults of transformers' config
classes (`Defaults`, where the shared rows read them). Each row names the config.json key a
mismatch message quotes (`model_type` for a fact of the family itself, such as GPT-2's LayerNorm).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from axdsl.hf.decoder_arch import DecoderFacts
from axdsl.hf.errors import HFError
from axdsl.hf.facts import FIELDS

# GELU variants that equal jax.nn.gelu's default (the tanh approximation).
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


@dataclass(frozen=True)
class Defaults:
    """transformers' config-class defaults that rows shared by several families read (LlamaConfig's
    unless a family states its own: each family's class has its own, e.g. GPT2Config's 12 layers).
    """

    vocab: int = 32000  # vocab_size
    dim: int = 4096  # hidden_size
    layers: int = 32  # num_hidden_layers (GPT-2: n_layer)
    heads: int = 32  # num_attention_heads
    kv_heads: int | None = None  # num_key_value_heads; None: num_attention_heads
    hidden: int = 11008  # intermediate_size (a fixed number, not a multiple of hidden_size)
    rms_eps: float = 1e-6  # rms_norm_eps
    rope_theta: float = 10000.0
    partial_rotary: float = 1.0  # partial_rotary_factor (GPT-NeoX: rotary_pct)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads


@dataclass(frozen=True)
class Config:
    """One config.json and its family's model_type and defaults, as the rows read them."""

    model_type: str  # quoted by the rows of facts the family fixes
    cfg: dict
    defaults: Defaults = Defaults()

    def get(self, key: str, default: Any = None) -> Any:
        """`cfg[key]`, or `default` when the key is missing or null. A key whose default is a
        number must hold one, or a list of them (a ViT's rectangular `image_size` [16, 24]):
        `"hidden_size": "64"` was a TypeError deep in a row (exit 70)."""
        value = self.cfg[key] if self.cfg.get(key) is not None else default
        pair = isinstance(value, list) and value and all(_is_number(v) for v in value)
        if _is_number(default) and not (_is_number(value) or pair):
            raise HFError(f"config.json: {key} is {json.dumps(value)}, not a number")
        return value

    def flag(self, key: str, default: bool) -> bool:
        return bool(self.cfg.get(key, default))

    @property
    def rms_eps(self) -> float:
        return float(self.get("rms_norm_eps", self.defaults.rms_eps))

    @property
    def rope(self) -> tuple[float, str]:
        """(theta, rope_type) from rope_parameters, rope_scaling or the top level."""
        rp = self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}
        theta = rp.get("rope_theta", self.cfg.get("rope_theta", self.cfg.get("rotary_emb_base")))
        kind = rp.get("rope_type", rp.get("type", "default"))
        return float(self.defaults.rope_theta if theta is None else theta), kind

    @property
    def rope_params(self) -> dict:
        """rope_parameters (transformers 5) or rope_scaling (older configs)."""
        return self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}

    @property
    def partial_rotary(self) -> float:
        """The rotating fraction of each head (rope_parameters, the top level, or GPT-NeoX's
        rotary_pct)."""
        default = self.get("rotary_pct", self.defaults.partial_rotary)
        return float(
            self.rope_param("partial_rotary_factor", self.get("partial_rotary_factor", default))
        )

    def rope_param(self, key: str, default: Any) -> Any:
        value = self.rope_params.get(key)
        return default if value is None else value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Row:
    """One Arch field read from config.json."""

    field: str
    key: str | Callable[[Config], str]  # what a mismatch message quotes
    value: Callable[[Config], Any]
    raw: Callable[[Config], Any] | None = None  # the quoted value, when not `value`

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise AssertionError(f"a config.json row names `{self.field}`, which is no fact")


def _key(key: str, default: Any, field: str) -> Row:
    """A field that is one config key, with transformers' default."""
    return Row(field, key, lambda c: c.get(key, default))


def _fact(field: str, value: Any) -> Row:
    """A field the family fixes (quoted as `model_type=<family>`)."""
    return Row(field, "model_type", lambda c: value, lambda c: c.model_type)


def _experts_key(c: Config) -> str:
    return "num_experts" if "num_experts" in c.cfg else "num_local_experts"


def _heads(c: Config) -> int:
    return c.get("num_attention_heads", c.defaults.heads)


def _kv_heads(c: Config) -> int:
    """num_key_value_heads; missing, the family's default; null (or no default), as many as the
    query heads (transformers' classes that take a null read it so)."""
    default = c.defaults.kv_heads
    if default is None or "num_key_value_heads" in c.cfg:
        return c.get("num_key_value_heads", _heads(c))
    return default


def _head_dim(c: Config) -> int:
    default = c.defaults.head_dim
    if default is None:
        default = c.get("hidden_size", c.defaults.dim) // _heads(c)
    return c.get("head_dim", default)


def _layers(c: Config) -> int:
    return c.get("num_hidden_layers", c.get("n_layer", c.defaults.layers))


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


def rope_type_check(c: Config) -> str | None:
    """A rope_type axdsl has no scaling for (the families with std's rope scalings)."""
    return _when(
        c.rope[1] not in _SCALINGS,
        f"rope_type={c.rope[1]!r} (axdsl's rope scalings are {', '.join(_SCALINGS)})",
    )


def _when(cond: bool, message: str) -> str | None:
    return message if cond else None


# a config key axdsl cannot express: config -> message or None (a family lists them in report order)
Unsupported = Callable[[Config], str | None]
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


def rope_parameters(v: DecoderFacts, theta: float, partial: bool = True) -> dict:
    """transformers 5's rope_parameters: the rope type and the values its scaling reads, and
    (`partial`) the rotating fraction of each head when rope_dim is not head_dim."""
    scaling = v.rope_scaling or "none"
    out: dict[str, Any] = {
        "rope_type": "default" if scaling == "none" else scaling,
        "rope_theta": theta,
    }
    for fld in ROPE_SCALING_FIELDS.get(scaling, ()):
        if fld == "rope_untruncated":
            out["truncate"] = not getattr(v, fld)
        elif fld in ("rope_mscale_all_dim", "rope_attention_factor") and not getattr(v, fld):
            continue  # transformers' default (None) is "not given"
        else:
            out[_ROPE_KEYS[fld]] = getattr(v, fld)
    if partial and v.rope_dim and v.head_dim and v.rope_dim != v.head_dim:
        out["partial_rotary_factor"] = v.rope_dim / v.head_dim
    return out
