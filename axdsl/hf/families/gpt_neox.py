"""gpt_neox: GPTNeoXForCausalLM (Pythia): ParallelBlock(), LayerNorm, biases,
MLP(act = "gelu_exact"), rope_dim (partial rotary).

GPT-NeoX's tensors: one fused query_key_value per layer, its output rows grouped by head
([heads, (q, k, v), head_dim]), two LayerNorms, dense_h_to_4h / dense_4h_to_h; embed_in and
embed_out are the embedding and the head.
"""

from __future__ import annotations

import numpy as np

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.facts import Arch
from axdsl.hf.family import Family
from axdsl.hf.fields import Defaults, Row, _when, rope_type_check
from axdsl.hf.layout import Rule, _Rules, decoder_layout, layer_norm, linear, out_proj
from axdsl.hf.parallel import Parallel, parallel_config, parallel_rows

CONFIG = Parallel(
    act="gelu",
    biased=Row("attn_bias", "attention_bias", lambda c: c.flag("attention_bias", True)),
    shared_norm=False,
    head_bias=False,
)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    out = parallel_config(arch, "gpt_neox", "GPTNeoXForCausalLM", dtype)
    out.update(
        use_parallel_residual=True,
        attention_bias=arch.facts.attn_bias,
        hidden_dropout=0.0,
        rotary_pct=out["rope_parameters"]["partial_rotary_factor"],
        rotary_emb_base=out["rope_theta"],
    )
    return out


def _block(r: _Rules[DecoderFacts]) -> str:
    """GPT-NeoX: one fused query_key_value per layer, its output rows grouped by head
    ([heads, (q, k, v), head_dim]), two LayerNorms, dense_h_to_4h / dense_4h_to_h."""
    dim, heads, _, hd = r.dims
    pre = r.prefix("gpt_neox.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_in.weight", False)
    layer_norm(r, "final_norm", pre + "final_layer_norm", False)
    layer_norm(r, "blocks/attn_norm", L + "input_layernorm")
    layer_norm(r, "blocks/mlp_norm", L + "post_attention_layernorm")
    qkv = L + "attention.query_key_value"

    def load_w(g, i):  # [heads * 3 * hd, dim] -> three [dim, heads, hd]
        w = g(qkv.format(i=i) + ".weight").reshape(heads, 3, hd, dim)
        return tuple(np.ascontiguousarray(np.transpose(w[:, j], (2, 0, 1))) for j in range(3))

    def save_w(a, i):
        w = np.stack([np.transpose(x, (1, 2, 0)) for x in a], axis=1)  # [heads, 3, hd, dim]
        return {qkv.format(i=i) + ".weight": np.ascontiguousarray(w.reshape(heads * 3 * hd, dim))}

    def load_b(g, i):
        b = g(qkv.format(i=i) + ".bias").reshape(heads, 3, hd)
        return tuple(np.ascontiguousarray(b[:, j]) for j in range(3))

    def save_b(a, i):
        return {qkv.format(i=i) + ".bias": np.stack(a, axis=1).reshape(heads * 3 * hd)}

    names = ("wq", "wk", "wv")
    if all(("blocks", "attn", n) in r.arch.params for n in names):
        r.out.append(Rule(tuple(("blocks", "attn", n) for n in names), True, load_w, save_w))
    if all(("blocks", "attn", n) in r.arch.params for n in ("bq", "bk", "bv")):
        r.out.append(
            Rule(tuple(("blocks", "attn", n) for n in ("bq", "bk", "bv")), True, load_b, save_b)
        )
    out_proj(r, L + "attention.dense")
    linear(r, "blocks/mlp/in", L + "mlp.dense_h_to_4h")
    linear(r, "blocks/mlp/out", L + "mlp.dense_4h_to_h")
    # the hub's name for the head (transformers 5 renames it lm_head)
    return "embed_out" if r.keys is None or "embed_out.weight" in r.keys else "lm_head"


FAMILY = Family(
    name="gpt_neox",
    hf_class="GPTNeoXForCausalLM",
    rank=6,
    facts=DecoderFacts,
    claims=lambda arch: arch.facts.block == "ParallelBlock",
    root="DecoderLM",
    read=read_decoder,
    rows=parallel_rows(CONFIG),
    unsupported=(
        rope_type_check,
        lambda c: _when(
            not c.cfg.get("use_parallel_residual", True),
            "use_parallel_residual=false (write it as std's Block)",
        ),
    ),
    export=_export,
    layout=decoder_layout(_block),
    # GPTNeoXConfig's
    defaults=Defaults(
        vocab=50432, dim=6144, layers=44, heads=64, hidden=24576, rms_eps=1e-5, partial_rotary=0.25
    ),
)
