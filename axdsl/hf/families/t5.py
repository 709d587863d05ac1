"""T5 interop: std/t5.axl's `T5` <-> transformers' T5ForConditionalGeneration (T5 v1.1, Flan-T5;
T5 v1.0, the original t5-base: `tied = true` and `mlp = MLP(act = "relu")`).

The decoder-only families share one shape (embed, `blocks`, final norm, head); T5 has two stacks,
a relative position bias per stack and cross-attention, so its facts (read from std's `T5` root),
config.json rows, export config and tensor layout are all its own.

The layout (HF nn.Linear weights are [out, in]; inner = heads * d_kv): HF's tensor and shape,
then axdsl's parameter below it:

    shared                                                    [vocab, dim]
        embed/table
    lm_head                                                   [vocab, dim]
        head [dim, vocab] (absent with `tied = true`: the head is embed/table)
    encoder.block.0.layer.0.SelfAttention.relative_attention_bias  [buckets, heads]
        enc_bias/table
    decoder.block.0.layer.0.SelfAttention.relative_attention_bias  [buckets, heads]
        dec_bias/table
    {encoder,decoder}.block.i.layer.0.SelfAttention.q, k, v   [inner, dim]
        encoder|decoder/attn/wq, wk, wv [dim, heads, d_kv]
    {encoder,decoder}.block.i.layer.0.SelfAttention.o         [dim, inner]
        .../attn/wo [heads, d_kv, dim]
    decoder.block.i.layer.1.EncDecAttention.q, k, v, o        as above
        decoder/cross/wq, wk, wv, wo
    encoder.block.i.layer.1 / decoder.block.i.layer.2 .DenseReluDense.wi_0, wi_1 / wo
                                                              [ffn, dim] / [dim, ffn]
        .../mlp/w_gate, w_up / w_down
    ... .DenseReluDense.wi / wo (feed_forward_proj "relu")   [ffn, dim] / [dim, ffn]
        .../mlp/w_in / w_out (std's MLP(act = "relu"))
    layer.0 / layer.1 (decoder: layer.2) .layer_norm          [dim]
        .../attn_norm, (cross_norm,) mlp_norm scale
    encoder.final_layer_norm, decoder.final_layer_norm        [dim]
        enc_norm/scale, dec_norm/scale

HF's layer 0 holds each stack's bias table, which every layer of the stack reads; here the table
sits beside the stack (`enc_bias`, `dec_bias`) and its bias is a side input of the scan.
`encoder.embed_tokens` and `decoder.embed_tokens` are `shared` (tied); a checkpoint that stores
them must store the same values. A checkpoint without `lm_head` (transformers 5 leaves it out while
it is tied to `shared`) gives `head` the embedding's values; export always writes lm_head.

transformers 5's T5Config always ties `lm_head` to `shared` when it builds a model, and keeps T5
v1.0's output scaling (`scale_decoder_outputs`) apart; from_pretrained unties them when the
checkpoint's lm_head differs. T5 v1.0's head (tie_word_embeddings true or missing, or
scale_decoder_outputs true: decoder outputs scaled by d_model ** -0.5, then `shared` as the head)
is std's `T5(tied = true)`; a checkpoint that stores an lm_head for it must store `shared`'s
values. The ungated feed-forward of T5 v1.0 (`feed_forward_proj = "relu"`) is std's
`MLP(act = "relu")` as T5's `mlp`; other ungated ones are reported unsupported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np

from axdsl.hf.facts import Arch, Facts, fact
from axdsl.hf.facts import hv as _hv
from axdsl.hf.family import Family
from axdsl.hf.fields import Config, Row, Unsupported, _when
from axdsl.hf.layout import Rule

FAMILY_NAME = "t5"
CLASS = "T5ForConditionalGeneration"
ROOT = "T5"  # std/t5.axl's root layer
# the gated feed-forward's activation: GatedMLP act -> feed_forward_proj (transformers maps
# "gated-gelu" to gelu_new, the tanh approximation)
_ACTS = {"gelu_tanh": "gated-gelu", "silu": "gated-silu", "relu": "gated-relu"}
_HF_ACTS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "gelu": "gelu_exact",
}


@dataclass
class T5Facts(Facts):
    """T5: its decoder stack's depth and its relative position buckets, beside the facts of
    `Facts` (`layers` counts the encoder's)."""

    dec_layers: int = fact("T5 dec_layers")
    buckets: int = fact("T5 buckets")
    max_distance: int = fact("T5 max_distance")


def read_arch(bare: Arch[Facts], root) -> Arch[T5Facts]:
    """The facts of a std T5 model (root layer `T5`): sizes, buckets, norm eps, activation."""
    arch = bare.with_facts(T5Facts())
    v, problems = arch.facts, arch.problems
    for k in (
        "vocab",
        "dim",
        "layers",
        "dec_layers",
        "heads",
        "head_dim",
        "buckets",
        "max_distance",
    ):
        setattr(v, k, _hv(root, k))
    v.set(block=ROOT, tied=bool(_hv(root, "tied", False)), kv_heads=v.heads)
    stacks = {"encoder": "T5EncoderBlock", "decoder": "T5DecoderBlock"}
    for name, layer in stacks.items():
        block = root.child(name)
        if block is None or block.layer != layer:
            problems.append(f"`{name}` is not std's {layer}")
            return arch
    norms = [inst for inst in root.walk() if inst.path.rsplit("/", 1)[-1].endswith("norm")]
    kinds = {(n.layer, _hv(n, "eps")) for n in norms}
    if len(kinds) != 1 or next(iter(kinds))[0] != "RMSNorm":
        problems.append(
            "T5's norms must all be one RMSNorm (HF has one layer_norm_epsilon): "
            + ", ".join(f"{n.path} = {n.layer}(eps = {_hv(n, 'eps')})" for n in norms)
        )
    v.norm, v.norm_eps = norms[0].layer, _hv(norms[0], "eps")
    _read_mlp(arch, [root.child(name).child("mlp") for name in stacks])
    return arch


def _read_mlp(arch: Arch[T5Facts], mlps: list) -> None:
    """The feed-forward, one in both stacks: a GatedMLP (T5 v1.1's gated DenseReluDense) or a
    relu MLP without biases (T5 v1.0's ungated one; transformers' other ungated activations are
    not std's MLP's: its "gelu" is the tanh form, HF's the erf)."""
    facts = {
        (m.layer, _hv(m, "act"), _hv(m, "hidden"), _hv(m, "bias", False)) if m is not None else None
        for m in mlps
    }
    first = mlps[0]
    if len(facts) != 1 or first is None or not _expressible(first):
        arch.problems.append(
            'T5\'s feed-forwards must be one GatedMLP, or one MLP(act = "relu", bias = false), '
            "in both stacks (HF's DenseReluDense, gated or T5 v1.0's)"
        )
        return
    arch.facts.set(mlp=first.layer, act=_hv(first, "act"), hidden=_hv(first, "hidden"))


def _expressible(mlp) -> bool:
    """A feed-forward transformers' T5 has: any GatedMLP, or a relu MLP without biases."""
    if mlp.layer == "GatedMLP":
        return True
    return mlp.layer == "MLP" and _hv(mlp, "act") == "relu" and not _hv(mlp, "bias", False)


def _tied_key(c: Config) -> str:
    """The key that states T5 v1.0's tied, scaled head: transformers 5 writes
    scale_decoder_outputs (its tie_word_embeddings is always true); older configs state only
    tie_word_embeddings."""
    return "scale_decoder_outputs" if "scale_decoder_outputs" in c.cfg else "tie_word_embeddings"


def _tied(c: Config) -> bool:
    """T5 v1.0's head (d_model ** -0.5 on the decoder's output, `shared` as lm_head): the key
    `_tied_key` names, true when missing (T5Config's default)."""
    return c.cfg.get(_tied_key(c), True) is not False


def _proj(c: Config) -> str:
    return c.cfg.get("feed_forward_proj", "relu")


def _gated(c: Config) -> bool:
    return _proj(c).startswith("gated-")


def _supported(proj: str) -> bool:
    """The feed-forwards std expresses: gated-{gelu,silu,relu} (GatedMLP) and relu (MLP)."""
    return proj == "relu" or proj in _ACTS.values()


def _act(c: Config) -> str:
    proj = _proj(c)
    name = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
    return _HF_ACTS.get(name, name)


def _row(fld: str, key: str, value: Callable[[Config], Any]) -> Row:
    """A field read from `key` (quoted as config.json states it, else as the default applied)."""
    return Row(fld, key, value, lambda c: c.cfg.get(key, value(c)))


def _cfg(key: str, default: Any) -> Callable[[Config], Any]:
    return lambda c: c.cfg.get(key, default)


# config.json -> facts; missing keys take T5Config's defaults
ROWS = (
    _row("vocab", "vocab_size", _cfg("vocab_size", 32128)),
    _row("dim", "d_model", _cfg("d_model", 512)),
    _row("head_dim", "d_kv", _cfg("d_kv", 64)),
    _row("hidden", "d_ff", _cfg("d_ff", 2048)),
    _row("layers", "num_layers", _cfg("num_layers", 6)),
    _row(
        "dec_layers",
        "num_decoder_layers",
        lambda c: c.cfg.get("num_decoder_layers") or c.cfg.get("num_layers", 6),
    ),
    _row("heads", "num_heads", _cfg("num_heads", 8)),
    _row("buckets", "relative_attention_num_buckets", _cfg("relative_attention_num_buckets", 32)),
    _row(
        "max_distance",
        "relative_attention_max_distance",
        _cfg("relative_attention_max_distance", 128),
    ),
    _row("norm_eps", "layer_norm_epsilon", lambda c: float(c.cfg.get("layer_norm_epsilon", 1e-6))),
    Row("mlp", "feed_forward_proj", lambda c: "GatedMLP" if _gated(c) else "MLP", _proj),
    Row("act", "feed_forward_proj", _act, _proj),
    Row("tied", _tied_key, _tied),
)
UNSUPPORTED: tuple[Unsupported, ...] = (
    lambda c: _when(
        not _supported(_proj(c)),
        f"feed_forward_proj = {json.dumps(_proj(c))} (std/t5.axl has T5 v1.1's gated "
        "feed-forward, gated-gelu, gated-silu or gated-relu, and T5 v1.0's relu)",
    ),
)


def hf_config(arch: Arch[T5Facts], dtype: str) -> dict:
    """The config.json of a std T5 model (export), as google/flan-t5-base's states it (as
    t5-base's, tie_word_embeddings true, when the model is tied)."""
    v = arch.facts
    return {
        "architectures": [CLASS],
        "model_type": FAMILY_NAME,
        "vocab_size": v.vocab,
        "d_model": v.dim,
        "d_kv": v.head_dim,
        "d_ff": v.hidden,
        "num_layers": v.layers,
        "num_decoder_layers": v.dec_layers,
        "num_heads": v.heads,
        "relative_attention_num_buckets": v.buckets,
        "relative_attention_max_distance": v.max_distance,
        "layer_norm_epsilon": v.norm_eps,
        "feed_forward_proj": _ACTS.get(v.act, v.act) if v.mlp == "GatedMLP" else v.act,
        "tie_word_embeddings": v.tied,
        "is_encoder_decoder": True,
        "dropout_rate": 0.0,
        "initializer_factor": 1.0,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "use_cache": True,
        "dtype": dtype,
    }


def _T(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


@dataclass(frozen=True)
class Mapping:
    """One parameter <-> HF tensors; layout.py makes it a Rule. `layers`: the HF layers of its
    stacked slices (None: not stacked)."""

    path: tuple[str, ...]
    load: Callable[..., np.ndarray]  # (get, i) -> the parameter (layer i's slice)
    save: Callable[..., dict[str, np.ndarray]]  # (array, i) -> HF tensors
    layers: tuple[int, ...] | None = None


def mappings(arch: Arch[T5Facts], keys: set[str] | None) -> list[Mapping]:
    """Every parameter's mapping; the encoder's cover its `layers`, the decoder's `dec_layers`."""
    dim, heads, hd = arch.facts.dim, arch.facts.heads, arch.facts.head_dim
    out: list[Mapping] = []

    def add(path: str, load, save, layers: int | None = None) -> None:
        p = tuple(path.split("/"))
        if p in arch.params:
            out.append(Mapping(p, load, save, None if layers is None else tuple(range(layers))))

    def same(path: str, key: str, layers: int | None = None) -> None:
        add(path, lambda g, i: g(key.format(i=i)), lambda a, i: {key.format(i=i): a}, layers)

    def linear(path: str, key: str, layers: int) -> None:  # [out, in] -> [in, out]
        add(
            path, lambda g, i: _T(g(key.format(i=i))), lambda a, i: {key.format(i=i): _T(a)}, layers
        )

    def attention(path: str, key: str, layers: int) -> None:
        for w in ("q", "k", "v"):
            k = f"{key}.{w}.weight"
            add(
                f"{path}/w{w}",
                lambda g, i, k=k: _T(g(k.format(i=i))).reshape(dim, heads, hd),
                lambda a, i, k=k: {k.format(i=i): _T(a.reshape(dim, heads * hd))},
                layers,
            )
        k = f"{key}.o.weight"
        add(
            f"{path}/wo",
            lambda g, i: _T(g(k.format(i=i))).reshape(heads, hd, dim),
            lambda a, i: {k.format(i=i): _T(a.reshape(heads * hd, dim))},
            layers,
        )

    def feed_forward(path: str, key: str, layers: int) -> None:  # only the spec's params map
        for name, w in (("w_gate", "wi_0"), ("w_up", "wi_1"), ("w_in", "wi"), ("w_out", "wo")):
            linear(f"{path}/{name}", f"{key}.DenseReluDense.{w}.weight", layers)
        linear(f"{path}/w_down", f"{key}.DenseReluDense.wo.weight", layers)

    add("embed/table", lambda g, i: _shared(g, keys), lambda a, i: {"shared.weight": a})
    # transformers 5 saves no lm_head while it is tied to `shared` (a model it built, not loaded)
    head = "lm_head.weight" if keys is None or "lm_head.weight" in keys else "shared.weight"
    add("head", lambda g, i: _T(g(head)), lambda a, i: {"lm_head.weight": _T(a)})
    for stack, n in (("encoder", arch.facts.layers), ("decoder", arch.facts.dec_layers)):
        block = f"{stack}.block.{{i}}.layer"
        short = "enc" if stack == "encoder" else "dec"
        same(
            f"{short}_bias/table",
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        )
        same(f"{short}_norm/scale", f"{stack}.final_layer_norm.weight")
        same(f"{stack}/attn_norm/scale", f"{block}.0.layer_norm.weight", n)
        attention(f"{stack}/attn", f"{block}.0.SelfAttention", n)
        ff = 1 if stack == "encoder" else 2
        if stack == "decoder":
            same("decoder/cross_norm/scale", f"{block}.1.layer_norm.weight", n)
            attention("decoder/cross", f"{block}.1.EncDecAttention", n)
        same(f"{stack}/mlp_norm/scale", f"{block}.{ff}.layer_norm.weight", n)
        feed_forward(f"{stack}/mlp", f"{block}.{ff}", n)
    return out


def _shared(get, keys: set[str] | None) -> np.ndarray:
    """The shared embedding; the stacks' embed_tokens, when a checkpoint stores them, must equal
    it."""
    table = get("shared.weight")
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if keys is not None and k in keys and not np.array_equal(get(k), table):
            raise ValueError(f"{k} differs from shared.weight (T5 ties them)")
    return table


def _layout(arch: Arch[T5Facts], keys: set[str] | None) -> list[Rule]:
    return [
        Rule(
            (m.path,),
            m.layers is not None,
            lambda g, i, m=m: (m.load(g, i),),
            lambda a, i, m=m: m.save(a[0], i),
            m.layers,
        )
        for m in mappings(arch, keys)
    ]


FAMILY = Family(
    name=FAMILY_NAME,
    hf_class=CLASS,
    rank=2,
    facts=T5Facts,
    claims=lambda arch: arch.facts.block == ROOT,
    root=ROOT,
    read=read_arch,
    rows=ROWS,
    unsupported=UNSUPPORTED,
    export=hf_config,
    layout=_layout,
)
