"""deepseek_v3: DeepseekV3ForCausalLM (std/deepseek.axl): MLAttention, dense_layers of SwiGLU,
then DeepSeekMoE.

Multi-head latent attention, the first `first_k_dense_replace` layers dense (SwiGLU of
intermediate_size), the rest DeepSeek's MoE (sigmoid router with a selection bias, expert groups,
shared experts). The spec's `layers` counts the MoE layers only; HF layers 0 .. k-1 are the
stacked `dense_blocks`, layers k .. the `blocks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from axdsl.hf.decoder import MoeFacts
from axdsl.hf.decoder_arch import read_decoder
from axdsl.hf.facts import Arch, fact
from axdsl.hf.family import Family
from axdsl.hf.fields import (
    ROPE_ROWS,
    Config,
    Defaults,
    Row,
    _fact,
    _key,
    _layers,
    _when,
    rope_parameters,
    rope_type_check,
)
from axdsl.hf.layout import _T, Rule, _Rules, mlp_moe_names, moe_rules


@dataclass
class DeepSeekFacts(MoeFacts):
    """DeepSeek-V3: multi-head latent attention, the dense first blocks and DeepSeek's MoE (expert
    groups, a routed scale, a sigmoid score), beside the facts of `MoeFacts`."""

    attn: str | None = fact("attention layer")
    dense_hidden: int | None = fact("the dense blocks' SwiGLU hidden")
    q_rank: int = fact("MLAttention q_rank")
    kv_rank: int = fact("MLAttention kv_rank")
    nope_dim: int = fact("MLAttention nope_dim")
    v_head_dim: int = fact("MLAttention v_head_dim")
    rope_interleaved: bool = fact("attention rope_interleaved")
    latent_norm_eps: float = fact("MLAttention kv_norm eps")
    groups: int = fact("DeepSeekMoE groups")
    top_groups: int = fact("DeepSeekMoE top_groups")
    routed_scale: float = fact("DeepSeekMoE scale")
    score: str = fact("DeepSeekMoE score")


def _dense_layers(c: Config) -> int:
    return min(c.get("first_k_dense_replace", 3), _layers(c))


def _yarn_mscale(c: Config) -> float:
    """transformers' yarn_get_mscale(factor, mscale_all_dim), when a rope scaling sets
    mscale_all_dim."""
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
ROWS = (
    _key("vocab_size", 129280, "vocab"),
    _key("hidden_size", 7168, "dim"),
    Row(  # the spec's `layers` counts the MoE layers: say so, with both keys' values
        "layers",
        lambda c: f"MoE layers (num_hidden_layers {_layers(c)} - first_k_dense_replace "
        f"{_dense_layers(c)})",
        lambda c: _layers(c) - _dense_layers(c),
    ),
    Row("dense_layers", "first_k_dense_replace", _dense_layers),
    _key("num_attention_heads", 128, "heads"),
    Row("kv_heads", "num_key_value_heads", lambda c: c.get("num_key_value_heads", 128)),
    _fact("attn", "MLAttention"),
    # missing: 1536; null: no low-rank query (q_proj)
    Row("q_rank", "q_lora_rank", lambda c: c.cfg.get("q_lora_rank", 1536) or 0),
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
UNSUPPORTED = (
    rope_type_check,
    lambda c: _when(
        c.get("hidden_act", "silu") != "silu",
        f"hidden_act={c.cfg.get('hidden_act')!r} (SwiGLU and MoE experts use silu)",
    ),
    lambda c: _when(
        c.get("scoring_func", "sigmoid") != "sigmoid",
        f"scoring_func={c.cfg.get('scoring_func')!r} (DeepSeekMoE scores with sigmoid)",
    ),
    lambda c: _when(
        c.get("topk_method", "noaux_tc") != "noaux_tc",
        f"topk_method={c.cfg.get('topk_method')!r} (group-limited top-k with a selection "
        "bias is noaux_tc)",
    ),
    lambda c: _when(
        c.get("moe_layer_freq", 1) != 1,
        f"moe_layer_freq={c.cfg.get('moe_layer_freq')} (every layer after the dense ones is MoE)",
    ),
)


def _export(arch: Arch[DeepSeekFacts], dtype: str) -> dict:
    """DeepSeek-V3: latent attention, dense first layers, then DeepSeek's MoE."""
    v = arch.facts
    theta = v.rope_theta if v.rope_theta is not None else 10000.0
    rope = rope_parameters(v, theta, partial=False)
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "intermediate_size": v.dense_hidden or v.hidden,
        "moe_intermediate_size": v.hidden,
        "num_hidden_layers": v.dense_layers + v.layers,
        "first_k_dense_replace": v.dense_layers,
        "num_attention_heads": v.heads,
        "num_key_value_heads": v.kv_heads,
        "q_lora_rank": v.q_rank or None,
        "kv_lora_rank": v.kv_rank,
        "qk_nope_head_dim": v.nope_dim,
        "qk_rope_head_dim": v.rope_dim,
        "v_head_dim": v.v_head_dim,
        "rope_interleave": v.rope_interleaved,
        "n_routed_experts": v.experts,
        "num_experts_per_tok": v.top_k,
        "n_group": v.groups,
        "topk_group": v.top_groups,
        "routed_scaling_factor": v.routed_scale,
        "norm_topk_prob": v.normalize,
        "n_shared_experts": v.shared,
        "hidden_act": "silu",
        "max_position_embeddings": v.max_seq,
        "rms_norm_eps": v.norm_eps,
        "rope_theta": theta,
        "rope_parameters": rope,
        "attention_bias": False,
        "tie_word_embeddings": v.tied,
        "num_nextn_predict_layers": 0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def _layout(arch: Arch[DeepSeekFacts], keys: set[str] | None) -> list[Rule]:
    """DeepSeek-V3: HF layers 0 .. k-1 are the stacked `dense_blocks`, layers k .. the `blocks`."""
    r = _Rules(arch, keys)
    pre = r.prefix("model.")
    r.same("embed/table", pre + "embed_tokens.weight", False)
    r.same("final_norm/scale", pre + "norm.weight", False)
    r.rule(
        "head", False, lambda g, i: _T(g("lm_head.weight")), lambda w, i: {"lm_head.weight": _T(w)}
    )
    dense = arch.facts.dense_layers or 0
    out = list(r.out)
    for block, ids in (
        ("dense_blocks", range(dense)),
        ("blocks", range(dense, dense + arch.facts.layers)),
    ):
        br = _Rules(arch, keys, block=block)
        moe = block == "blocks" and arch.facts.mlp == "DeepSeekMoE"
        _latent_block_rules(br, pre + "layers.{i}.", moe)
        if moe:
            br.out += moe_rules(
                mlp_moe_names(keys),
                arch.facts.experts,
                arch.facts.hidden,
                pre + "layers.{i}.",
                keys,
                block,
            )
        out += [Rule(x.paths, True, x.load, x.save, tuple(ids)) for x in br.out]
    return out


