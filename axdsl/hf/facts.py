"""The facts of a model that Hugging Face interop compares: `Arch`, and how the spec states each.

An `Arch` holds what a Hugging Face config.json states (dims, heads, norm, rope, window,
feed-forward kind, experts, ...) as typed `Facts`, plus every parameter's path,
shape and dtype, and the structure no HF family has (`problems`). This module sits below every
other module of axdsl/hf: the families and the readers of the IR build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _fact(spec: str) -> Any:
    """A fact, unknown (None) until a reader states it; `spec` is how the spec states it."""
    return field(default=None, metadata={"spec": spec})


@dataclass
class Facts:
    """The facts of a model a Hugging Face config.json states, each a typed field: read from the
    spec's IR (the family's reader) or from a config.json (the family's rows). A fact is typed as
    the value its readers state; one no reader stated is None (an Optional type marks the facts
    that code reads while they may be unknown). `written` records the facts a reader stated (for
    comparing blocks)."""

    vocab: int = _fact("vocab")
    dim: int = _fact("dim")
    layers: int = _fact("layers")
    heads: int = _fact("heads")
    kv_heads: int = _fact("kv_heads")
    head_dim: int = _fact("attention head_dim")
    max_seq: int = _fact("max_seq")
    positions: str = _fact("positions")
    tied: bool = _fact("tied")
    norm: str | None = _fact("norm layer")
    norm_eps: float | None = _fact("norm eps")
    norm_bias: bool | None = _fact("LayerNorm bias")
    causal: bool = _fact("attention causal")
    rope: bool = _fact("attention rope")
    rope_theta: float | None = _fact("rope_theta")
    rope_dim: int = _fact("attention rope_dim")
    rope_scaling: str = _fact("attention rope_scaling")
    rope_factor: float = _fact("attention rope_factor")
    rope_low_freq: float = _fact("attention rope_low_freq")
    rope_high_freq: float = _fact("attention rope_high_freq")
    rope_original_max_seq: int = _fact("attention rope_original_max_seq")
    rope_beta_fast: float = _fact("attention rope_beta_fast")
    rope_beta_slow: float = _fact("attention rope_beta_slow")
    rope_untruncated: bool = _fact("attention rope_untruncated")
    rope_mscale: float = _fact("attention rope_mscale")
    rope_mscale_all_dim: float = _fact("attention rope_mscale_all_dim")
    rope_attention_factor: float = _fact("attention rope_attention_factor")
    window: int = _fact("attention window")
    attn_bias: bool = _fact("attention bias")
    qk_norm: bool = _fact("attention qk_norm")
    qk_norm_eps: float | None = _fact("q_norm/k_norm eps")
    mlp: str | None = _fact("feed-forward layer")
    hidden: int = _fact("feed-forward hidden")
    act: str = _fact("MLP act")
    mlp_bias: bool = _fact("MLP bias")
    experts: int = _fact("MoE experts")
    top_k: int = _fact("MoE top_k")
    normalize: bool = _fact("MoE normalize")
    shared: int = _fact("MoE shared experts")
    block: str = _fact("block layer")
    out_bias: bool = _fact("attention out_bias")
    head_bias: bool = _fact("head_bias")
    shared_norm: bool = _fact("ParallelBlock shared_norm")
    post_norms: bool = _fact("Block post_norms")
    scale: float = _fact("attention scale")
    softcap: float = _fact("attention softcap")
    embed_multiplier: float = _fact("embed_multiplier")
    logit_softcap: float = _fact("logit_softcap")
    layer_windows: tuple[int | None, ...] = _fact("the layers' attention windows")
    layer_ropes: tuple[tuple[float | None, str | None, float | None], ...] = _fact(
        "the layers' rotary (rope_theta, rope_scaling, rope_factor)"
    )
    ssm_expand: int = _fact("Mamba2Mixer expand")
    ssm_head_dim: int = _fact("Mamba2Mixer head_dim")
    ssm_state: int = _fact("Mamba2Mixer state")
    ssm_groups: int = _fact("Mamba2Mixer groups")
    conv_kernel: int = _fact("Mamba2Mixer conv_kernel")
    chunk: int = _fact("Mamba2Mixer chunk")
    conv_bias: bool = _fact("Mamba2Mixer conv_bias")
    mixer_eps: float = _fact("Mamba2Mixer eps (its gated norm)")
    attn: str | None = _fact("attention layer")
    dense_layers: int = _fact("dense_layers")
    dense_hidden: int | None = _fact("the dense blocks' SwiGLU hidden")
    q_rank: int = _fact("MLAttention q_rank")
    kv_rank: int = _fact("MLAttention kv_rank")
    nope_dim: int = _fact("MLAttention nope_dim")
    v_head_dim: int = _fact("MLAttention v_head_dim")
    rope_interleaved: bool = _fact("attention rope_interleaved")
    groups: int = _fact("DeepSeekMoE groups")
    top_groups: int = _fact("DeepSeekMoE top_groups")
    routed_scale: float = _fact("DeepSeekMoE scale")
    score: str = _fact("DeepSeekMoE score")
    latent_norm_eps: float = _fact("MLAttention kv_norm eps")
    type_vocab: int = _fact("type_vocab")
    root: str = _fact("root layer")
    height: int = _fact("height")
    width: int = _fact("width")
    patch: int = _fact("patch")
    channels: int = _fact("channels")
    classes: int = _fact("classes")
    dec_layers: int = _fact("T5 dec_layers")
    buckets: int = _fact("T5 buckets")
    max_distance: int = _fact("T5 max_distance")
    capacity_factor: float | None = _fact("MoE capacity_factor")
    written: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.written.clear()  # the facts given to __init__ are not stated by a reader

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "written":
            if name not in _NAMES:
                raise AttributeError(f"Facts has no fact `{name}`")
            self.__dict__.setdefault("written", set()).add(name)
        object.__setattr__(self, name, value)

    def set(self, **facts: Any) -> None:
        """State several facts at once."""
        for name, value in facts.items():
            setattr(self, name, value)

    def update(self, other: Facts) -> None:
        """State every fact `other` states."""
        for name in other.written:
            setattr(self, name, getattr(other, name))


_NAMES = frozenset(f.name for f in fields(Facts)) - {"written"}
# fact -> how the spec states it (for messages)
FIELDS: dict[str, str] = {f.name: f.metadata["spec"] for f in fields(Facts) if f.name != "written"}


@dataclass
class Arch:
    """What a spec's model is, read from its IR: the facts a Hugging Face config states."""

    name: str
    facts: Facts
    params: dict[tuple[str, ...], tuple[tuple[int, ...], str]]  # path -> (shape, dtype name)
    problems: list[str] = field(default_factory=list)  # structure no HF family has
    root: str = ""  # the model's root layer (std's DecoderLM, BertMLM, VisionTransformer, T5)
    pattern: int = (
        0  # the length of a repeated pattern of blocks (blocks/0, blocks/1, ...); 0: one block
    )
    tail: int = (
        0  # layers after the scanned groups when the pattern does not divide them (blocks/tail/<e>)
    )


def hv(inst: Any, name: str, default: Any = None) -> Any:
    """Hyperparameter `name` of an IR instance (`default` when it or the instance is absent)."""
    h = inst.hparam(name) if inst is not None else None
    return default if h is None else h.value.value


def at(root: Any, path: str) -> Any:
    """The instance at `path` (a/b/c) below `root`, or None."""
    inst = root
    for part in path.split("/"):
        inst = None if inst is None else inst.child(part)
    return inst
