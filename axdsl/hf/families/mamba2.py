"""mamba2: Mamba2ForCausalLM (transformers' Mamba2Config): attention-free MambaBlocks, one eps
for every norm.

transformers fuses the mixer's five input projections into in_proj (rows z, x, B, C, dt) and its
three short convs into one depthwise conv1d ([channels, 1, taps]: x, B, C).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.facts import Arch, fact
from axdsl.hf.family import Family
from axdsl.hf.fields import Config, Row, _fact, _key, _when
from axdsl.hf.layout import _T, _Rules, decoder_layout, split_rule


@dataclass
class Mamba2Facts(DecoderFacts):
    """A DecoderLM of MambaBlocks: its Mamba2Mixer's sizes, conv and gated norm, beside the facts
    of `DecoderFacts` (its attention facts stay unknown: it has none)."""

    ssm_expand: int = fact("Mamba2Mixer expand")
    ssm_head_dim: int = fact("Mamba2Mixer head_dim")
    ssm_state: int = fact("Mamba2Mixer state")
    ssm_groups: int = fact("Mamba2Mixer groups")
    conv_kernel: int = fact("Mamba2Mixer conv_kernel")
    chunk: int = fact("Mamba2Mixer chunk")
    conv_bias: bool = fact("Mamba2Mixer conv_bias")
    mixer_eps: float = fact("Mamba2Mixer eps (its gated norm)")


ROWS = (
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
UNSUPPORTED = (
    lambda c: _when(
        c.cfg.get("use_bias", False), "use_bias=true (Mamba2Mixer's projections have no biases)"
    ),
    lambda c: _when(
        c.get("hidden_act", "silu") != "silu",
        f"hidden_act={c.cfg.get('hidden_act')!r} (Mamba2Mixer uses silu)",
    ),
    lambda c: _when(
        _time_step_limit(c),
        f"time_step_limit={c.cfg.get('time_step_limit')} " "(Mamba2Mixer does not clamp dt)",
    ),
)


def _number(v: Any) -> float:
    """A float of config.json; transformers 5 writes infinity as {"__float__": "Infinity"}."""
    return float(v["__float__"]) if isinstance(v, dict) and "__float__" in v else float(v)


def _time_step_limit(c: Config) -> bool:
    """A dt clamp other than transformers' default (0, inf), which softplus already satisfies."""
    low, high = (c.cfg.get("time_step_limit") or (0.0, float("inf")))[:2]
    return _number(low) > 0.0 or _number(high) != float("inf")


def _export(arch: Arch[Mamba2Facts], dtype: str) -> dict:
    """Mamba-2: attention-free blocks; transformers' Mamba2Config keys."""
    v = arch.facts
    return {
        "architectures": ["Mamba2ForCausalLM"],
        "model_type": "mamba2",
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "num_hidden_layers": v.layers,
        "num_heads": v.heads,
        "head_dim": v.ssm_head_dim,
        "expand": v.ssm_expand,
        "state_size": v.ssm_state,
        "n_groups": v.ssm_groups,
        "conv_kernel": v.conv_kernel,
        "chunk_size": v.chunk,
        "use_conv_bias": v.conv_bias,
        "use_bias": False,
        "hidden_act": "silu",
        "layer_norm_epsilon": v.norm_eps,
        "tie_word_embeddings": v.tied,
        "residual_in_fp32": True,
        "initializer_range": 0.1,
        "use_cache": True,
        "dtype": dtype,
    }


def _block(r: _Rules[Mamba2Facts]) -> str:
    """Mamba-2: transformers fuses the mixer's five input projections into in_proj (rows z, x, B,
    C, dt) and its three short convs into one depthwise conv1d ([channels, 1, taps]: x, B, C)."""
    v = r.arch.facts
    inner, gs, heads = v.ssm_expand * v.dim, v.ssm_groups * v.ssm_state, v.heads
    pre = r.prefix("backbone.")
    L = pre + "layers.{i}."
    m = L + "mixer."
    embed = (
        "embedding" if r.keys is not None and pre + "embedding.weight" in r.keys else "embeddings"
    )
    r.same(
        "embed/table", pre + embed + ".weight", False
    )  # mamba_ssm's name (transformers renames it on load)
    r.same("final_norm/scale", pre + "norm_f.weight", False)
    r.same("blocks/norm/scale", L + "norm.weight")
    mixer = tuple(r.block.split("/")) + ("mixer",)
    key = m + "in_proj.weight"
    split_rule(
        r,
        tuple(mixer + (n,) for n in ("in_z", "in_x", "in_b", "in_c", "in_dt")),
        (inner, inner, gs, gs, heads),
        lambda g, i: _T(g(key.format(i=i))),
        lambda w, i: {key.format(i=i): _T(w)},
    )
    conv_w, conv_b = m + "conv1d.weight", m + "conv1d.bias"
    convs = ("conv_x", "conv_b", "conv_c")
    split_rule(
        r,
        tuple(mixer + (n, "w") for n in convs),
        (inner, gs, gs),
        lambda g, i: _T(g(conv_w.format(i=i))[:, 0, :]),  # [channels, 1, taps] -> [taps, channels]
        lambda w, i: {conv_w.format(i=i): _T(w)[:, None, :]},
    )
    split_rule(
        r,
        tuple(mixer + (n, "b") for n in convs),
        (inner, gs, gs),
        lambda g, i: g(conv_b.format(i=i)),
        lambda b, i: {conv_b.format(i=i): b},
    )
    for name in ("dt_bias", "A_log", "D"):
        r.same(f"blocks/mixer/{name}", m + name)
    r.same("blocks/mixer/norm/scale", m + "norm.weight")
    r.linear_in("blocks/mixer/out_proj", m + "out_proj.weight")
    return "lm_head"


FAMILY = Family(
    name="mamba2",
    hf_class="Mamba2ForCausalLM",
    rank=3,
    facts=Mamba2Facts,
    claims=lambda arch: arch.facts.block == "MambaBlock",
    root="DecoderLM",
    read=read_decoder,
    rows=ROWS,
    unsupported=UNSUPPORTED,
    export=_export,
    layout=decoder_layout(_block),
)
