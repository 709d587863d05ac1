"""The spec's side of Hugging Face interop: what a spec's model is, read from its IR.

An `Arch` holds the facts a Hugging Face config.json states (dims, heads, norm, rope, window,
feed-forward kind, experts, ...) under the field names of `FIELDS`, plus every parameter's path,
shape and dtype, and the structure no HF family has (`problems`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from axdsl.hf.errors import HFError


@dataclass
class Arch:
    """What a spec's model is, read from its IR: the facts a Hugging Face config states."""

    name: str
    values: dict[str, Any]  # field -> value (see FIELDS)
    params: dict[tuple[str, ...], tuple[tuple[int, ...], str]]  # path -> (shape, dtype name)
    problems: list[str] = field(default_factory=list)  # structure no HF family has
    pattern: int = (
        0  # the length of a repeated pattern of blocks (blocks/0, blocks/1, ...); 0: one block
    )
    tail: int = (
        0  # layers after the scanned groups when the pattern does not divide them (blocks/tail/<e>)
    )

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)


# field -> how the spec states it (for messages)
FIELDS = {
    "vocab": "vocab",
    "dim": "dim",
    "layers": "layers",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "head_dim": "attention head_dim",
    "max_seq": "max_seq",
    "positions": "positions",
    "tied": "tied",
    "norm": "norm layer",
    "norm_eps": "norm eps",
    "norm_bias": "LayerNorm bias",
    "causal": "attention causal",
    "rope": "attention rope",
    "rope_theta": "rope_theta",
    "rope_dim": "attention rope_dim",
    "rope_scaling": "attention rope_scaling",
    "rope_factor": "attention rope_factor",
    "rope_low_freq": "attention rope_low_freq",
    "rope_high_freq": "attention rope_high_freq",
    "rope_original_max_seq": "attention rope_original_max_seq",
    "rope_beta_fast": "attention rope_beta_fast",
    "rope_beta_slow": "attention rope_beta_slow",
    "rope_untruncated": "attention rope_untruncated",
    "rope_mscale": "attention rope_mscale",
    "rope_mscale_all_dim": "attention rope_mscale_all_dim",
    "rope_attention_factor": "attention rope_attention_factor",
    "window": "attention window",
    "attn_bias": "attention bias",
    "qk_norm": "attention qk_norm",
    "qk_norm_eps": "q_norm/k_norm eps",
    "mlp": "feed-forward layer",
    "hidden": "feed-forward hidden",
    "act": "MLP act",
    "mlp_bias": "MLP bias",
    "experts": "MoE experts",
    "top_k": "MoE top_k",
    "normalize": "MoE normalize",
    "shared": "MoE shared experts",
    "block": "block layer",
    "out_bias": "attention out_bias",
    "head_bias": "head_bias",
    "shared_norm": "ParallelBlock shared_norm",
    "post_norms": "Block post_norms",
    "scale": "attention scale",
    "softcap": "attention softcap",
    "embed_multiplier": "embed_multiplier",
    "logit_softcap": "logit_softcap",
    "layer_windows": "the layers' attention windows",
    "layer_ropes": "the layers' rotary (rope_theta, rope_scaling, rope_factor)",
    "ssm_expand": "Mamba2Mixer expand",
    "ssm_head_dim": "Mamba2Mixer head_dim",
    "ssm_state": "Mamba2Mixer state",
    "ssm_groups": "Mamba2Mixer groups",
    "conv_kernel": "Mamba2Mixer conv_kernel",
    "chunk": "Mamba2Mixer chunk",
    "conv_bias": "Mamba2Mixer conv_bias",
    "mixer_eps": "Mamba2Mixer eps (its gated norm)",
    "attn": "attention layer",
    "dense_layers": "dense_layers",
    "dense_hidden": "the dense blocks' SwiGLU hidden",
    "q_rank": "MLAttention q_rank",
    "kv_rank": "MLAttention kv_rank",
    "nope_dim": "MLAttention nope_dim",
    "v_head_dim": "MLAttention v_head_dim",
    "rope_interleaved": "attention rope_interleaved",
    "groups": "DeepSeekMoE groups",
    "top_groups": "DeepSeekMoE top_groups",
    "routed_scale": "DeepSeekMoE scale",
    "score": "DeepSeekMoE score",
    "latent_norm_eps": "MLAttention kv_norm eps",
    "type_vocab": "type_vocab",
    "root": "root layer",
    "height": "height",
    "width": "width",
    "patch": "patch",
    "channels": "channels",
    "classes": "classes",
    "dec_layers": "T5 dec_layers",
    "buckets": "T5 buckets",
    "max_distance": "T5 max_distance",
}
BLOCKS = (
    "Block",
    "ParallelBlock",
    "MambaBlock",
)  # std's residual blocks: sequential, parallel, Mamba-2
PATTERN = (
    "BlocksPattern"  # repeat(n, [A(), B()]): the layers alternate (Gemma 2's local and global)
)


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
    if root.layer == "BertMLM":  # an encoder: its facts are read in bert.py
        from axdsl.hf.bert import bert_arch

        return bert_arch(arch, root)
    if root.layer == "VisionTransformer":  # an image classifier: its facts are read in vit.py
        from axdsl.hf.vit import vit_arch

        return vit_arch(arch, root)
    if root.layer == "T5":  # an encoder-decoder: axdsl/hf/t5.py
        from axdsl.hf.t5 import read_arch

        return read_arch(arch, root)
    if root.layer != "DecoderLM":
        arch.problems.append(
            f"the model is a {root.layer}; Hugging Face interop needs std's DecoderLM, "
            "BertMLM, VisionTransformer or T5"
        )
        return arch
    for k in (
        "vocab",
        "dim",
        "layers",
        "heads",
        "kv_heads",
        "max_seq",
        "positions",
        "tied",
        "head_bias",
    ):
        arch.values[k] = _hv(root, k)
    arch.values["embed_multiplier"] = float(_hv(root, "embed_multiplier", 1.0))
    arch.values["logit_softcap"] = float(_hv(root, "logit_softcap", 0.0))
    arch.values["dense_layers"] = _hv(root, "dense_layers", 0)
    blocks = root.child("blocks")
    elements = _pattern_elements(arch, blocks)
    if any(b is None or b.layer not in BLOCKS for b in elements):
        arch.problems.append(
            "the repeated block is not std's Block, ParallelBlock or MambaBlock (or a pattern of them)"
        )
        return arch
    per_layer = [_block_values(arch, b, root) for b in elements]
    arch.values.update(per_layer[0])
    _read_layer_values(arch, per_layer)
    if arch.values["dense_layers"]:
        _read_dense_blocks(arch, root)
    return arch


