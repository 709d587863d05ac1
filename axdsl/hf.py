"""Hugging Face interop: `axdsl import-hf` and `axdsl export-hf`.

    axdsl import-hf SPEC HF_DIR [--model NAME] [--out DIR]    safetensors -> orbax params checkpoint
    axdsl export-hf SPEC CKPT_DIR OUT_DIR [--model NAME]      orbax checkpoint -> config.json + model.safetensors

Families (detected from config.json's `model_type`, or chosen from the spec's structure on export):

| family    | transformers class   | axdsl structure (std/transformer.axl)                              |
|-----------|----------------------|--------------------------------------------------------------------|
| gpt2      | GPT2LMHeadModel      | learned positions, LayerNorm, biased attention, MLP(act = "gelu")  |
| llama     | LlamaForCausalLM     | RoPE, RMSNorm, SwiGLU                                              |
| mistral   | MistralForCausalLM   | llama with Attention(window = W)                                   |
| mixtral   | MixtralForCausalLM   | llama with MoE (normalize = true), optional window                 |
| qwen3     | Qwen3ForCausalLM     | llama with Attention(qk_norm = true)                               |
| qwen3_moe | Qwen3MoeForCausalLM  | qk_norm and MoE (normalize = norm_topk_prob)                       |

**The checkpoint** that `import-hf` writes (default `runs/<spec-stem>-hf/params`) is a params-only
orbax checkpoint, written with `ocp.StandardCheckpointer`, whose tree is exactly the tree of the
generated `init_params(cfg, key)` (nested dicts; the repeated blocks' parameters stacked with a
leading `layers` dim), each array in the model's `param_dtype`. Restore it with

    abstract = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    params = ocp.StandardCheckpointer().restore(path, abstract)

`export-hf` reads such a params checkpoint, or a `train.py` run: the run directory, its
`checkpoints/` directory (newest step) or one step directory, whose orbax Composite holds a
"state" item with `state["params"]` (only the params are read).

**The layout mapping** (HF nn.Linear weights are [out, in]; axdsl's are [in, ...]):

    embed_tokens / wte                 [vocab, dim]          embed/table
    lm_head                            [vocab, dim]          head [dim, vocab] (absent when tied)
    q_proj                             [heads*hd, dim]       attn/wq [dim, heads, hd]
    k_proj, v_proj                     [kv*hd, dim]          attn/wk, wv [dim, kv_heads, hd]
    o_proj                             [dim, heads*hd]       attn/wo [heads, hd, dim]
    q_norm, k_norm                     [hd]                  attn/q_norm/scale, k_norm/scale
    gate_proj, up_proj / down_proj     [ffn, dim] / [dim, ffn]  mlp/w_gate, w_up [dim, ffn] / w_down [ffn, dim]
    router gate                        [experts, dim]        mlp/router [dim, experts]
    experts.E.w1 (gate_proj), w3 (up_proj)  [ffn, dim]       mlp/w_gate, w_up [experts, dim, ffn]
    experts.E.w2 (down_proj)           [dim, ffn]            mlp/w_down [experts, ffn, dim]
    GPT-2 c_attn (Conv1D [in, out])    [dim, 3*dim]          split into wq, wk, wv; c_attn.bias into bq, bk, bv
    GPT-2 c_proj, c_fc, mlp.c_proj     [in, out]             wo (reshaped), w_in, w_out as they are
    ln_1/ln_2/ln_f weight, bias        [dim]                 attn_norm, mlp_norm, final_norm scale, shift

Layer i of HF is index i of the stacked `blocks` arrays. Rotary embeddings need no permutation:
HF checkpoints use the half-split (rotate_half) layout, as axdsl's `rope` does. Mixtral and
Qwen3-MoE experts are read from per-expert tensors (the hub layout, also what transformers 5 writes)
or from transformers 5's fused `experts.gate_up_proj` / `experts.down_proj`; export writes the
per-expert layout.

Before any tensor is read, config.json is checked against the spec's model (dims, heads, head_dim,
norm kind and eps, rope theta, window, tied head, feed-forward kind and width, experts, top-k,
...) and every difference is reported. Every axdsl parameter must be filled and every HF tensor
used (a tied `lm_head` equal to the embedding and HF's non-parameter buffers excepted). Needs the
`safetensors` package (numpy only; torch is not needed).
"""

from __future__ import annotations

import json
import math
import re
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from axdsl.errors import CompileError

FAMILIES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_ARCH_TO_FAMILY = {v: k for k, v in FAMILIES.items()}

# GELU variants that equal jax.nn.gelu's default (the tanh approximation).
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class HFError(Exception):
    """A user-facing problem: a message and the details (one per line)."""

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []

    def render(self) -> str:
        return "\n".join([f"axdsl: error: {self.message}"] + [f"  - {d}" for d in self.details])


# ----------------------------------------------------------------------------- the spec's model


@dataclass
class Arch:
    """What a spec's model is, read from its IR: the facts a Hugging Face config states."""

    name: str
    values: dict[str, Any]  # field -> value (see _FIELDS)
    params: dict[tuple[str, ...], tuple[tuple[int, ...], str]]  # path -> (shape, dtype name)
    problems: list[str] = field(default_factory=list)  # structure no HF family has

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)


