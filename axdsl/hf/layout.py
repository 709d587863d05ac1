"""Tensor names and layouts: the pieces every family's layout is made of.

A `Rule` maps some axdsl parameters to some HF tensors, both ways, for the whole model or for
block layer i (HF's layer i is index i of the stacked `blocks` arrays). HF nn.Linear weights are
[out, in]; axdsl's are [in, ...]. Each family's registry entry lists the rules of every parameter
an Arch has (`Family.layout`, which `rules` asks); on import `keys` (the checkpoint's tensor names)
picks among equivalent layouts. Shared here: the rule shapes (`_Rules`), the DecoderLM frame with
its block patterns (`decoder_layout`), Llama's block and the MoE experts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from axdsl.hf.facts import Arch, Facts

F = TypeVar("F", bound=Facts)

# tensors HF checkpoints may hold that are not parameters
BUFFERS = re.compile(r"(^|\.)attn\.(masked_)?bias$|rotary_emb\.inv_freq$")


@dataclass
class Rule:
    """Some axdsl parameters <-> some HF tensors, for the whole model or for block layer i."""

    paths: tuple[tuple[str, ...], ...]
    layered: bool
    load: Callable[..., tuple[np.ndarray, ...]]  # (get, i) -> one array per path (layer i's slice)
    save: Callable[..., dict[str, np.ndarray]]  # (arrays, i) -> HF tensors
    layers: tuple[int, ...] | None = None  # the HF layers of the stacked slices (None: every layer)

    def layer_ids(self, count: int) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(count))


def _T(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


@dataclass
class _Rules(Generic[F]):
    """The rules being listed, and the one-parameter rule shapes (kept only for parameters `arch`
    has); `arch` typed as the family's facts."""

    arch: Arch[F]
    keys: set[str] | None
    out: list[Rule] = field(default_factory=list)
    block: str = "blocks"  # the repeated block's path: blocks, or blocks/<e> for pattern element e

    @property
    def dims(self) -> tuple[int, int, int, int]:
        v = self.arch.facts
        return v.dim, v.heads, v.kv_heads, v.head_dim

    def prefix(self, pre: str) -> str:
        """`pre`, unless the checkpoint's tensors have no such prefix (the hub's bare models)."""
        if self.keys is not None and not any(k.startswith(pre) for k in self.keys):
            return ""
        return pre

    def rule(self, path: str, layered: bool, load, save) -> None:
        if path.startswith("blocks/"):
            path = self.block + path.removeprefix("blocks")
        p = tuple(path.split("/"))
        if p in self.arch.params:
            self.out.append(
                Rule((p,), layered, lambda g, i: (load(g, i),), lambda a, i: save(a[0], i))
            )

    def same(self, path: str, key: str, layered: bool = True) -> None:  # stored as it is
        self.rule(path, layered, lambda g, i: g(key.format(i=i)), lambda a, i: {key.format(i=i): a})

    def linear_in(self, path: str, key: str) -> None:  # nn.Linear [out, in] -> [in, out]
        self.rule(
            path, True, lambda g, i: _T(g(key.format(i=i))), lambda a, i: {key.format(i=i): _T(a)}
        )

    def heads_in(self, path: str, key: str, n: int) -> None:  # [n*hd, dim] -> [dim, n, hd]
        dim, _, _, hd = self.dims
        self.rule(
            path,
            True,
            lambda g, i: _T(g(key.format(i=i))).reshape(dim, n, hd),
            lambda a, i: {key.format(i=i): _T(a.reshape(dim, n * hd))},
        )

    def heads_bias(self, path: str, key: str, n: int) -> None:  # [n*hd] -> [n, hd]
        hd = self.dims[3]
        self.rule(
            path,
            True,
            lambda g, i: g(key.format(i=i)).reshape(n, hd),
            lambda a, i: {key.format(i=i): a.reshape(n * hd)},
        )


# A block body: adds the rules of one repeated block and the model-level ones, and names the head
# tensor (lm_head, or GPT-NeoX's embed_out).
Body = Callable[["_Rules[F]"], str]
# The MoE module's name and its experts' (gate, up, down) tensor names, given the checkpoint's keys
MoeNames = Callable[["set[str] | None"], tuple[str, tuple[str, str, str]]]