# What the layers of a pattern may differ in: the attention window (Gemma 2 and 3), and the rotary
# base and scaling (Gemma 3's local and global layers). Only Gemma 3 states per-layer rotary in its
# config.json; for the other families, layers that differ in it are a mismatch (config.py).
PER_LAYER = ("window", "rope_theta", "rope_scaling", "rope_factor")


def _pattern_elements(arch: Arch, blocks) -> list:
    """The blocks of one pattern period: `blocks` itself, its elements, or (when the pattern does
    not divide the layers) the elements of its scanned `groups`, with the `tail` count recorded."""
    if blocks is None or blocks.layer != PATTERN:
        return [blocks]
    groups, tail = blocks.child("groups"), blocks.child("tail")
    if groups is not None and tail is not None:
        arch.tail = len(tail.children)
        blocks = groups
    arch.pattern = len(blocks.children)
    return list(blocks.children)


def _read_layer_values(arch: Arch, per_layer: list[dict[str, Any]]) -> None:
    """Each layer's window and rotary (layer i is pattern element i % k); any other difference
    between a pattern's elements is a problem, as no Hugging Face family states it."""
    n, k = arch.values["layers"], len(per_layer)
    at = [per_layer[i % k] for i in range(n)]
    arch.values["layer_windows"] = tuple(v.get("window") for v in at)
    arch.values["layer_ropes"] = tuple(
        (v.get("rope_theta"), v.get("rope_scaling"), v.get("rope_factor")) for v in at
    )
    for key in sorted(set().union(*per_layer) - set(PER_LAYER)):
        if len({repr(v.get(key)) for v in per_layer}) > 1:
            arch.problems.append(
                f"the pattern's layers differ in {FIELDS.get(key, key)} "
                "(Hugging Face layers differ only in their attention window and rotary)"
            )


