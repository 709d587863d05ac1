"""Tensor names and layouts: which HF tensors each axdsl parameter comes from and goes to.

A `Rule` maps some axdsl parameters to some HF tensors, both ways, for the whole model or for
block layer i (HF's layer i is index i of the stacked `blocks` arrays). HF nn.Linear weights are
[out, in]; axdsl's are [in, ...]. `rules(family, arch, keys)` lists the rules of every parameter
an Arch has; on import `keys` (the checkpoint's tensor names) picks among equivalent layouts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from axdsl.hf.arch import Arch

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
class _Rules:
    """The rules being listed, and the one-parameter rule shapes (kept only for parameters `arch` has)."""

    arch: Arch
    keys: set[str] | None
    out: list[Rule] = field(default_factory=list)
    block: str = "blocks"  # the repeated block's path: blocks, or blocks/<e> for pattern element e

    @property
    def dims(self) -> tuple[int, int, int, int]:
        v = self.arch.values
        return v["dim"], v["heads"], v["kv_heads"], v["head_dim"]

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


def rules(family: str, arch: Arch, keys: set[str] | None) -> list[Rule]:
    """The mapping of every parameter `arch` has. `keys` (import) picks among equivalent layouts."""
    if family == "deepseek_v3":
        return _deepseek_rules(arch, keys)
    if family == "bert":
        return _bert_rules(arch, keys)
    if family == "vit":
        return _vit_rules(_Rules(arch, keys))
    if family == "t5":  # an encoder-decoder: axdsl/hf/t5.py
        from axdsl.hf.t5 import mappings

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
    if arch.pattern:
        return _pattern_rules(family, arch, keys)
    return _family_rules(family, _Rules(arch, keys), keys)


def _pattern_rules(family: str, arch: Arch, keys: set[str] | None) -> list[Rule]:
    """A pattern of k blocks: layer i is element i % k, at index i // k of blocks/<e>; when k does
    not divide the layers, the scanned ones are blocks/groups/<e> and the last layers, run once
    after the scan, blocks/tail/<e> (one HF layer each, not stacked)."""
    k, scanned = arch.pattern, arch["layers"] - arch.tail
    group = "blocks/groups" if arch.tail else "blocks"
    out: list[Rule] = []
    for e in range(k):
        ids = tuple(range(e, scanned, k))
        for rule in _family_rules(family, _Rules(arch, keys, block=f"{group}/{e}"), keys):
            if rule.layered:
                out.append(Rule(rule.paths, True, rule.load, rule.save, ids))
            elif e == 0:
                out.append(rule)
    for e in range(arch.tail):
        layer = scanned + e
        for rule in _family_rules(family, _Rules(arch, keys, block=f"blocks/tail/{e}"), keys):
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


def _family_rules(family: str, r: _Rules, keys: set[str] | None) -> list[Rule]:
    head = "lm_head"
    if family == "gpt2":
        _gpt2_rules(r)
    elif family == "phi":
        _phi_rules(r)
    elif family == "mamba2":
        _mamba2_rules(r)
    elif family == "gpt_neox":
        _neox_rules(r)
        if (
            keys is None or "embed_out.weight" in keys
        ):  # the hub's name (transformers 5 renames it lm_head)
            head = "embed_out"
    else:
        _decoder_rules(r, family)
    r.rule(
        "head", False, lambda g, i: _T(g(f"{head}.weight")), lambda w, i: {f"{head}.weight": _T(w)}
    )
    r.same("head_b", f"{head}.bias", False)
    return r.out


def _gpt2_rules(r: _Rules) -> None:
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


def _decoder_rules(r: _Rules, family: str) -> None:
    """Llama and its relatives: q/k/v/o projections, optional biases and qk norms, SwiGLU or MoE."""
    dim, heads, kv, hd = r.dims
    pre = r.prefix("model.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_tokens.weight", False)
    r.same("final_norm/scale", pre + "norm.weight", False)
    r.same("blocks/attn_norm/scale", L + "input_layernorm.weight")
    if family in (
        "gemma2",
        "gemma3_text",
    ):  # sandwich norms: post_attention_layernorm follows attention
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
    if r.arch["mlp"] == "MoE":
        r.out += _moe_rules(family, r.arch["experts"], r.arch["hidden"], L, r.keys)
    else:
        r.linear_in("blocks/mlp/w_gate", L + "mlp.gate_proj.weight")
        r.linear_in("blocks/mlp/w_up", L + "mlp.up_proj.weight")
        r.linear_in("blocks/mlp/w_down", L + "mlp.down_proj.weight")


def _layer_norm(r: _Rules, ours: str, theirs: str, layered: bool = True) -> None:
    r.same(f"{ours}/scale", theirs + ".weight", layered)
    r.same(f"{ours}/shift", theirs + ".bias", layered)


def _linear(r: _Rules, ours: str, theirs: str) -> None:
    """An nn.Linear with a bias: weight [out, in] -> w [in, out], bias as it is."""
    w, b = ours.rsplit("/", 1)[0] + "/w_", ours.rsplit("/", 1)[0] + "/b_"
    name = ours.rsplit("/", 1)[1]
    r.linear_in(w + name, theirs + ".weight")
    r.same(b + name, theirs + ".bias")


def _out_proj(r: _Rules, key: str) -> None:
    """The attention output projection [dim, heads*hd] -> wo [heads, hd, dim], and its bias."""
    dim, heads, _, hd = r.dims
    r.rule(
        "blocks/attn/wo",
        True,
        lambda g, i: _T(g(key.format(i=i) + ".weight")).reshape(heads, hd, dim),
        lambda w, i: {key.format(i=i) + ".weight": _T(w.reshape(heads * hd, dim))},
    )
    r.same("blocks/attn/bo", key + ".bias")


def _phi_rules(r: _Rules) -> None:
    """Phi: Llama's q/k/v names with biases, `dense` out, fc1/fc2, one LayerNorm per block."""
    _, heads, kv, _ = r.dims
    pre = r.prefix("model.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_tokens.weight", False)
    _layer_norm(r, "final_norm", pre + "final_layernorm", False)
    _layer_norm(r, "blocks/attn_norm", L + "input_layernorm")
    a = L + "self_attn."
    for n, key, count in (("q", "q_proj", heads), ("k", "k_proj", kv), ("v", "v_proj", kv)):
        r.heads_in(f"blocks/attn/w{n}", a + key + ".weight", count)
        r.heads_bias(f"blocks/attn/b{n}", a + key + ".bias", count)
    _out_proj(r, a + "dense")
    _linear(r, "blocks/mlp/in", L + "mlp.fc1")
    _linear(r, "blocks/mlp/out", L + "mlp.fc2")


