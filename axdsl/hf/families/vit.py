"""The vit family: std/vit.axl's VisionTransformer <-> transformers' ViTForImageClassification.

An image classifier does not fit the decoder-shaped code of arch.py and fields.py (no vocabulary,
no positions table of a max_seq, a patch embedding and a class token), so the family's entry has
pieces of its own:

    vit_arch      the spec's side: VisionTransformer's facts, read from its IR
    VIT_FIELDS    config.json -> those facts, and VIT_UNSUPPORTED
    vit_config    the config.json export writes
    _rules        the tensor rules

The layout (HF nn.Linear weights are [out, in]; axdsl's are [in, ...]; the hub's names, which
save_pretrained writes):

    vit.embeddings.cls_token                  [1, 1, dim]              cls_token [1, dim]
    vit.embeddings.position_embeddings        [1, patches + 1, dim]    pos_embed [seq, dim]
    embeddings.patch_embeddings.projection    Conv2d [dim, C, p, p]    patch_embed/w [p*p*C, dim]
                                              (+ bias [dim])           (rows: the patch's pixels,
                                                                       row, column, channel), b
    encoder.layer.i.layernorm_before / _after [dim]                    blocks/attn_norm / mlp_norm
    attention.attention.query (key, value)    [heads*hd, dim]          blocks/attn/wq [dim, heads,
                                                                       hd], bq [heads, hd]
    attention.output.dense                    [dim, heads*hd]          blocks/attn/wo
                                                                       [heads, hd, dim], bo
    intermediate.dense / output.dense         nn.Linear                blocks/mlp/w_in, b_in /
                                                                       w_out, b_out
    vit.layernorm                             [dim]                    final_norm
    classifier                                [classes, dim]           head [dim, classes], head_b

Images: transformers' pixel_values are [B, C, H, W]; the generated forward takes [B, H, W, C]
(channels last), so `images = pixel_values.transpose(0, 2, 3, 1)`.

Not modelled: interpolate_pos_encoding (other image sizes than the config's), the masked-image
`bool_masked_pos` and ViTModel's pooler (not in ViTForImageClassification).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from axdsl.hf.facts import Arch, AttentionFacts, Facts, at, fact
from axdsl.hf.facts import hv as _hv
from axdsl.hf.family import Family
from axdsl.hf.fields import Row, Unsupported, _fact, _key, _when
from axdsl.hf.layout import _T, Rule, _Rules, layer_norm, linear, out_proj

NAME = "vit"
ROOT = "VisionTransformer"
CLASS = "ViTForImageClassification"

_NORMS = ("blocks/attn_norm", "blocks/mlp_norm", "final_norm")


@dataclass
class VitFacts(AttentionFacts):
    """VisionTransformer: its images, patches and classes, beside the facts of std's Block and
    Attention (`AttentionFacts`)."""

    root: str = fact("root layer")
    height: int = fact("height")
    width: int = fact("width")
    patch: int = fact("patch")
    channels: int = fact("channels")
    classes: int = fact("classes")


def vit_arch(bare: Arch[Facts], root: Any) -> Arch[VitFacts]:
    """`bare` (arch.py's Arch of a VisionTransformer model; `root` its IR instance) with the facts
    ViTForImageClassification's config states."""
    arch = bare.with_facts(VitFacts())
    v = arch.facts
    for k in ("dim", "layers", "heads", "height", "width", "patch", "channels", "classes"):
        setattr(v, k, _hv(root, k))
    v.root = ROOT
    blocks = root.child("blocks")
    if blocks is None or blocks.layer != "Block":
        arch.problems.append("the repeated block is not std's Block (ViT's blocks are pre-norm)")
        return arch
    v.block, v.post_norms = "Block", _hv(blocks, "post_norms")
    _read_attention(arch, blocks.child("attn"))
    _read_norms(arch, [at(root, p) for p in _NORMS])
    mlp = blocks.child("mlp")
    v.mlp = None if mlp is None else mlp.layer
    if v.mlp == "MLP":
        v.hidden, v.act, v.mlp_bias = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    else:
        arch.problems.append(f"the feed-forward layer is {v.mlp}; ViT's is MLP(bias = true)")
    if _hv(blocks, "dropout"):
        arch.problems.append("Block dropout > 0 (export writes ViT with dropout off)")
    return arch


def _read_attention(arch: Arch[VitFacts], attn: Any) -> None:
    """ViT's attention: std's Attention, bidirectional, no rope, heads splitting dim, all biases."""
    v = arch.facts
    if attn is None or attn.layer != "Attention":
        arch.problems.append("the block's attention is not std's Attention")
        return
    for k in ("head_dim", "kv_heads", "causal", "rope", "window", "qk_norm"):
        setattr(v, k, _hv(attn, k))
    v.attn_bias, v.out_bias = _hv(attn, "bias"), _hv(attn, "out_bias")
    v.scale, v.softcap = float(_hv(attn, "scale")), float(_hv(attn, "softcap"))
    if v.head_dim * v.heads != v.dim:
        arch.problems.append(
            f"attention head_dim {v.head_dim} is not dim / heads (ViT's heads split " "hidden_size)"
        )


def _read_norms(arch: Arch[VitFacts], norms: list) -> None:
    """ViT's LayerNorms (before attention, before the MLP, the final one) share one eps."""
    kinds = {n.layer if n is not None else None for n in norms}
    arch.facts.norm = kinds.pop() if len(kinds) == 1 else None
    if arch.facts.norm != "LayerNorm":
        arch.problems.append("ViT's norms are all LayerNorm")
        return
    eps = {float(_hv(n, "eps")) for n in norms}
    bias = {_hv(n, "bias") for n in norms}
    arch.facts.norm_eps = eps.pop() if len(eps) == 1 else None
    arch.facts.norm_bias = bias.pop() if len(bias) == 1 else None
    if arch.facts.norm_eps is None:
        arch.problems.append("the LayerNorms' eps differ (ViT has one layer_norm_eps)")


def _image_size(c: Any, i: int) -> int:
    """image_size is an int, or [height, width]."""
    size = c.get("image_size", 224)
    return int(size[i]) if isinstance(size, (list, tuple)) else int(size)


def _patch_size(c: Any) -> int:
    size = c.get("patch_size", 16)
    return int(size[0]) if isinstance(size, (list, tuple)) else int(size)


def _classes(c: Any) -> int:
    """The label count: id2label's size (what save_pretrained writes), else num_labels, else 2."""
    labels = c.get("id2label")
    return len(labels) if labels else int(c.get("num_labels", 2))


# config.json -> facts; transformers' ViTConfig defaults (google/vit-base-patch16-224)
VIT_FIELDS = (
    _fact("root", ROOT),
    _key("hidden_size", 768, "dim"),
    _key("num_hidden_layers", 12, "layers"),
    _key("num_attention_heads", 12, "heads"),
    _key("num_attention_heads", 12, "kv_heads"),
    Row(
        "head_dim",
        "hidden_size/num_attention_heads",
        lambda c: c.get("hidden_size", 768) // c.get("num_attention_heads", 12),
    ),
    Row("height", "image_size", lambda c: _image_size(c, 0), lambda c: c.get("image_size", 224)),
    Row("width", "image_size", lambda c: _image_size(c, 1), lambda c: c.get("image_size", 224)),
    Row("patch", "patch_size", _patch_size, lambda c: c.get("patch_size", 16)),
    _key("num_channels", 3, "channels"),
    Row("classes", lambda c: "id2label" if c.get("id2label") else "num_labels", _classes),
    _fact("block", "Block"),
    _fact("post_norms", False),
    _fact("norm", "LayerNorm"),
    Row("norm_eps", "layer_norm_eps", lambda c: float(c.get("layer_norm_eps", 1e-12))),
    _fact("norm_bias", True),
    _fact("causal", False),
    _fact("rope", False),
    _fact("window", 0),
    _fact("qk_norm", False),
    _fact("scale", 0.0),
    _fact("softcap", 0.0),
    Row("attn_bias", "qkv_bias", lambda c: c.flag("qkv_bias", True)),
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
)
VIT_UNSUPPORTED: tuple[Unsupported, ...] = (
    lambda c: _when(
        c.get("hidden_size", 768) % c.get("num_attention_heads", 12) != 0,
        "hidden_size is not a multiple of num_attention_heads",
    ),
    lambda c: _when(
        isinstance(c.get("patch_size"), (list, tuple)) and len(set(c.get("patch_size"))) != 1,
        f"patch_size={c.cfg.get('patch_size')} (VisionTransformer's patches are square)",
    ),
)


def vit_config(arch: Arch[VitFacts], dtype: str) -> dict[str, Any]:
    """transformers' ViTConfig of a VisionTransformer (export); dropout is off, as in the generated
    forward."""
    v = arch.facts
    acts = {"gelu_exact": "gelu", "gelu": "gelu_new"}
    size = v.height if v.height == v.width else [v.height, v.width]
    return {
        "architectures": [CLASS],
        "model_type": NAME,
        "hidden_size": v.dim,
        "num_hidden_layers": v.layers,
        "num_attention_heads": v.heads,
        "intermediate_size": v.hidden,
        "hidden_act": acts.get(v.act, v.act),
        "layer_norm_eps": v.norm_eps,
        "image_size": size,
        "patch_size": v.patch,
        "num_channels": v.channels,
        "qkv_bias": v.attn_bias,
        "id2label": {str(i): f"LABEL_{i}" for i in range(v.classes)},
        "label2id": {f"LABEL_{i}": i for i in range(v.classes)},
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "encoder_stride": v.patch,
        "dtype": dtype,
    }


def _rules(r: _Rules[VitFacts]) -> list[Rule]:
    """Every VisionTransformer parameter <-> ViTForImageClassification's tensors (this module's
    docstring lists them): the hub's names, or transformers 5's in-memory ones
    (vit.layers.i.attention.q_proj).
    """
    dim, heads, _, _ = r.dims
    v = r.arch.facts
    p, ch = v.patch, v.channels
    e = "vit.embeddings."
    r.rule(
        "cls_token",
        False,
        lambda g, i: g(e + "cls_token").reshape(1, dim),
        lambda a, i: {e + "cls_token": a.reshape(1, 1, dim)},
    )
    r.rule(
        "pos_embed",
        False,
        lambda g, i: g(e + "position_embeddings")[0],
        lambda a, i: {e + "position_embeddings": a[None]},
    )
    conv = e + "patch_embeddings.projection."
    # Conv2d [dim, C, p, p] -> [p, p, C, dim] -> [p*p*C, dim]: rows in the (row, column, channel)
    # order
    r.rule(
        "patch_embed/w",
        False,
        lambda g, i: np.ascontiguousarray(
            np.transpose(g(conv + "weight"), (2, 3, 1, 0)).reshape(p * p * ch, dim)
        ),
        lambda a, i: {
            conv
            + "weight": np.ascontiguousarray(np.transpose(a.reshape(p, p, ch, dim), (3, 2, 0, 1)))
        },
    )
    r.same("patch_embed/b", conv + "bias", False)
    if r.keys is not None and any(k.startswith("vit.layers.") for k in r.keys):
        L = "vit.layers.{i}."
        q, k, val, o = (L + f"attention.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        fc1, fc2 = L + "mlp.fc1", L + "mlp.fc2"
    else:
        L = "vit.encoder.layer.{i}."
        q, k, val = (L + f"attention.attention.{n}" for n in ("query", "key", "value"))
        o, fc1, fc2 = L + "attention.output.dense", L + "intermediate.dense", L + "output.dense"
    layer_norm(r, "blocks/attn_norm", L + "layernorm_before")
    layer_norm(r, "blocks/mlp_norm", L + "layernorm_after")
    for n, key in (("q", q), ("k", k), ("v", val)):
        r.heads_in(f"blocks/attn/w{n}", key + ".weight", heads)
        r.heads_bias(f"blocks/attn/b{n}", key + ".bias", heads)
    out_proj(r, o)
    linear(r, "blocks/mlp/in", fc1)
    linear(r, "blocks/mlp/out", fc2)
    layer_norm(r, "final_norm", "vit.layernorm", False)
    r.rule(
        "head",
        False,
        lambda g, i: _T(g("classifier.weight")),
        lambda w, i: {"classifier.weight": _T(w)},
    )
    r.same("head_b", "classifier.bias", False)
    return r.out


FAMILY = Family(
    name=NAME,
    hf_class=CLASS,
    rank=1,
    facts=VitFacts,
    claims=lambda arch: isinstance(arch.facts, VitFacts) and arch.facts.root == ROOT,
    root=ROOT,
    read=vit_arch,
    rows=VIT_FIELDS,
    unsupported=VIT_UNSUPPORTED,
    export=vit_config,
    layout=lambda arch, keys: _rules(_Rules(arch, keys)),
)