# field -> how the spec states it (for messages)
_FIELDS = {
    "vocab": "vocab", "dim": "dim", "layers": "layers", "heads": "heads", "kv_heads": "kv_heads",
    "head_dim": "attention head_dim", "max_seq": "max_seq", "positions": "positions",
    "tied": "tied", "norm": "norm layer", "norm_eps": "norm eps", "norm_bias": "LayerNorm bias",
    "causal": "attention causal", "rope": "attention rope", "rope_theta": "rope_theta",
    "window": "attention window", "attn_bias": "attention bias", "qk_norm": "attention qk_norm",
    "qk_norm_eps": "q_norm/k_norm eps", "mlp": "feed-forward layer", "hidden": "feed-forward hidden",
    "act": "MLP act", "mlp_bias": "MLP bias", "experts": "MoE experts", "top_k": "MoE top_k",
    "normalize": "MoE normalize", "shared": "MoE shared experts",
}


def _hv(inst, name: str, default: Any = None) -> Any:
    h = inst.hparam(name) if inst is not None else None
    return default if h is None else h.value.value


def _param_tree(root) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """Every parameter as path -> (full shape, dtype), in the nesting of `init_params`."""
    out = {}
    for inst in root.walk():
        base = tuple(p for p in inst.path.split("/") if p)
        for p in inst.params:
            out[base + (p.name,)] = (tuple(d.size for d in p.full_dims), p.dtype.jnp)
    return out


def arch_of(model) -> Arch:
    """The Arch of one IR model (an `ir.Model` after stack_repeats)."""
    root = model.root
    arch = Arch(model.name, {}, _param_tree(root))
    v, problems = arch.values, arch.problems
    if root.layer != "DecoderLM":
        problems.append(f"the model is a {root.layer}; Hugging Face interop needs std's DecoderLM")
        return arch
    for k in ("vocab", "dim", "layers", "heads", "kv_heads", "max_seq", "positions", "tied"):
        v[k] = _hv(root, k)
    blocks = root.child("blocks")
    if blocks is None or blocks.layer != "Block":
        problems.append("the repeated block is not std's Block")
        return arch
    attn, mlp = blocks.child("attn"), blocks.child("mlp")
    norms = [blocks.child("attn_norm"), blocks.child("mlp_norm"), root.child("final_norm")]
    kinds = {(n.layer, _hv(n, "eps"), _hv(n, "bias")) for n in norms}
    if len(kinds) != 1:
        problems.append("attn_norm, mlp_norm and final_norm differ: " + ", ".join(
            f"{n.path} = {n.layer}(eps = {_hv(n, 'eps')})" for n in norms))
    norm = norms[0]
    v["norm"], v["norm_eps"] = norm.layer, _hv(norm, "eps")
    if norm.layer == "LayerNorm":
        v["norm_bias"] = _hv(norm, "bias")
    elif norm.layer != "RMSNorm":
        problems.append(f"norm is {norm.layer}; only RMSNorm and LayerNorm have HF counterparts")
    if attn is None or attn.layer != "Attention":
        problems.append("the block's attention is not std's Attention")
    else:
        v["head_dim"] = _hv(attn, "head_dim")
        v["kv_heads"] = _hv(attn, "kv_heads")
        v["causal"] = _hv(attn, "causal")
        v["rope"] = _hv(attn, "rope")
        if v["rope"]:
            v["rope_theta"] = float(_hv(attn, "rope_theta"))
        v["window"] = _hv(attn, "window")
        v["attn_bias"] = _hv(attn, "bias")
        v["qk_norm"] = _hv(attn, "qk_norm")
        if v["qk_norm"]:
            eps = {_hv(attn.child(c), "eps") for c in ("q_norm", "k_norm")}
            v["qk_norm_eps"] = eps.pop() if len(eps) == 1 else None
    v["mlp"] = mlp.layer if mlp is not None else None
    if v["mlp"] == "SwiGLU":
        v["hidden"] = _hv(mlp, "hidden")
    elif v["mlp"] == "MLP":
        v["hidden"], v["act"], v["mlp_bias"] = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    elif v["mlp"] == "MoE":
        for k in ("hidden", "experts", "top_k", "normalize", "shared"):
            v[k] = _hv(mlp, k)
        v["capacity_factor"] = float(_hv(mlp, "capacity_factor"))
    else:
        problems.append(f"the feed-forward layer is {v['mlp']}; HF families have SwiGLU, MLP or MoE")
    return arch


def _load_spec(spec: Path):
    from axdsl.pipeline import compile_spec

    module = compile_spec(Path(spec), "cpu", after="stack_repeats")
    return [arch_of(m) for m in module.models]


def _pick(archs: list[Arch], name: str | None, spec: Path) -> Arch:
    names = [a.name for a in archs]
    for a in archs:
        if a.name == name:
            return a
    raise HFError(f"{spec} has no model `{name}`", [f"its models: {', '.join(names)}"])


# ----------------------------------------------------------------------------- HF config <-> Arch