def _read_dense_blocks(arch: Arch, root) -> None:
    """DeepSeek's dense first layers: the same block as the others but a SwiGLU feed-forward."""
    dense = root.child("dense_blocks")
    if dense is None or dense.layer != "Block":
        arch.problems.append("the dense blocks are not std's Block")
        return
    values = _block_values(arch, dense, root)
    if values.get("mlp") != "SwiGLU":
        arch.problems.append(
            f"the dense blocks' feed-forward is {values.get('mlp')}; DeepSeek's is SwiGLU"
        )
    arch.values["dense_hidden"] = values.get("hidden")
    for k in sorted(set(values) - {"mlp", "hidden"}):
        if repr(values[k]) != repr(arch.values.get(k)):
            arch.problems.append(
                f"the dense blocks differ from the others in {FIELDS.get(k, k)} "
                "(Hugging Face's differ only in their feed-forward)"
            )


def _block_values(arch: Arch, block, root) -> dict[str, Any]:
    """The facts of one repeated block (a pattern has one per element)."""
    sub = Arch(arch.name, {}, {}, arch.problems)
    sub.values["block"] = block.layer
    if block.layer == "MambaBlock":
        _read_norms(
            sub, [n for n in (block.child("norm"), root.child("final_norm")) if n is not None]
        )
        _read_mixer(sub, block.child("mixer"), root)
        return sub.values
    if block.layer == "ParallelBlock":
        sub.values["shared_norm"] = _hv(block, "shared_norm")
    else:
        sub.values["post_norms"] = _hv(block, "post_norms", False)
    names = ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm")
    norms = [block.child(n) for n in names] + [root.child("final_norm")]
    _read_norms(sub, [n for n in norms if n is not None])
    _read_attention(sub, block.child("attn"))
    _read_feed_forward(sub, block.child("mlp"))
    return sub.values


def _read_norms(arch: Arch, norms: list) -> None:
    """The norm layer: attn_norm, mlp_norm and final_norm must be one kind (HF has one)."""
    v, problems = arch.values, arch.problems
    kinds = {(n.layer, _hv(n, "eps"), _hv(n, "bias")) for n in norms}
    if len(kinds) != 1:
        problems.append(
            "attn_norm, mlp_norm and final_norm differ: "
            + ", ".join(f"{n.path} = {n.layer}(eps = {_hv(n, 'eps')})" for n in norms)
        )
    norm = norms[0]
    v["norm"], v["norm_eps"] = norm.layer, _hv(norm, "eps")
    if norm.layer == "LayerNorm":
        v["norm_bias"] = _hv(norm, "bias")
    elif norm.layer not in ("RMSNorm", "GemmaRMSNorm"):
        problems.append(
            f"norm is {norm.layer}; only RMSNorm, GemmaRMSNorm and LayerNorm have HF counterparts"
        )


def _read_mixer(arch: Arch, mixer, root) -> None:
    """Mamba-2's mixer: its sizes, conv and the eps of its gated norm (HF has one eps for all norms)."""
    v = arch.values
    if mixer is None or mixer.layer != "Mamba2Mixer":
        arch.problems.append("the MambaBlock's mixer is not std's Mamba2Mixer")
        return
    for k, name in (
        ("ssm_expand", "expand"),
        ("ssm_head_dim", "head_dim"),
        ("ssm_state", "state"),
        ("ssm_groups", "groups"),
        ("conv_kernel", "conv_kernel"),
        ("chunk", "chunk"),
        ("conv_bias", "conv_bias"),
        ("heads", "heads"),
    ):
        v[k] = _hv(mixer, name)
    v["mixer_eps"] = _hv(mixer.child("norm"), "eps")
    if _hv(mixer, "inner") != v["ssm_expand"] * _hv(root, "dim"):
        arch.problems.append(
            f"Mamba2Mixer inner = {_hv(mixer, 'inner')} is not expand x dim "
            "(transformers' intermediate size is int(expand * hidden_size))"
        )


def _read_latent_attention(arch: Arch, attn) -> None:
    """DeepSeek's multi-head latent attention: ranks, head dims, rope (interleaved or not)."""
    v = arch.values
    v.update(
        attn="MLAttention",
        causal=_hv(attn, "causal"),
        rope=True,
        window=0,
        attn_bias=False,
        out_bias=False,
        qk_norm=False,
        softcap=0.0,
        scale=float(_hv(attn, "scale")),
    )
    for k in (
        "q_rank",
        "kv_rank",
        "nope_dim",
        "rope_dim",
        "v_head_dim",
        "rope_interleaved",
        "rope_scaling",
        "rope_original_max_seq",
    ):
        v[k] = _hv(attn, k)
    v["rope_theta"] = float(_hv(attn, "rope_theta"))
    for k in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        v[f"rope_{k}"] = float(_hv(attn, f"rope_{k}"))
    v["rope_untruncated"], v["rope_attention_factor"] = False, 0.0
    if _hv(attn.child("q_norm"), "eps") not in (None, _hv(attn.child("kv_norm"), "eps")):
        arch.problems.append(
            "MLAttention's q_norm and kv_norm eps differ (Hugging Face has one rms_norm_eps)"
        )
    v["latent_norm_eps"] = _hv(attn.child("kv_norm"), "eps")