def _neox_rules(r: _Rules) -> None:
    """GPT-NeoX: one fused query_key_value per layer, its output rows grouped by head
    ([heads, (q, k, v), head_dim]), two LayerNorms, dense_h_to_4h / dense_4h_to_h."""
    dim, heads, _, hd = r.dims
    pre = r.prefix("gpt_neox.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_in.weight", False)
    _layer_norm(r, "final_norm", pre + "final_layer_norm", False)
    _layer_norm(r, "blocks/attn_norm", L + "input_layernorm")
    _layer_norm(r, "blocks/mlp_norm", L + "post_attention_layernorm")
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
    _out_proj(r, L + "attention.dense")
    _linear(r, "blocks/mlp/in", L + "mlp.dense_h_to_4h")
    _linear(r, "blocks/mlp/out", L + "mlp.dense_4h_to_h")


def _split_rule(
    r: _Rules, paths: tuple[tuple[str, ...], ...], sizes: tuple[int, ...], load_one, save_one
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


def _mamba2_rules(r: _Rules) -> None:
    """Mamba-2: transformers fuses the mixer's five input projections into in_proj (rows z, x, B,
    C, dt) and its three short convs into one depthwise conv1d ([channels, 1, taps]: x, B, C)."""
    v = r.arch.values
    inner, gs, heads = v["ssm_expand"] * v["dim"], v["ssm_groups"] * v["ssm_state"], v["heads"]
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
    _split_rule(
        r,
        tuple(mixer + (n,) for n in ("in_z", "in_x", "in_b", "in_c", "in_dt")),
        (inner, inner, gs, gs, heads),
        lambda g, i: _T(g(key.format(i=i))),
        lambda w, i: {key.format(i=i): _T(w)},
    )
    conv_w, conv_b = m + "conv1d.weight", m + "conv1d.bias"
    convs = ("conv_x", "conv_b", "conv_c")
    _split_rule(
        r,
        tuple(mixer + (n, "w") for n in convs),
        (inner, gs, gs),
        lambda g, i: _T(g(conv_w.format(i=i))[:, 0, :]),  # [channels, 1, taps] -> [taps, channels]
        lambda w, i: {conv_w.format(i=i): _T(w)[:, None, :]},
    )
    _split_rule(
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


def _moe_block(family: str, keys: set[str] | None) -> tuple[str, tuple[str, str, str]]:
    """The MoE module's name and its experts' (gate, up, down) tensor names."""
    if family != "mixtral":
        return "mlp.", ("gate_proj", "up_proj", "down_proj")
    if keys is not None and not any(
        ".block_sparse_moe." in k or k.startswith("block_sparse_moe.") for k in keys
    ):
        return "mlp.", ("w1", "w3", "w2")  # renamed by transformers 5
    return "block_sparse_moe.", ("w1", "w3", "w2")


def _moe_rules(
    family: str,
    experts: int,
    hidden: int,
    L: str,
    keys: set[str] | None,
    block_path: str = "blocks",
) -> list[Rule]:
    """Router and experts: per-expert tensors (hub layout) or transformers 5's fused ones."""
    block, names = _moe_block(family, keys)
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
        return {expert_key(i, e, n): _T(w[e]) for n, w in zip(names, a) for e in range(experts)}

    return [router, Rule(paths, True, load, save)]


def _deepseek_rules(arch: Arch, keys: set[str] | None) -> list[Rule]:
    """DeepSeek-V3: HF layers 0 .. k-1 are the stacked `dense_blocks`, layers k .. the `blocks`."""
    r = _Rules(arch, keys)
    pre = r.prefix("model.")
    r.same("embed/table", pre + "embed_tokens.weight", False)
    r.same("final_norm/scale", pre + "norm.weight", False)
    r.rule(
        "head", False, lambda g, i: _T(g("lm_head.weight")), lambda w, i: {"lm_head.weight": _T(w)}
    )
    dense = arch["dense_layers"] or 0
    out = list(r.out)
    for block, ids in (
        ("dense_blocks", range(dense)),
        ("blocks", range(dense, dense + arch["layers"])),
    ):
        br = _Rules(arch, keys, block=block)
        moe = block == "blocks" and arch["mlp"] == "DeepSeekMoE"
        _latent_block_rules(br, pre + "layers.{i}.", moe)
        if moe:
            br.out += _moe_rules(
                "deepseek_v3", arch["experts"], arch["hidden"], pre + "layers.{i}.", keys, block
            )
        out += [Rule(x.paths, True, x.load, x.save, tuple(ids)) for x in br.out]
    return out


def _latent_block_rules(r: _Rules, L: str, moe: bool) -> None:
    """One DeepSeek layer's norms, latent attention, and SwiGLU (dense) or router bias and shared experts."""
    v = r.arch.values
    dim, heads = v["dim"], v["heads"]
    qk, q_rank, kv_rank = v["nope_dim"] + v["rope_dim"], v["q_rank"], v["kv_rank"]
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
    heads_in("blocks/attn/wkv_b", a + "kv_b_proj.weight", kv_rank, v["nope_dim"] + v["v_head_dim"])
    vd = v["v_head_dim"]
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


def _bert_rules(arch: Arch, keys: set[str] | None) -> list[Rule]:
    """Every BertMLM parameter <-> BertForMaskedLM's tensors (axdsl/hf/bert.py lists them)."""
    r = _Rules(arch, keys)
    _, heads, _, _ = r.dims
    pre = r.prefix("bert.")
    e = pre + "embeddings."
    r.same("embed/table", e + "word_embeddings.weight", False)
    r.same("pos_embed/table", e + "position_embeddings.weight", False)
    r.same("type_embed/table", e + "token_type_embeddings.weight", False)
    _layer_norm(r, "embed_norm", e + "LayerNorm", False)
    L = pre + "encoder.layer.{i}."
    for n, key in (("q", "query"), ("k", "key"), ("v", "value")):
        r.heads_in(f"blocks/attn/w{n}", L + f"attention.self.{key}.weight", heads)
        r.heads_bias(f"blocks/attn/b{n}", L + f"attention.self.{key}.bias", heads)
    _out_proj(r, L + "attention.output.dense")
    _layer_norm(r, "blocks/attn_norm", L + "attention.output.LayerNorm")
    _linear(r, "blocks/mlp/in", L + "intermediate.dense")
    _linear(r, "blocks/mlp/out", L + "output.dense")
    _layer_norm(r, "blocks/mlp_norm", L + "output.LayerNorm")
    t = "cls.predictions.transform."
    r.rule(
        "head_dense/w",
        False,
        lambda g, i: _T(g(t + "dense.weight")),
        lambda w, i: {t + "dense.weight": _T(w)},
    )
    r.same("head_dense/b", t + "dense.bias", False)
    _layer_norm(r, "head_norm", t + "LayerNorm", False)
    bias = "cls.predictions.bias"
    if keys is not None and bias not in keys and "cls.predictions.decoder.bias" in keys:
        bias = "cls.predictions.decoder.bias"
    r.same("head_b", bias, False)
    return r.out


def _vit_rules(r: _Rules) -> list[Rule]:
    """Every VisionTransformer parameter <-> ViTForImageClassification's tensors (axdsl/hf/vit.py
    lists them): the hub's names, or transformers 5's in-memory ones (vit.layers.i.attention.q_proj).
    """
    dim, heads, _, _ = r.dims
    v = r.arch.values
    p, ch = v["patch"], v["channels"]
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
    # Conv2d [dim, C, p, p] -> [p, p, C, dim] -> [p*p*C, dim]: rows in the (row, column, channel) order
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
    _layer_norm(r, "blocks/attn_norm", L + "layernorm_before")
    _layer_norm(r, "blocks/mlp_norm", L + "layernorm_after")
    for n, key in (("q", q), ("k", k), ("v", val)):
        r.heads_in(f"blocks/attn/w{n}", key + ".weight", heads)
        r.heads_bias(f"blocks/attn/b{n}", key + ".bias", heads)
    _out_proj(r, o)
    _linear(r, "blocks/mlp/in", fc1)
    _linear(r, "blocks/mlp/out", fc2)
    _layer_norm(r, "final_norm", "vit.layernorm", False)
    r.rule(
        "head",
        False,
        lambda g, i: _T(g("classifier.weight")),
        lambda w, i: {"classifier.weight": _T(w)},
    )
    r.same("head_b", "classifier.bias", False)
    return r.out