def family_of_config(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if mt in FAMILIES:
        return mt
    for a in cfg.get("architectures") or []:
        if a in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[a]
    raise HFError(f"unsupported model_type {mt!r} (architectures {cfg.get('architectures')})",
                  [f"supported: {', '.join(f'{k} ({c})' for k, c in FAMILIES.items())}"])


def _rope(cfg: dict, default_theta: float) -> tuple[float, str]:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    kind = rp.get("rope_type", rp.get("type", "default"))
    return float(default_theta if theta is None else theta), kind


def hf_values(family: str, cfg: dict) -> tuple[dict, dict, list[str]]:
    """config.json -> (field values as an Arch states them, field -> "key=value", unsupported).

    Missing keys take the defaults of transformers' config classes.
    """
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    unsupported: list[str] = []

    def put(fld: str, value: Any, key: str, raw: Any = None) -> None:
        vals[fld] = value
        src[fld] = f"{key}={json.dumps(value if raw is None else raw)}"

    def get(key: str, default: Any = None) -> Any:
        return cfg[key] if cfg.get(key) is not None else default

    if family == "gpt2":
        dim, heads = get("n_embd", 768), get("n_head", 12)
        put("vocab", get("vocab_size", 50257), "vocab_size")
        put("dim", dim, "n_embd")
        put("layers", get("n_layer", 12), "n_layer")
        put("heads", heads, "n_head")
        put("kv_heads", heads, "n_head")
        put("head_dim", dim // heads, "n_embd/n_head")
        put("max_seq", get("n_positions", 1024), "n_positions")
        put("positions", "learned", "model_type", "gpt2")
        put("tied", bool(cfg.get("tie_word_embeddings", True)), "tie_word_embeddings")
        put("norm", "LayerNorm", "model_type", "gpt2")
        put("norm_eps", float(get("layer_norm_epsilon", 1e-5)), "layer_norm_epsilon")
        put("norm_bias", True, "model_type", "gpt2")
        put("causal", True, "model_type", "gpt2")
        put("rope", False, "model_type", "gpt2")
        put("window", 0, "model_type", "gpt2")
        put("attn_bias", True, "model_type", "gpt2")
        put("qk_norm", False, "model_type", "gpt2")
        put("mlp", "MLP", "model_type", "gpt2")
        put("hidden", get("n_inner", 4 * dim), "n_inner")
        act = get("activation_function", "gelu_new")
        acts = {**{a: "gelu" for a in _TANH_GELU}, "relu": "relu", "silu": "silu", "swish": "silu"}
        put("act", acts.get(act, act), "activation_function", act)
        put("mlp_bias", True, "model_type", "gpt2")
        if not cfg.get("scale_attn_weights", True):
            unsupported.append("scale_attn_weights=false (axdsl scales by 1/sqrt(head_dim))")
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            unsupported.append("scale_attn_by_inverse_layer_idx=true")
        if cfg.get("add_cross_attention", False):
            unsupported.append("add_cross_attention=true")
        return vals, src, unsupported

    dim, heads = get("hidden_size", 4096), get("num_attention_heads", 32)
    defaults = {"llama": (1e-6, 10000.0), "mistral": (1e-6, 10000.0), "mixtral": (1e-5, 1e6),
                "qwen3": (1e-6, 10000.0), "qwen3_moe": (1e-6, 10000.0)}[family]
    put("vocab", get("vocab_size", 32000), "vocab_size")
    put("dim", dim, "hidden_size")
    put("layers", get("num_hidden_layers", 32), "num_hidden_layers")
    put("heads", heads, "num_attention_heads")
    put("kv_heads", get("num_key_value_heads", heads), "num_key_value_heads")
    hd_default = 128 if family == "qwen3" and "head_dim" not in cfg else dim // heads
    put("head_dim", get("head_dim", hd_default), "head_dim")
    put("positions", "rope", "model_type", family)
    put("tied", bool(cfg.get("tie_word_embeddings", False)), "tie_word_embeddings")
    put("norm", "RMSNorm", "model_type", family)
    eps = float(get("rms_norm_eps", defaults[0]))
    put("norm_eps", eps, "rms_norm_eps")
    put("causal", True, "model_type", family)
    put("rope", True, "model_type", family)
    theta, kind = _rope(cfg, defaults[1])
    put("rope_theta", theta, "rope_theta")
    if kind != "default":
        unsupported.append(f"rope_type={kind!r} (axdsl's rope has no scaling)")
    if family in ("mistral", "mixtral"):
        window = get("sliding_window", 4096 if family == "mistral" and "sliding_window" not in cfg else 0)
        put("window", window, "sliding_window", cfg.get("sliding_window"))
    elif cfg.get("use_sliding_window", False):
        unsupported.append("use_sliding_window=true (per-layer windows are not mapped)")
        put("window", 0, "use_sliding_window", True)
    else:
        put("window", 0, "use_sliding_window", False)
    put("attn_bias", bool(cfg.get("attention_bias", False)), "attention_bias")
    put("qk_norm", family.startswith("qwen3"), "model_type", family)
    if family.startswith("qwen3"):
        put("qk_norm_eps", eps, "rms_norm_eps")
    if get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={cfg['hidden_act']!r} (SwiGLU and MoE experts use silu)")
    if cfg.get("mlp_bias", False):
        unsupported.append("mlp_bias=true (SwiGLU has no biases)")
    if family in ("mixtral", "qwen3_moe"):
        put("mlp", "MoE", "model_type", family)
        experts_key = "num_experts" if "num_experts" in cfg else "num_local_experts"
        put("experts", get(experts_key, 8 if family == "mixtral" else 128), experts_key)
        put("top_k", get("num_experts_per_tok", 2 if family == "mixtral" else 8), "num_experts_per_tok")
        put("shared", 0, "model_type", family)
        if family == "mixtral":
            put("hidden", get("intermediate_size", 14336), "intermediate_size")
            put("normalize", True, "model_type", "mixtral")
        else:
            put("hidden", get("moe_intermediate_size", 768), "moe_intermediate_size")
            put("normalize", bool(cfg.get("norm_topk_prob", False)), "norm_topk_prob")
            if cfg.get("mlp_only_layers"):
                unsupported.append(f"mlp_only_layers={cfg['mlp_only_layers']} (every axdsl block is MoE)")
            if get("decoder_sparse_step", 1) != 1:
                unsupported.append(f"decoder_sparse_step={cfg['decoder_sparse_step']} (every axdsl block is MoE)")
    else:
        put("mlp", "SwiGLU", "model_type", family)
        put("hidden", get("intermediate_size", 11008), "intermediate_size")
    return vals, src, unsupported


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def mismatches(arch: Arch, family: str, cfg: dict) -> list[str]:
    """Every way config.json and the spec's model disagree (empty: the weights map)."""
    vals, src, out = hf_values(family, cfg)
    out = [f"config.json: {u} is not supported" for u in out] + list(arch.problems)
    skip = set()
    if arch["mlp"] != vals.get("mlp"):
        skip |= {"hidden", "act", "mlp_bias", "experts", "top_k", "normalize", "shared"}
    if arch["norm"] != vals.get("norm"):
        skip.add("norm_bias")
    if not (arch["rope"] and vals.get("rope")):
        skip.add("rope_theta")
    if not (arch["qk_norm"] and vals.get("qk_norm")):
        skip.add("qk_norm_eps")
    if arch["positions"] != "learned" or vals.get("positions") != "learned":
        skip.add("max_seq")  # only the learned position table depends on it
    for fld, value in vals.items():
        if fld in skip or _same(arch[fld], value):
            continue
        out.append(f"config.json has {src[fld]}, the spec has {_FIELDS[fld]} = {json.dumps(arch[fld])}")
    return out


def hf_config(arch: Arch, family: str) -> dict:
    """The config.json of `arch` as a `family` model (export)."""
    v = arch.values
    dtype = {a[1] for a in arch.params.values()}
    dtype = dtype.pop() if len(dtype) == 1 else "float32"
    if family == "gpt2":
        acts = {"gelu": "gelu_new", "relu": "relu", "silu": "silu"}
        return {
            "architectures": [FAMILIES[family]], "model_type": "gpt2", "vocab_size": v["vocab"],
            "n_embd": v["dim"], "n_layer": v["layers"], "n_head": v["heads"], "n_inner": v["hidden"],
            "n_positions": v["max_seq"], "n_ctx": v["max_seq"],
            "activation_function": acts.get(v["act"], v["act"]), "layer_norm_epsilon": v["norm_eps"],
            "tie_word_embeddings": v["tied"], "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
            "use_cache": True, "dtype": dtype,
        }
    theta = v["rope_theta"] if v["rope_theta"] is not None else 10000.0
    out = {
        "architectures": [FAMILIES[family]], "model_type": family, "vocab_size": v["vocab"],
        "hidden_size": v["dim"], "intermediate_size": v["hidden"], "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"], "num_key_value_heads": v["kv_heads"],
        "head_dim": v["head_dim"], "hidden_act": "silu", "max_position_embeddings": v["max_seq"],
        "rms_norm_eps": v["norm_eps"], "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "tie_word_embeddings": v["tied"], "attention_dropout": 0.0, "initializer_range": 0.02,
        "use_cache": True, "dtype": dtype,
    }
    if family in ("llama", "qwen3", "qwen3_moe"):
        out["attention_bias"] = v["attn_bias"]
    if family == "llama":
        out["mlp_bias"] = False
    if family in ("mistral", "mixtral"):
        out["sliding_window"] = v["window"] or None
    if family in ("qwen3", "qwen3_moe"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=v["layers"])
    if family == "mixtral":
        out.update(num_local_experts=v["experts"], num_experts_per_tok=v["top_k"],
                   router_jitter_noise=0.0, output_router_logits=False)
    if family == "qwen3_moe":
        out.update(num_experts=v["experts"], num_experts_per_tok=v["top_k"],
                   moe_intermediate_size=v["hidden"], norm_topk_prob=v["normalize"],
                   decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False)
    return out


def family_of_arch(arch: Arch) -> str:
    """The HF family a spec's model exports to, from its structure."""
    if arch["positions"] == "learned" or arch["norm"] == "LayerNorm":
        return "gpt2"
    if arch["mlp"] == "MoE":
        return "qwen3_moe" if arch["qk_norm"] else "mixtral"
    if arch["qk_norm"]:
        return "qwen3"
    return "mistral" if arch["window"] else "llama"


# ----------------------------------------------------------------------------- tensor mapping


@dataclass
class Rule:
    """Some axdsl parameters <-> some HF tensors, for the whole model or for block layer i."""

    paths: tuple[tuple[str, ...], ...]
    layered: bool
    load: Callable[..., tuple[np.ndarray, ...]]  # (get, i) -> one array per path (layer i's slice)
    save: Callable[..., dict[str, np.ndarray]]  # (arrays, i) -> HF tensors


def _T(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _rules(family: str, arch: Arch, keys: set[str] | None) -> list[Rule]:
    """The mapping of every parameter `arch` has. `keys` (import) picks among equivalent layouts."""
    v = arch.values
    dim, heads, kv, hd = v["dim"], v["heads"], v["kv_heads"], v["head_dim"]
    have = set(arch.params)
    rules: list[Rule] = []

    def rule(path: str, layered: bool, load, save) -> None:
        p = tuple(path.split("/"))
        if p in have:
            rules.append(Rule((p,), layered, lambda g, i: (load(g, i),), lambda a, i: save(a[0], i)))

    def same(path: str, key: str, layered: bool = True) -> None:  # stored as it is
        rule(path, layered, lambda g, i: g(key.format(i=i)), lambda a, i: {key.format(i=i): a})

    def linear_in(path: str, key: str) -> None:  # nn.Linear [out, in] -> [in, out]
        rule(path, True, lambda g, i: _T(g(key.format(i=i))), lambda a, i: {key.format(i=i): _T(a)})

    def heads_in(path: str, key: str, n: int) -> None:  # [n*hd, dim] -> [dim, n, hd]
        rule(path, True, lambda g, i: _T(g(key.format(i=i))).reshape(dim, n, hd),
             lambda a, i: {key.format(i=i): _T(a.reshape(dim, n * hd))})

    def heads_bias(path: str, key: str, n: int) -> None:  # [n*hd] -> [n, hd]
        rule(path, True, lambda g, i: g(key.format(i=i)).reshape(n, hd),
             lambda a, i: {key.format(i=i): a.reshape(n * hd)})

    if family == "gpt2":
        pre = "transformer."
        if keys is not None and not any(k.startswith(pre) for k in keys):
            pre = ""  # the hub's gpt2 checkpoints name GPT2Model's tensors without a prefix
        h = pre + "h.{i}."
        same("embed/table", pre + "wte.weight", False)
        same("pos_embed", pre + "wpe.weight", False)
        for ours, theirs in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            same(f"blocks/{ours}/scale", h + theirs + ".weight")
            same(f"blocks/{ours}/shift", h + theirs + ".bias")
        same("final_norm/scale", pre + "ln_f.weight", False)
        same("final_norm/shift", pre + "ln_f.bias", False)
        qkv = tuple(("blocks", "attn", n) for n in ("wq", "wk", "wv"))
        rules.append(Rule(
            qkv, True,
            lambda g, i: tuple(w.reshape(dim, heads, hd)
                               for w in np.split(g(h.format(i=i) + "attn.c_attn.weight"), 3, axis=1)),
            lambda a, i: {h.format(i=i) + "attn.c_attn.weight": np.ascontiguousarray(
                np.concatenate([w.reshape(dim, heads * hd) for w in a], axis=1))}))
        bqkv = tuple(("blocks", "attn", n) for n in ("bq", "bk", "bv"))
        rules.append(Rule(
            bqkv, True,
            lambda g, i: tuple(b.reshape(heads, hd)
                               for b in np.split(g(h.format(i=i) + "attn.c_attn.bias"), 3)),
            lambda a, i: {h.format(i=i) + "attn.c_attn.bias": np.concatenate([b.reshape(-1) for b in a])}))
        rule("blocks/attn/wo", True, lambda g, i: g(h.format(i=i) + "attn.c_proj.weight").reshape(heads, hd, dim),
             lambda a, i: {h.format(i=i) + "attn.c_proj.weight": a.reshape(heads * hd, dim)})
        same("blocks/attn/bo", h + "attn.c_proj.bias")
        same("blocks/mlp/w_in", h + "mlp.c_fc.weight")
        same("blocks/mlp/b_in", h + "mlp.c_fc.bias")
        same("blocks/mlp/w_out", h + "mlp.c_proj.weight")
        same("blocks/mlp/b_out", h + "mlp.c_proj.bias")
        linear_head = "lm_head.weight"
    else:
        pre = "model."
        if keys is not None and not any(k.startswith(pre) for k in keys):
            pre = ""
        L = pre + "layers.{i}."
        same("embed/table", pre + "embed_tokens.weight", False)
        same("final_norm/scale", pre + "norm.weight", False)
        same("blocks/attn_norm/scale", L + "input_layernorm.weight")
        same("blocks/mlp_norm/scale", L + "post_attention_layernorm.weight")
        a = L + "self_attn."
        heads_in("blocks/attn/wq", a + "q_proj.weight", heads)
        heads_in("blocks/attn/wk", a + "k_proj.weight", kv)
        heads_in("blocks/attn/wv", a + "v_proj.weight", kv)
        rule("blocks/attn/wo", True, lambda g, i: _T(g(a.format(i=i) + "o_proj.weight")).reshape(heads, hd, dim),
             lambda w, i: {a.format(i=i) + "o_proj.weight": _T(w.reshape(heads * hd, dim))})
        heads_bias("blocks/attn/bq", a + "q_proj.bias", heads)
        heads_bias("blocks/attn/bk", a + "k_proj.bias", kv)
        heads_bias("blocks/attn/bv", a + "v_proj.bias", kv)
        same("blocks/attn/bo", a + "o_proj.bias")
        same("blocks/attn/q_norm/scale", a + "q_norm.weight")
        same("blocks/attn/k_norm/scale", a + "k_norm.weight")
        if v["mlp"] == "MoE":
            _moe_rules(rules, family, v["experts"], v["hidden"], L, keys, have)
        else:
            linear_in("blocks/mlp/w_gate", L + "mlp.gate_proj.weight")
            linear_in("blocks/mlp/w_up", L + "mlp.up_proj.weight")
            linear_in("blocks/mlp/w_down", L + "mlp.down_proj.weight")
        linear_head = "lm_head.weight"
    rule("head", False, lambda g, i: _T(g(linear_head)), lambda w, i: {linear_head: _T(w)})
    return rules


def _moe_rules(rules: list[Rule], family: str, experts: int, hidden: int, L: str,
               keys: set[str] | None, have: set) -> None:
    """Router and experts: per-expert tensors (hub layout) or transformers 5's fused ones."""
    if family == "mixtral":
        block, names = "block_sparse_moe.", ("w1", "w3", "w2")  # gate, up, down
        if keys is not None and not any(".block_sparse_moe." in k or k.startswith("block_sparse_moe.")
                                        for k in keys):
            block = "mlp."  # renamed by transformers 5
    else:
        block, names = "mlp.", ("gate_proj", "up_proj", "down_proj")
    m = L + block
    fused = keys is not None and any(k.endswith("experts.gate_up_proj") for k in keys)

    def expert_key(i: int, e: int, n: str) -> str:
        return f"{m.format(i=i)}experts.{e}.{n}.weight"

    rules.append(Rule((("blocks", "mlp", "router"),), True,
                      lambda g, i: (_T(g(m.format(i=i) + "gate.weight")),),
                      lambda a, i: {m.format(i=i) + "gate.weight": _T(a[0])}))
    paths = tuple(("blocks", "mlp", n) for n in ("w_gate", "w_up", "w_down"))
    if fused:
        def load(g, i):
            gate_up = g(m.format(i=i) + "experts.gate_up_proj")  # [E, 2 * hidden, dim]
            down = g(m.format(i=i) + "experts.down_proj")  # [E, dim, hidden]
            return _T(gate_up[:, :hidden]), _T(gate_up[:, hidden:]), _T(down)
    else:
        def load(g, i):
            return tuple(np.stack([_T(g(expert_key(i, e, n))) for e in range(experts)]) for n in names)

    def save(a, i):
        return {expert_key(i, e, n): _T(w[e]) for n, w in zip(names, a) for e in range(experts)}

    rules.append(Rule(paths, True, load, save))


# tensors HF checkpoints may hold that are not parameters
_BUFFERS = re.compile(r"(^|\.)attn\.(masked_)?bias$|rotary_emb\.inv_freq$")


# ----------------------------------------------------------------------------- safetensors


def _weight_files(hf_dir: Path) -> list[Path]:
    """The files transformers would load: the index's shards, model.safetensors, else every one.

    (Some hub repos also hold a differently named copy, e.g. Mistral's consolidated.safetensors.)
    """
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise HFError(f"cannot read {index}: {exc}") from None
        missing = [s for s in shards if not (hf_dir / s).exists()]
        if missing:
            raise HFError(f"{index} names shards that are not there", missing)
        return [hf_dir / s for s in shards]
    if (hf_dir / "model.safetensors").exists():
        return [hf_dir / "model.safetensors"]
    return sorted(hf_dir.glob("*.safetensors"))


class _Reader:
    """Every tensor of the *.safetensors files in a directory, read lazily; records what was used."""

    def __init__(self, hf_dir: Path, stack: ExitStack):
        from safetensors import safe_open

        files = _weight_files(hf_dir)
        if not files:
            raise HFError(f"no *.safetensors file in {hf_dir}",
                          ["save the model with save_pretrained(..., safe_serialization=True)"])
        self.where: dict[str, Any] = {}
        dupes = []
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="numpy"))
            for k in handle.keys():
                if k in self.where:
                    dupes.append(f"{k} is in two files")
                self.where[k] = handle
        if dupes:
            raise HFError(f"duplicate tensors in {hf_dir}", dupes)
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.cache: dict[str, np.ndarray] = {}

    def get(self, key: str) -> np.ndarray:
        if key not in self.where:
            self.missing.append(key)
            raise KeyError(key)
        self.used.add(key)
        if key not in self.cache:
            self.cache[key] = self.where[key].get_tensor(key)
        return self.cache[key]