def _latent_block_rules(r: _Rules[DeepSeekFacts], L: str, moe: bool) -> None:
    """One DeepSeek layer's norms, latent attention, and SwiGLU (dense) or router bias and shared
    experts."""
    v = r.arch.facts
    dim, heads = v.dim, v.heads
    qk, q_rank, kv_rank = v.nope_dim + v.rope_dim, v.q_rank, v.kv_rank
    r.same("blocks/attn_norm/scale", L + "input_layernorm.weight")
    r.same("blocks/mlp_norm/scale", L + "post_attention_layernorm.weight")
    a = L + "self_attn."

    def heads_in(
        path: str, key: str, rows: int, per_head: int
    ) -> None:  # [heads*per_head, rows] -> [rows, heads, per_head]
        r.rule(
            path,
            True,
            lambda g, i: _T(g(key.format(i=i))).reshape(rows, heads, per_head),
            lambda w, i: {key.format(i=i): _T(w.reshape(rows, heads * per_head))},
        )

    heads_in("blocks/attn/wq", a + "q_proj.weight", dim, qk)
    r.linear_in("blocks/attn/wq_a", a + "q_a_proj.weight")
    r.same("blocks/attn/q_norm/scale", a + "q_a_layernorm.weight")
    heads_in("blocks/attn/wq_b", a + "q_b_proj.weight", q_rank, qk)
    r.linear_in("blocks/attn/wkv_a", a + "kv_a_proj_with_mqa.weight")
    r.same("blocks/attn/kv_norm/scale", a + "kv_a_layernorm.weight")
    heads_in("blocks/attn/wkv_b", a + "kv_b_proj.weight", kv_rank, v.nope_dim + v.v_head_dim)
    vd = v.v_head_dim
    r.rule(
        "blocks/attn/wo",
        True,
        lambda g, i: _T(g(a.format(i=i) + "o_proj.weight")).reshape(heads, vd, dim),
        lambda w, i: {a.format(i=i) + "o_proj.weight": _T(w.reshape(heads * vd, dim))},
    )
    for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
        if moe:
            r.linear_in(f"blocks/mlp/shared_mlp/{ours}", L + f"mlp.shared_experts.{theirs}.weight")
        else:
            r.linear_in(f"blocks/mlp/{ours}", L + f"mlp.{theirs}.weight")
    r.same("blocks/mlp/score_bias", L + "mlp.gate.e_score_correction_bias")


FAMILY = Family(
    name="deepseek_v3",
    hf_class="DeepseekV3ForCausalLM",
    rank=4,
    facts=DeepSeekFacts,
    claims=lambda arch: arch.facts.mlp == "DeepSeekMoE"
    or (isinstance(arch.facts, DeepSeekFacts) and arch.facts.attn == "MLAttention"),
    root="DecoderLM",
    read=read_decoder,
    rows=ROWS,
    unsupported=UNSUPPORTED,
    export=_export,
    layout=_layout,
    defaults=Defaults(layers=61),  # DeepseekV3Config's num_hidden_layers (the others are ROWS')
)