def decoder_layout(body: Body[F]) -> Callable[[Arch[F], set[str] | None], list[Rule]]:
    """The layout of a DecoderLM family: embedding, `blocks` (one block, or a pattern of them),
    final norm and head, with `body` giving one block's tensors."""

    def layout(arch: Arch[F], keys: set[str] | None) -> list[Rule]:
        if arch.pattern:
            return _pattern_rules(body, arch, keys)
        return _family_rules(body, _Rules(arch, keys))

    return layout


def _pattern_rules(body: Body[F], arch: Arch[F], keys: set[str] | None) -> list[Rule]:
    """A pattern of k blocks: layer i is element i % k, at index i // k of blocks/<e>; when k does
    not divide the layers, the scanned ones are blocks/groups/<e> and the last layers, run once
    after the scan, blocks/tail/<e> (one HF layer each, not stacked)."""
    k, scanned = arch.pattern, arch.facts.layers - arch.tail
    group = "blocks/groups" if arch.tail else "blocks"
    out: list[Rule] = []
    for e in range(k):
        ids = tuple(range(e, scanned, k))
        for rule in _family_rules(body, _Rules(arch, keys, block=f"{group}/{e}")):
            if rule.layered:
                out.append(Rule(rule.paths, True, rule.load, rule.save, ids))
            elif e == 0:
                out.append(rule)
    for e in range(arch.tail):
        layer = scanned + e
        for rule in _family_rules(body, _Rules(arch, keys, block=f"blocks/tail/{e}")):
            if rule.layered:
                out.append(
                    Rule(
                        rule.paths,
                        False,
                        lambda g, _, r=rule, i=layer: r.load(g, i),
                        lambda a, _, r=rule, i=layer: r.save(a, i),
                    )
                )
    return out


def _family_rules(body: Body[F], r: _Rules[F]) -> list[Rule]:
    head = body(r)
    r.rule(
        "head", False, lambda g, i: _T(g(f"{head}.weight")), lambda w, i: {f"{head}.weight": _T(w)}
    )
    r.same("head_b", f"{head}.bias", False)
    return r.out


def mlp_moe_names(keys: set[str] | None) -> tuple[str, tuple[str, str, str]]:
    """The MoE module `mlp.`, experts' gate_proj, up_proj and down_proj (Qwen3-MoE, DeepSeek)."""
    return "mlp.", ("gate_proj", "up_proj", "down_proj")


def llama_block(r: _Rules[F], sandwich: bool = False, moe_names: MoeNames = mlp_moe_names) -> str:
    """Llama and its relatives: q/k/v/o projections, optional biases and qk norms, SwiGLU or MoE;
    `sandwich`: Gemma's norms after attention and the feed-forward too."""
    dim, heads, kv, hd = r.dims
    pre = r.prefix("model.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_tokens.weight", False)
    r.same("final_norm/scale", pre + "norm.weight", False)
    r.same("blocks/attn_norm/scale", L + "input_layernorm.weight")
    if sandwich:  # post_attention_layernorm follows attention
        r.same("blocks/attn_post_norm/scale", L + "post_attention_layernorm.weight")
        r.same("blocks/mlp_norm/scale", L + "pre_feedforward_layernorm.weight")
        r.same("blocks/mlp_post_norm/scale", L + "post_feedforward_layernorm.weight")
    else:
        r.same("blocks/mlp_norm/scale", L + "post_attention_layernorm.weight")
    a = L + "self_attn."
    r.heads_in("blocks/attn/wq", a + "q_proj.weight", heads)
    r.heads_in("blocks/attn/wk", a + "k_proj.weight", kv)
    r.heads_in("blocks/attn/wv", a + "v_proj.weight", kv)
    r.rule(
        "blocks/attn/wo",
        True,
        lambda g, i: _T(g(a.format(i=i) + "o_proj.weight")).reshape(heads, hd, dim),
        lambda w, i: {a.format(i=i) + "o_proj.weight": _T(w.reshape(heads * hd, dim))},
    )
    r.heads_bias("blocks/attn/bq", a + "q_proj.bias", heads)
    r.heads_bias("blocks/attn/bk", a + "k_proj.bias", kv)
    r.heads_bias("blocks/attn/bv", a + "v_proj.bias", kv)
    r.same("blocks/attn/bo", a + "o_proj.bias")
    r.same("blocks/attn/q_norm/scale", a + "q_norm.weight")
    r.same("blocks/attn/k_norm/scale", a + "k_norm.weight")
    if r.arch.facts.mlp == "MoE":  # the MoE families' type (MoeFacts) has `experts`
        r.out += moe_rules(
            moe_names(r.keys), r.arch.facts.get("experts"), r.arch.facts.hidden, L, r.keys
        )
    else:
        r.linear_in("blocks/mlp/w_gate", L + "mlp.gate_proj.weight")
        r.linear_in("blocks/mlp/w_up", L + "mlp.up_proj.weight")
        r.linear_in("blocks/mlp/w_down", L + "mlp.down_proj.weight")
    return "lm_head"