def _need_safetensors() -> None:
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise HFError("Hugging Face interop needs the safetensors package",
                      ["pip install safetensors"]) from None


# ----------------------------------------------------------------------------- import


def import_hf(spec: Path, hf_dir: Path, model: str | None = None, out: Path | None = None) -> int:
    """`axdsl import-hf`: HF safetensors -> an orbax params checkpoint. Returns the exit code."""
    try:
        _import_hf(Path(spec), Path(hf_dir), model, None if out is None else Path(out))
    except CompileError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except HFError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    return 0


def _read_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFError(f"{path} not found: is {hf_dir} a Hugging Face model directory?") from None
    except (OSError, ValueError) as exc:
        raise HFError(f"cannot read {path}: {exc}") from None


def convert_from_hf(arch: Arch, family: str, hf_dir: Path) -> dict[tuple[str, ...], np.ndarray]:
    """Read and map every tensor: path -> array in the parameter's dtype. Raises HFError."""
    import jax.numpy as jnp

    with ExitStack() as stack:
        reader = _Reader(hf_dir, stack)
        keys = set(reader.where)
        rules = _rules(family, arch, keys)
        out: dict[tuple[str, ...], np.ndarray] = {}
        problems: list[str] = []
        layers = arch["layers"]
        for r in rules:
            names = ", ".join("/".join(p) for p in r.paths)
            try:
                if r.layered:
                    per_layer = [r.load(reader.get, i) for i in range(layers)]
                    arrays = tuple(np.stack([pl[j] for pl in per_layer]) for j in range(len(r.paths)))
                else:
                    arrays = r.load(reader.get, 0)
            except KeyError as exc:
                problems.append(f"missing tensor {exc.args[0]} (for {names})")
                continue
            except ValueError as exc:
                problems.append(f"cannot map to {names}: {exc}")
                continue
            for p, a in zip(r.paths, arrays):
                shape, dtype = arch.params[p]
                if tuple(a.shape) != shape:
                    problems.append(f"{'/'.join(p)}: the HF tensors give shape {tuple(a.shape)}, "
                                    f"the spec expects {shape}")
                    continue
                out[p] = np.asarray(a).astype(jnp.dtype(dtype))
            reader.cache.clear()
        if arch["tied"] and "lm_head.weight" in keys:  # a tied head saved anyway: it must be the table
            head = reader.get("lm_head.weight")
            table = out.get(("embed", "table"))
            if table is not None and not np.array_equal(head.astype(table.dtype), table):
                problems.append("lm_head.weight differs from the token embedding, but the spec ties them")
        for p in arch.params:
            if p not in out and not any(p in r.paths for r in rules):
                problems.append(f"no HF tensor maps to the spec's parameter {'/'.join(p)}")
        unused = sorted(k for k in keys - reader.used if not _BUFFERS.search(k))
        problems += [f"HF tensor {k} {list(reader.where[k].get_slice(k).get_shape())} maps to no "
                     f"parameter of the spec" for k in unused]
        if problems:
            raise HFError(f"the tensors in {hf_dir} do not fill the spec's model `{arch.name}`",
                          problems)
    return out


