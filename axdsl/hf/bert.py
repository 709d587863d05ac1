"""The bert family: std/bert.axl's BertMLM <-> transformers' BertForMaskedLM.

An encoder does not fit the decoder-shaped code of arch.py and fields.py, so the family's pieces
live here, each called from its module's dispatch:

    bert_arch     the spec's side: BertMLM's facts, read from its IR (arch.arch_of)
    BERT_FIELDS   config.json -> those facts, and BERT_UNSUPPORTED (values.hf_values)
    bert_config   the config.json export writes (config.hf_config)

The tensor rules are layout.py's `_bert_rules`, next to the other families'. This module imports
only fields.py, so that arch.py, config.py and values.py can import it without a cycle.

The layout (HF nn.Linear weights are [out, in]; axdsl's are [in, ...]):

    bert.embeddings.word_embeddings          [vocab, dim]        embed/table (also the tied decoder)
    bert.embeddings.position_embeddings      [max_seq, dim]      pos_embed/table (read at segment_positions)
    bert.embeddings.token_type_embeddings    [types, dim]        type_embed/table
    bert.embeddings.LayerNorm                [dim]               embed_norm/scale, shift
    encoder.layer.i.attention.self.query     [heads*hd, dim]     blocks/attn/wq [dim, heads, hd], bq [heads, hd]
      (key, value likewise)                                      blocks/attn/wk, bk, wv, bv
    attention.output.dense                   [dim, heads*hd]     blocks/attn/wo [heads, hd, dim], bo
    attention.output.LayerNorm               [dim]               blocks/attn_norm (post-norm)
    intermediate.dense / output.dense        nn.Linear           blocks/mlp/w_in, b_in / w_out, b_out
    output.LayerNorm                         [dim]               blocks/mlp_norm
    cls.predictions.transform.dense          nn.Linear           head_dense/w, b
    cls.predictions.transform.LayerNorm      [dim]               head_norm
    cls.predictions.bias                     [vocab]             head_b

A checkpoint's tied `cls.predictions.decoder.weight` must equal the word embedding; its
`decoder.bias` is `cls.predictions.bias` again. BertForPreTraining checkpoints (the hub's
bert-base-uncased) also hold the pooler and the next-sentence head, which BertForMaskedLM does not
have: import skips them (`SKIPPED`) and says so.
"""

from __future__ import annotations

import re
from typing import Any

from axdsl.hf.fields import Row, _fact, _key, _when

FAMILY = "bert"
ROOT = "BertMLM"
BLOCK = "BertBlock"
# tensors of BertForPreTraining that BertForMaskedLM has not: skipped on import, with a note
SKIPPED = re.compile(r"^bert\.pooler\.|^cls\.seq_relationship\.|^cls\.predictions\.decoder\.bias$")
TIED = "cls.predictions.decoder.weight"  # the decoder, tied to the word embedding

_NORMS = ("embed_norm", "blocks/attn_norm", "blocks/mlp_norm", "head_norm")


def _hv(inst, name: str) -> Any:
    h = inst.hparam(name) if inst is not None else None
    return None if h is None else h.value.value


def bert_arch(arch: Any, root: Any) -> Any:
    """Fill `arch` (arch.py's Arch of a BertMLM model; `root` its IR instance) with the facts BertForMaskedLM's config states."""
    v = arch.values
    for k in ("vocab", "dim", "layers", "heads", "max_seq", "type_vocab"):
        v[k] = _hv(root, k)
    v["kv_heads"] = v["heads"]
    v.update(
        block=BLOCK,
        positions="learned",
        tied=True,
        causal=False,
        rope=False,
        attn_bias=True,
        out_bias=True,
    )
    blocks = root.child("blocks")
    if blocks is None or blocks.layer != BLOCK:
        arch.problems.append(f"the repeated block is not std's {BLOCK}")
        return arch
    attn = blocks.child("attn")
    v["head_dim"] = _hv(attn, "head_dim")
    if v["head_dim"] * v["heads"] != v["dim"]:
        arch.problems.append(
            f"attention head_dim {v['head_dim']} is not dim / heads (BERT's heads split "
            "hidden_size)"
        )
    _read_norms(arch, [_at(root, p) for p in _NORMS])
    mlp = blocks.child("mlp")
    v["mlp"] = None if mlp is None else mlp.layer
    if v["mlp"] == "MLP":
        v["hidden"], v["act"], v["mlp_bias"] = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    else:
        arch.problems.append(f"the feed-forward layer is {v['mlp']}; BERT's is MLP(bias = true)")
    return arch