def layer_norm(r: _Rules[F], ours: str, theirs: str, layered: bool = True) -> None:
    r.same(f"{ours}/scale", theirs + ".weight", layered)
    r.same(f"{ours}/shift", theirs + ".bias", layered)


def linear(r: _Rules[F], ours: str, theirs: str) -> None:
    """An nn.Linear with a bias: weight [out, in] -> w [in, out], bias as it is."""
    w, b = ours.rsplit("/", 1)[0] + "/w_", ours.rsplit("/", 1)[0] + "/b_"
    name = ours.rsplit("/", 1)[1]
    r.linear_in(w + name, theirs + ".weight")
    r.same(b + name, theirs + ".bias")


def out_proj(r: _Rules[F], key: str) -> None:
    """The attention output projection [dim, heads*hd] -> wo [heads, hd, dim], and its bias."""
    dim, heads, _, hd = r.dims
    r.rule(
        "blocks/attn/wo",
        True,
        lambda g, i: _T(g(key.format(i=i) + ".weight")).reshape(heads, hd, dim),
        lambda w, i: {key.format(i=i) + ".weight": _T(w.reshape(heads * hd, dim))},
    )
    r.same("blocks/attn/bo", key + ".bias")


def split_rule(
    r: _Rules[F], paths: tuple[tuple[str, ...], ...], sizes: tuple[int, ...], load_one, save_one
) -> None:
    """One HF tensor holding several axdsl parameters side by side on its last axis (as loaded):
    `load_one(g, i)` gives it, `save_one(whole, i)` writes it back; the parts have `sizes`."""
    if not all(p in r.arch.params for p in paths):
        return
    cuts = np.cumsum(sizes)[:-1]
    r.out.append(
        Rule(
            paths,
            True,
            lambda g, i: tuple(
                np.ascontiguousarray(a) for a in np.split(load_one(g, i), cuts, axis=-1)
            ),
            lambda a, i: save_one(np.concatenate(a, axis=-1), i),
        )
    )


def moe_rules(
    moe: tuple[str, tuple[str, str, str]],
    experts: int,
    hidden: int,
    L: str,
    keys: set[str] | None,
    block_path: str = "blocks",
) -> list[Rule]:
    """Router and experts: per-expert tensors (hub layout) or transformers 5's fused ones."""
    block, names = moe
    m = L + block
    fused = keys is not None and any(k.endswith("experts.gate_up_proj") for k in keys)

    def expert_key(i: int, e: int, n: str) -> str:
        return f"{m.format(i=i)}experts.{e}.{n}.weight"

    router = Rule(
        ((block_path, "mlp", "router"),),
        True,
        lambda g, i: (_T(g(m.format(i=i) + "gate.weight")),),
        lambda a, i: {m.format(i=i) + "gate.weight": _T(a[0])},
    )
    paths = tuple((block_path, "mlp", n) for n in ("w_gate", "w_up", "w_down"))
    if fused:

        def load(g, i):
            gate_up = g(m.format(i=i) + "experts.gate_up_proj")  # [E, 2 * hidden, dim]
            down = g(m.format(i=i) + "experts.down_proj")  # [E, dim, hidden]
            return _T(gate_up[:, :hidden]), _T(gate_up[:, hidden:]), _T(down)

    else:

        def load(g, i):
            return tuple(
                np.stack([_T(g(expert_key(i, e, n))) for e in range(experts)]) for n in names
            )

    def save(a, i):
        return {
            expert_key(i, e, n): _T(w[e])
            for n, w in zip(names, a, strict=True)
            for e in range(experts)
        }

    return [router, Rule(paths, True, load, save)]