def _import_hf(spec: Path, hf_dir: Path, model: str | None, out: Path | None) -> None:
    _need_safetensors()
    archs = _load_spec(spec)
    cfg = _read_config(hf_dir)
    family = family_of_config(cfg)
    if model is not None:
        arch = _pick(archs, model, spec)
        problems = mismatches(arch, family, cfg)
        if problems:
            raise HFError(f"{hf_dir / 'config.json'} ({family}) does not match model `{arch.name}` "
                          f"of {spec}", problems)
    else:  # the first model of the spec that config.json matches
        found = [(a, mismatches(a, family, cfg)) for a in archs]
        ok = [a for a, problems in found if not problems]
        if not ok:
            details = [f"{a.name}: {p}" for a, problems in found for p in problems]
            raise HFError(f"{hf_dir / 'config.json'} ({family}) matches no model of {spec}", details)
        arch = ok[0]
    if arch.values.get("capacity_factor", 0.0) > 0:
        print(f"warning: `{arch.name}` drops tokens over expert capacity (capacity_factor = "
              f"{arch['capacity_factor']}); {family} does not, so logits can differ", file=sys.stderr)
    out = (out if out is not None else Path("runs") / f"{spec.stem}-hf" / "params").absolute()
    if out.exists():
        raise HFError(f"{out} already exists", ["remove it or choose another --out"])
    arrays = convert_from_hf(arch, family, hf_dir)
    tree = _nest(arrays)
    _save_params(out, tree)
    n = sum(int(np.prod(a.shape)) for a in arrays.values())
    print(f"wrote {out}: {n:,} parameters of `{arch.name}` from {hf_dir} ({FAMILIES[family]})")