def _read_attention(arch: Arch, attn) -> None:
    v = arch.values
    if attn is not None and attn.layer == "MLAttention":
        _read_latent_attention(arch, attn)
        return
    if attn is None or attn.layer != "Attention":
        arch.problems.append("the block's attention is not std's Attention")
        return
    for k in ("head_dim", "kv_heads", "causal", "rope"):
        v[k] = _hv(attn, k)
    if v["rope"]:
        v["rope_theta"] = float(_hv(attn, "rope_theta"))
        v["rope_dim"], v["rope_scaling"] = _hv(attn, "rope_dim"), _hv(attn, "rope_scaling")
        v["rope_original_max_seq"] = _hv(attn, "rope_original_max_seq")
        v["rope_untruncated"] = _hv(attn, "rope_untruncated")
        for k in (
            "factor",
            "low_freq",
            "high_freq",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "attention_factor",
        ):
            v[f"rope_{k}"] = float(_hv(attn, f"rope_{k}"))
        if _hv(attn, "rope_interleaved"):
            arch.problems.append(
                "attention rope_interleaved = true (Llama-family checkpoints are half-split)"
            )
    v["window"] = _hv(attn, "window")
    v["attn_bias"] = _hv(attn, "bias")
    v["out_bias"] = _hv(attn, "out_bias")
    v["scale"], v["softcap"] = float(_hv(attn, "scale", 0.0)), float(_hv(attn, "softcap", 0.0))
    v["qk_norm"] = _hv(attn, "qk_norm")
    if v["qk_norm"]:
        eps = {_hv(attn.child(c), "eps") for c in ("q_norm", "k_norm")}
        v["qk_norm_eps"] = eps.pop() if len(eps) == 1 else None


def _read_feed_forward(arch: Arch, mlp) -> None:
    v = arch.values
    v["mlp"] = mlp.layer if mlp is not None else None
    if v["mlp"] == "SwiGLU":
        v["hidden"] = _hv(mlp, "hidden")
    elif v["mlp"] == "GatedMLP":
        v["hidden"], v["act"] = _hv(mlp, "hidden"), _hv(mlp, "act")
    elif v["mlp"] == "MLP":
        v["hidden"], v["act"], v["mlp_bias"] = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    elif v["mlp"] == "MoE":
        for k in ("hidden", "experts", "top_k", "normalize", "shared"):
            v[k] = _hv(mlp, k)
        v["capacity_factor"] = float(_hv(mlp, "capacity_factor"))
    elif v["mlp"] == "DeepSeekMoE":
        for k in (
            "hidden",
            "experts",
            "top_k",
            "normalize",
            "shared",
            "groups",
            "top_groups",
            "score",
        ):
            v[k] = _hv(mlp, k)
        v["routed_scale"] = float(_hv(mlp, "scale"))
        v["capacity_factor"] = float(_hv(mlp, "capacity_factor"))
        if _hv(mlp, "shared_hidden") != v["hidden"]:
            arch.problems.append(
                "DeepSeekMoE shared_hidden differs from hidden (HF's shared experts are "
                "moe_intermediate_size wide)"
            )
    else:
        arch.problems.append(
            f"the feed-forward layer is {v['mlp']}; HF families have SwiGLU, GatedMLP, MLP or MoE"
        )


def load_spec(spec: Path) -> list[Arch]:
    """The Arch of every model of a spec (compiled for cpu, up to stack_repeats)."""
    from axdsl.pipeline import compile_spec

    module = compile_spec(Path(spec), "cpu", after="stack_repeats")
    return [arch_of(m) for m in module.models]


def pick(archs: list[Arch], name: str | None, spec: Path) -> Arch:
    """The model called `name`; HFError naming the spec's models when there is none."""
    names = [a.name for a in archs]
    for a in archs:
        if a.name == name:
            return a
    raise HFError(f"{spec} has no model `{name}`", [f"its models: {', '.join(names)}"])