def _at(root, path: str):
    inst = root
    for part in path.split("/"):
        inst = None if inst is None else inst.child(part)
    return inst


def _read_norms(arch: Any, norms: list) -> None:
    """BERT's four LayerNorms (embeddings, after attention, after the MLP, the head) share one eps."""
    kinds = {n.layer if n is not None else None for n in norms}
    arch.values["norm"] = kinds.pop() if len(kinds) == 1 else None
    if arch.values["norm"] != "LayerNorm":
        arch.problems.append("BERT's norms are all LayerNorm")
        return
    eps = {float(_hv(n, "eps")) for n in norms}
    bias = {_hv(n, "bias") for n in norms}
    arch.values["norm_eps"] = eps.pop() if len(eps) == 1 else None
    arch.values["norm_bias"] = bias.pop() if len(bias) == 1 else None
    if arch.values["norm_eps"] is None:
        arch.problems.append("the LayerNorms' eps differ (BERT has one layer_norm_eps)")


# config.json -> facts; transformers' BertConfig defaults (bert-base-uncased)
BERT_FIELDS = (
    _key("vocab_size", 30522, "vocab"),
    _key("hidden_size", 768, "dim"),
    _key("num_hidden_layers", 12, "layers"),
    _key("num_attention_heads", 12, "heads"),
    Row(
        "head_dim",
        "hidden_size/num_attention_heads",
        lambda c: c.get("hidden_size", 768) // c.get("num_attention_heads", 12),
    ),
    _key("max_position_embeddings", 512, "max_seq"),
    _key("type_vocab_size", 2, "type_vocab"),
    _fact("positions", "learned"),
    Row("tied", "tie_word_embeddings", lambda c: c.flag("tie_word_embeddings", True)),
    _fact("norm", "LayerNorm"),
    Row("norm_eps", "layer_norm_eps", lambda c: float(c.get("layer_norm_eps", 1e-12))),
    _fact("norm_bias", True),
    _fact("causal", False),
    _fact("rope", False),
    _fact("attn_bias", True),
    _fact("out_bias", True),
    _fact("mlp", "MLP"),
    _key("intermediate_size", 3072, "hidden"),
    Row(
        "act",
        "hidden_act",
        lambda c: {"gelu": "gelu_exact"}.get(c.get("hidden_act", "gelu"), c.get("hidden_act")),
        lambda c: c.get("hidden_act", "gelu"),
    ),
    _fact("mlp_bias", True),
    _fact("block", BLOCK),
)
BERT_UNSUPPORTED: tuple = (
    (
        None,
        lambda c: _when(c.flag("is_decoder", False), "is_decoder=true (BertMLM is bidirectional)"),
    ),
    (None, lambda c: _when(c.flag("add_cross_attention", False), "add_cross_attention=true")),
    (
        None,
        lambda c: _when(
            c.get("position_embedding_type", "absolute") != "absolute",
            f"position_embedding_type={c.cfg.get('position_embedding_type')!r} "
            "(BertMLM's positions are an absolute table)",
        ),
    ),
    (
        None,
        lambda c: _when(
            c.get("hidden_size", 768) % c.get("num_attention_heads", 12) != 0,
            "hidden_size is not a multiple of num_attention_heads",
        ),
    ),
)


def bert_config(v: dict[str, Any], dtype: str) -> dict[str, Any]:
    """transformers' BertConfig of a BertMLM (export); dropout is off, as in the generated forward."""
    acts = {"gelu_exact": "gelu", "gelu": "gelu_new"}
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": FAMILY,
        "vocab_size": v["vocab"],
        "hidden_size": v["dim"],
        "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"],
        "intermediate_size": v["hidden"],
        "hidden_act": acts.get(v["act"], v["act"]),
        "max_position_embeddings": v["max_seq"],
        "type_vocab_size": v["type_vocab"],
        "layer_norm_eps": v["norm_eps"],
        "tie_word_embeddings": True,
        "is_decoder": False,
        "add_cross_attention": False,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "use_cache": True,
        "dtype": dtype,
    }