def _nest(flat: dict[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, a in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = a
    return tree


def _flatten(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _save_params(out: Path, tree: dict) -> None:
    import jax
    import orbax.checkpoint as ocp

    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    tree = jax.tree.map(lambda a: jax.device_put(a, one), tree)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out, tree)
        ckptr.wait_until_finished()


# ----------------------------------------------------------------------------- export


def export_hf(spec: Path, ckpt_dir: Path, out: Path, model: str | None = None) -> int:
    """`axdsl export-hf`: an orbax checkpoint -> config.json + model.safetensors. Returns the exit code."""
    try:
        _export_hf(Path(spec), Path(ckpt_dir), Path(out), model)
    except CompileError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except HFError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    return 0


def _find_checkpoint(ckpt: Path) -> tuple[Path, str | None]:
    """The orbax pytree directory to read, and the model a run's run.json names (if any)."""
    if not ckpt.exists():
        raise HFError(f"{ckpt} does not exist")
    if (ckpt / "_METADATA").exists():
        return ckpt, None  # a params checkpoint, or a run step's "state" item
    if (ckpt / "state" / "_METADATA").exists():
        return ckpt / "state", None  # one step of a train.py run
    run_model = None
    base = ckpt
    if (ckpt / "run.json").exists():
        try:
            info = json.loads((ckpt / "run.json").read_text(encoding="utf-8"))
            run_model = info.get("model")
            base = ckpt / info.get("train", {}).get("checkpoint_dir", "checkpoints")
        except (OSError, ValueError, AttributeError):
            base = ckpt / "checkpoints"
    elif (ckpt / "checkpoints").is_dir():
        base = ckpt / "checkpoints"
    steps = sorted(int(p.name) for p in base.glob("*")
                   if p.name.isdigit() and (p / "state" / "_METADATA").exists())
    if not steps:
        raise HFError(f"no orbax checkpoint found in {ckpt}",
                      ["give a params checkpoint (import-hf's output), a train.py run directory, "
                       "its checkpoints/ directory or one step directory"])
    return base / str(steps[-1]) / "state", run_model


def _metadata_tree(path: Path) -> dict:
    import orbax.checkpoint as ocp

    meta = ocp.StandardCheckpointer().metadata(path)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, dict):
        raise HFError(f"cannot read the tree of the orbax checkpoint {path}")
    return tree


def _restore_params(path: Path, arch: Arch, stored: dict[tuple[str, ...], Any], state: bool) -> dict:
    import jax
    import orbax.checkpoint as ocp

    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    flat = {p: jax.ShapeDtypeStruct(shape, stored[p].dtype if p in stored else dtype, sharding=one)
            for p, (shape, dtype) in arch.params.items()}
    abstract = _nest(flat)
    if state:  # a train state: read only its params
        abstract = {"params": abstract}
        args = ocp.args.PyTreeRestore(item=abstract, partial_restore=True,
                                      restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))
        with ocp.PyTreeCheckpointer() as ckptr:
            return ckptr.restore(path, args=args)["params"]
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, abstract)


