"""The bert family: std/bert.axl's BertMLM <-> transformers' BertForMaskedLM.

An encoder does not fit the decoder-shaped code of decoder_arch.py, so the family's entry has
pieces of its own:

    bert_arch     the spec's side: BertMLM's facts, read from its IR
    BERT_FIELDS   config.json -> those facts, and BERT_UNSUPPORTED
    bert_config   the config.json export writes
    _layout       the tensor rules

The layout (HF nn.Linear weights are [out, in]; axdsl's are [in, ...]):

    bert.embeddings.word_embeddings          [vocab, dim]        embed/table (also the tied decoder)
    bert.embeddings.position_embeddings      [max_seq, dim]      pos_embed/table
                                                                 (read at segment_positions)
    bert.embeddings.token_type_embeddings    [types, dim]        type_embed/table
    bert.embeddings.LayerNorm                [dim]               embed_norm/scale, shift
    encoder.layer.i.attention.self.query     [heads*hd, dim]     blocks/attn/wq [dim, heads, hd],
                                                                 bq [heads, hd]
      (key, value likewise)                                      blocks/attn/wk, bk, wv, bv
    attention.output.dense                   [dim, heads*hd]     blocks/attn/wo [heads, hd, dim], bo
    attention.output.LayerNorm               [dim]               blocks/attn_norm (post-norm)
    intermediate.dense / output.dense        nn.Linear           blocks/mlp/w_in, b_in / w_out,
                                                                 b_out
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
from dataclasses import dataclass
from typing import Any

from axdsl.hf.facts import Arch, Facts, at, fact
from axdsl.hf.facts import hv as _hv
from axdsl.hf.family import Family
from axdsl.hf.fields import Row, Unsupported, _fact, _key, _when
from axdsl.hf.layout import _T, Rule, _Rules, layer_norm, linear, out_proj

NAME = "bert"
CLASS = "BertForMaskedLM"
ROOT = "BertMLM"
BLOCK = "BertBlock"
# tensors of BertForPreTraining that BertForMaskedLM has not: skipped on import, with a note
SKIPPED = re.compile(r"^bert\.pooler\.|^cls\.seq_relationship\.|^cls\.predictions\.decoder\.bias$")
TIED = "cls.predictions.decoder.weight"  # the decoder, tied to the word embedding

_NORMS = ("embed_norm", "blocks/attn_norm", "blocks/mlp_norm", "head_norm")


@dataclass
class BertFacts(Facts):
    """BertMLM: its token types, beside the facts of `Facts`."""

    type_vocab: int = fact("type_vocab")


def bert_arch(bare: Arch[Facts], root: Any) -> Arch[BertFacts]:
    """`bare` (arch.py's Arch of a BertMLM model; `root` its IR instance) with the facts
    BertForMaskedLM's config states."""
    arch = bare.with_facts(BertFacts())
    v = arch.facts
    for k in ("vocab", "dim", "layers", "heads", "max_seq", "type_vocab"):
        setattr(v, k, _hv(root, k))
    v.kv_heads = v.heads
    v.set(
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
    v.head_dim = _hv(attn, "head_dim")
    if v.head_dim * v.heads != v.dim:
        arch.problems.append(
            f"attention head_dim {v.head_dim} is not dim / heads (BERT's heads split "
            "hidden_size)"
        )
    _read_norms(arch, [at(root, p) for p in _NORMS])
    mlp = blocks.child("mlp")
    v.mlp = None if mlp is None else mlp.layer
    if v.mlp == "MLP":
        v.hidden, v.act, v.mlp_bias = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    else:
        arch.problems.append(f"the feed-forward layer is {v.mlp}; BERT's is MLP(bias = true)")
    return arch


def _read_norms(arch: Arch[BertFacts], norms: list) -> None:
    """BERT's four LayerNorms (embeddings, after attention, after the MLP, the head) share one
    eps."""
    kinds = {n.layer if n is not None else None for n in norms}
    arch.facts.norm = kinds.pop() if len(kinds) == 1 else None
    if arch.facts.norm != "LayerNorm":
        arch.problems.append("BERT's norms are all LayerNorm")
        return
    eps = {float(_hv(n, "eps")) for n in norms}
    bias = {_hv(n, "bias") for n in norms}
    arch.facts.norm_eps = eps.pop() if len(eps) == 1 else None
    arch.facts.norm_bias = bias.pop() if len(bias) == 1 else None
    if arch.facts.norm_eps is None:
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
BERT_UNSUPPORTED: tuple[Unsupported, ...] = (
    lambda c: _when(c.flag("is_decoder", False), "is_decoder=true (BertMLM is bidirectional)"),
    lambda c: _when(c.flag("add_cross_attention", False), "add_cross_attention=true"),
    lambda c: _when(
        c.get("position_embedding_type", "absolute") != "absolute",
        f"position_embedding_type={c.cfg.get('position_embedding_type')!r} "
        "(BertMLM's positions are an absolute table)",
    ),
    lambda c: _when(
        c.get("hidden_size", 768) % c.get("num_attention_heads", 12) != 0,
        "hidden_size is not a multiple of num_attention_heads",
    ),
)


def bert_config(arch: Arch[BertFacts], dtype: str) -> dict[str, Any]:
    """transformers' BertConfig of a BertMLM (export); dropout is off, as in the generated
    forward."""
    v = arch.facts
    acts = {"gelu_exact": "gelu", "gelu": "gelu_new"}
    return {
        "architectures": [CLASS],
        "model_type": NAME,
        "vocab_size": v.vocab,
        "hidden_size": v.dim,
        "num_hidden_layers": v.layers,
        "num_attention_heads": v.heads,
        "intermediate_size": v.hidden,
        "hidden_act": acts.get(v.act, v.act),
        "max_position_embeddings": v.max_seq,
        "type_vocab_size": v.type_vocab,
        "layer_norm_eps": v.norm_eps,
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


def _layout(arch: Arch[BertFacts], keys: set[str] | None) -> list[Rule]:
    """Every BertMLM parameter <-> BertForMaskedLM's tensors (listed above)."""
    r = _Rules(arch, keys)
    _, heads, _, _ = r.dims
    pre = r.prefix("bert.")
    e = pre + "embeddings."
    r.same("embed/table", e + "word_embeddings.weight", False)
    r.same("pos_embed/table", e + "position_embeddings.weight", False)
    r.same("type_embed/table", e + "token_type_embeddings.weight", False)
    layer_norm(r, "embed_norm", e + "LayerNorm", False)
    L = pre + "encoder.layer.{i}."
    for n, key in (("q", "query"), ("k", "key"), ("v", "value")):
        r.heads_in(f"blocks/attn/w{n}", L + f"attention.self.{key}.weight", heads)
        r.heads_bias(f"blocks/attn/b{n}", L + f"attention.self.{key}.bias", heads)
    out_proj(r, L + "attention.output.dense")
    layer_norm(r, "blocks/attn_norm", L + "attention.output.LayerNorm")
    linear(r, "blocks/mlp/in", L + "intermediate.dense")
    linear(r, "blocks/mlp/out", L + "output.dense")
    layer_norm(r, "blocks/mlp_norm", L + "output.LayerNorm")
    t = "cls.predictions.transform."
    r.rule(
        "head_dense/w",
        False,
        lambda g, i: _T(g(t + "dense.weight")),
        lambda w, i: {t + "dense.weight": _T(w)},
    )
    r.same("head_dense/b", t + "dense.bias", False)
    layer_norm(r, "head_norm", t + "LayerNorm", False)
    bias = "cls.predictions.bias"
    if keys is not None and bias not in keys and "cls.predictions.decoder.bias" in keys:
        bias = "cls.predictions.decoder.bias"
    r.same("head_b", bias, False)
    return r.out


FAMILY = Family(
    name=NAME,
    hf_class=CLASS,
    rank=0,
    facts=BertFacts,
    claims=lambda arch: arch.facts.block == BLOCK,
    root=ROOT,
    read=bert_arch,
    rows=BERT_FIELDS,
    unsupported=BERT_UNSUPPORTED,
    export=bert_config,
    layout=_layout,
    skipped=SKIPPED,
    skipped_what=" (the pooler, the next-sentence head)",
    tied_head=TIED,
)
