"""gpt2: GPT2LMHeadModel (learned positions, LayerNorm, biased attention, MLP(act = "gelu")).

GPT-2's Conv1D weights are [in, out] already, and c_attn holds q, k and v side by side.
"""

from __future__ import annotations

import numpy as np

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.facts import Arch
from axdsl.hf.family import Family
from axdsl.hf.fields import _PLAIN, TANH_GELU, Defaults, Row, _fact, _key, _layers, _when
from axdsl.hf.layout import Rule, _Rules, decoder_layout

_ACTS = {**{a: "gelu" for a in TANH_GELU}, "relu": "relu", "silu": "silu", "swish": "silu"}

ROWS = (
    _key("vocab_size", 50257, "vocab"),
    _key("n_embd", 768, "dim"),
    Row("layers", "n_layer", _layers),
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
        lambda c: _ACTS.get(
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
    Row("layer_windows", "n_layer", lambda c: (0,) * _layers(c), _layers),
)

UNSUPPORTED = (
    lambda c: _when(
        not c.cfg.get("scale_attn_weights", True),
        "scale_attn_weights=false (axdsl scales by 1/sqrt(head_dim))",
    ),
    lambda c: _when(
        c.cfg.get("scale_attn_by_inverse_layer_idx", False),
        "scale_attn_by_inverse_layer_idx=true",
    ),
    lambda c: _when(c.cfg.get("add_cross_attention", False), "add_cross_attention=true"),
)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    v = arch.facts
    acts = {"gelu": "gelu_new", "relu": "relu", "silu": "silu"}
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": v.vocab,
        "n_embd": v.dim,
        "n_layer": v.layers,
        "n_head": v.heads,
        "n_inner": v.hidden,
        "n_positions": v.max_seq,
        "n_ctx": v.max_seq,
        "activation_function": acts.get(v.act, v.act),
        "layer_norm_epsilon": v.norm_eps,
        "tie_word_embeddings": v.tied,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def _block(r: _Rules[DecoderFacts]) -> str:
    """GPT-2: Conv1D weights are [in, out] already; c_attn holds q, k and v side by side."""
    dim, heads, _, hd = r.dims
    pre = r.prefix("transformer.")  # the hub's gpt2 checkpoints name GPT2Model's tensors bare
    h = pre + "h.{i}."
    r.same("embed/table", pre + "wte.weight", False)
    r.same("pos_embed", pre + "wpe.weight", False)
    for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
        r.same(f"blocks/{ours}/scale", h + theirs + ".weight")
        r.same(f"blocks/{ours}/shift", h + theirs + ".bias")
    r.same("final_norm/scale", pre + "ln_f.weight", False)
    r.same("final_norm/shift", pre + "ln_f.bias", False)
    r.out.append(
        Rule(
            tuple(("blocks", "attn", n) for n in ("wq", "wk", "wv")),
            True,
            lambda g, i: tuple(
                w.reshape(dim, heads, hd)
                for w in np.split(g(h.format(i=i) + "attn.c_attn.weight"), 3, axis=1)
            ),
            lambda a, i: {
                h.format(i=i)
                + "attn.c_attn.weight": np.ascontiguousarray(
                    np.concatenate([w.reshape(dim, heads * hd) for w in a], axis=1)
                )
            },
        )
    )
    r.out.append(
        Rule(
            tuple(("blocks", "attn", n) for n in ("bq", "bk", "bv")),
            True,
            lambda g, i: tuple(
                b.reshape(heads, hd) for b in np.split(g(h.format(i=i) + "attn.c_attn.bias"), 3)
            ),
            lambda a, i: {
                h.format(i=i) + "attn.c_attn.bias": np.concatenate([b.reshape(-1) for b in a])
            },
        )
    )
    r.rule(
        "blocks/attn/wo",
        True,
        lambda g, i: g(h.format(i=i) + "attn.c_proj.weight").reshape(heads, hd, dim),
        lambda a, i: {h.format(i=i) + "attn.c_proj.weight": a.reshape(heads * hd, dim)},
    )
    r.same("blocks/attn/bo", h + "attn.c_proj.bias")
    r.same("blocks/mlp/w_in", h + "mlp.c_fc.weight")
    r.same("blocks/mlp/b_in", h + "mlp.c_fc.bias")
    r.same("blocks/mlp/w_out", h + "mlp.c_proj.weight")
    r.same("blocks/mlp/b_out", h + "mlp.c_proj.bias")
    return "lm_head"


FAMILY = Family(
    name="gpt2",
    hf_class="GPT2LMHeadModel",
    rank=9,
    facts=DecoderFacts,
    claims=lambda arch: arch.facts.positions == "learned" or arch.facts.norm == "LayerNorm",
    root="DecoderLM",
    read=read_decoder,
    rows=ROWS,
    unsupported=UNSUPPORTED,
    export=_export,
    layout=decoder_layout(_block),
    defaults=Defaults(layers=12),  # GPT2Config's n_layer (its other defaults are ROWS')
)