def _shape_problems(arch: Arch, stored: dict[tuple[str, ...], Any]) -> list[str]:
    out = []
    for p, (shape, _) in arch.params.items():
        if p not in stored:
            out.append(f"the checkpoint has no {'/'.join(p)}")
        elif tuple(stored[p].shape) != shape:
            out.append(f"{'/'.join(p)}: checkpoint shape {tuple(stored[p].shape)}, spec shape {shape}")
    out += [f"the checkpoint's {'/'.join(p)} is not a parameter of the spec" for p in stored
            if p not in arch.params]
    return out


def _export_hf(spec: Path, ckpt_dir: Path, out: Path, model: str | None) -> None:
    _need_safetensors()
    from safetensors.numpy import save_file

    archs = _load_spec(spec)
    path, run_model = _find_checkpoint(ckpt_dir)
    meta = _metadata_tree(path.absolute())
    state = isinstance(meta.get("params"), dict) and ("opt_state" in meta or "step" in meta)
    stored = _flatten(meta["params"] if state else meta)
    model = model or run_model
    if model is not None:
        arch = _pick(archs, model, spec)
        problems = _shape_problems(arch, stored)
        if problems:
            raise HFError(f"{path} is not a checkpoint of model `{arch.name}` of {spec}", problems)
    else:  # the first model whose parameter shapes the checkpoint has
        found = [(a, _shape_problems(a, stored)) for a in archs]
        ok = [a for a, problems in found if not problems]
        if not ok:
            raise HFError(f"{path} matches no model of {spec}",
                          [f"{a.name}: {p}" for a, problems in found for p in problems[:5]])
        arch = ok[0]
    family = family_of_arch(arch)
    cfg = hf_config(arch, family)
    problems = mismatches(arch, family, cfg)  # what the family cannot express
    if problems:
        raise HFError(f"model `{arch.name}` cannot be written as a {FAMILIES[family]}", problems)
    if arch.values.get("capacity_factor", 0.0) > 0:
        print(f"warning: `{arch.name}` drops tokens over expert capacity (capacity_factor = "
              f"{arch['capacity_factor']}); {family} does not, so logits can differ", file=sys.stderr)
    taken = [p.name for p in out.glob("*.safetensors")] + [
        p.name for p in (out / "config.json", out / "model.safetensors.index.json") if p.exists()]
    if taken:
        raise HFError(f"{out} already holds a model", [f"remove {', '.join(sorted(taken))} first"])

    try:
        params = _restore_params(path.absolute(), arch, stored, state)
    except (ValueError, OSError, KeyError) as exc:
        raise HFError(f"cannot read the orbax checkpoint {path}: {exc}") from None
    flat = {p: np.asarray(a) for p, a in _flatten(params).items()}
    tensors: dict[str, np.ndarray] = {}
    for r in _rules(family, arch, None):
        if r.layered:
            for i in range(arch["layers"]):
                tensors.update(r.save(tuple(flat[p][i] for p in r.paths), i))
        else:
            tensors.update(r.save(tuple(flat[p] for p in r.paths), 0))
    tensors = {k: np.ascontiguousarray(a) for k, a in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    n = sum(int(a.size) for a in tensors.values())
    print(f"wrote {out / 'config.json'} and {out / 'model.safetensors'}: {n:,} parameters of "
          f"`{arch.name}` as {FAMILIES[family]}")
