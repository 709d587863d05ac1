"""The spec's side of the decoder families: the facts of std's DecoderLM, read from its IR.

Every decoder family (gpt2, the llama relatives, phi, gpt_neox, gemma, mamba2, deepseek_v3) reads
its spec model here (`read_decoder`, the `read` of their registry entries): the model's sizes, the
repeated block (Block, ParallelBlock or MambaBlock, or a pattern of them), its norms, attention
(std's Attention or MLAttention), feed-forward and mixer. The reader states them in a scratch
`Facts`, then types them as the smallest `DecoderFacts` type that has them all (declared by the
families: MoeFacts for MoE blocks, DeepSeekFacts, Mamba2Facts; DecoderFacts for the others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from axdsl.hf.facts import FIELDS, Arch, AttentionFacts, Facts, fact, narrowest
from axdsl.hf.facts import hv as _hv


@dataclass
class DecoderFacts(AttentionFacts):
    """std's DecoderLM: its blocks' rotary embedding, norms and per-layer attention, beside the
    facts of `AttentionFacts`. The type of gpt2, llama, mistral, qwen2, qwen3, phi, gpt_neox,
    gemma2 and gemma3_text; the MoE, DeepSeek and Mamba-2 families extend it."""

    head_bias: bool = fact("head_bias")
    shared_norm: bool = fact("ParallelBlock shared_norm")
    embed_multiplier: float = fact("embed_multiplier")
    logit_softcap: float = fact("logit_softcap")
    dense_layers: int = fact("dense_layers")
    layer_windows: tuple[int | None, ...] = fact("the layers' attention windows")
    layer_ropes: tuple[tuple[float | None, str | None, float | None], ...] = fact(
        "the layers' rotary (rope_theta, rope_scaling, rope_factor)"
    )
    qk_norm_eps: float | None = fact("q_norm/k_norm eps")
    rope_theta: float | None = fact("rope_theta")
    rope_dim: int = fact("attention rope_dim")
    rope_scaling: str = fact("attention rope_scaling")
    rope_factor: float = fact("attention rope_factor")
    rope_low_freq: float = fact("attention rope_low_freq")
    rope_high_freq: float = fact("attention rope_high_freq")
    rope_original_max_seq: int = fact("attention rope_original_max_seq")
    rope_beta_fast: float = fact("attention rope_beta_fast")
    rope_beta_slow: float = fact("attention rope_beta_slow")
    rope_untruncated: bool = fact("attention rope_untruncated")
    rope_mscale: float = fact("attention rope_mscale")
    rope_mscale_all_dim: float = fact("attention rope_mscale_all_dim")
    rope_attention_factor: float = fact("attention rope_attention_factor")


BLOCKS = (
    "Block",
    "ParallelBlock",
    "MambaBlock",
)  # std's residual blocks: sequential, parallel, Mamba-2
PATTERN = (
    "BlocksPattern"  # repeat(n, [A(), B()]): the layers alternate (Gemma 2's local and global)
)


def read_decoder(arch: Arch[Facts], root: Any) -> Arch[DecoderFacts]:
    """The facts of a DecoderLM (`root` its IR instance), typed as the family that has them."""
    _read(arch, root)
    return arch.with_facts(narrowest(DecoderFacts, arch.facts))


def _read(arch: Arch[Facts], root: Any) -> None:
    """State the DecoderLM's facts in `arch.facts` (a scratch Facts)."""
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
        setattr(arch.facts, k, _hv(root, k))
    arch.facts.set(
        embed_multiplier=float(_hv(root, "embed_multiplier", 1.0)),
        logit_softcap=float(_hv(root, "logit_softcap", 0.0)),
        dense_layers=_hv(root, "dense_layers", 0),
    )
    blocks = root.child("blocks")
    elements = _pattern_elements(arch, blocks)
    if any(b is None or b.layer not in BLOCKS for b in elements):
        arch.problems.append(
            "the repeated block is not std's Block, ParallelBlock or MambaBlock "
            "(or a pattern of them)"
        )
        return
    per_layer = [_block_values(arch, b, root) for b in elements]
    arch.facts.update(per_layer[0])
    _read_layer_values(arch, per_layer)
    if arch.facts.get("dense_layers"):
        _read_dense_blocks(arch, root)


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


def _read_layer_values(arch: Arch, per_layer: list[Facts]) -> None:
    """Each layer's window and rotary (layer i is pattern element i % k); any other difference
    between a pattern's elements is a problem, as no Hugging Face family states it."""
    n, k = arch.facts.layers, len(per_layer)
    at = [per_layer[i % k] for i in range(n)]
    arch.facts.set(
        layer_windows=tuple(v.get("window") for v in at),
        layer_ropes=tuple(
            (v.get("rope_theta"), v.get("rope_scaling"), v.get("rope_factor")) for v in at
        ),
    )
    for key in sorted(set().union(*(v.written for v in per_layer)) - set(PER_LAYER)):
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
    if values.mlp != "SwiGLU":
        arch.problems.append(
            f"the dense blocks' feed-forward is {values.mlp}; DeepSeek's is SwiGLU"
        )
    arch.facts.set(dense_hidden=values.hidden)
    for k in sorted(values.written - {"mlp", "hidden"}):
        if repr(values.get(k)) != repr(arch.facts.get(k)):
            arch.problems.append(
                f"the dense blocks differ from the others in {FIELDS.get(k, k)} "
                "(Hugging Face's differ only in their feed-forward)"
            )


def _block_values(arch: Arch[Facts], block, root) -> Facts:
    """The facts of one repeated block (a pattern has one per element), in a scratch Facts."""
    sub = Arch(arch.name, Facts(), {}, arch.problems)
    sub.facts.block = block.layer
    if block.layer == "MambaBlock":
        _read_norms(
            sub, [n for n in (block.child("norm"), root.child("final_norm")) if n is not None]
        )
        _read_mixer(sub, block.child("mixer"), root)
        return sub.facts
    if block.layer == "ParallelBlock":
        sub.facts.set(shared_norm=_hv(block, "shared_norm"))
    else:
        sub.facts.set(post_norms=_hv(block, "post_norms", False))
    names = ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm")
    norms = [block.child(n) for n in names] + [root.child("final_norm")]
    _read_norms(sub, [n for n in norms if n is not None])
    _read_attention(sub, block.child("attn"))
    _read_feed_forward(sub, block.child("mlp"))
    return sub.facts


def _read_norms(arch: Arch[Facts], norms: list) -> None:
    """The norm layer: attn_norm, mlp_norm and final_norm must be one kind (HF has one)."""
    v, problems = arch.facts, arch.problems
    kinds = {(n.layer, _hv(n, "eps"), _hv(n, "bias")) for n in norms}
    if len(kinds) != 1:
        problems.append(
            "attn_norm, mlp_norm and final_norm differ: "
            + ", ".join(f"{n.path} = {n.layer}(eps = {_hv(n, 'eps')})" for n in norms)
        )
    norm = norms[0]
    v.norm, v.norm_eps = norm.layer, _hv(norm, "eps")
    if norm.layer == "LayerNorm":
        v.norm_bias = _hv(norm, "bias")
    elif norm.layer not in ("RMSNorm", "GemmaRMSNorm"):
        problems.append(
            f"norm is {norm.layer}; only RMSNorm, GemmaRMSNorm and LayerNorm have HF counterparts"
        )


def _read_mixer(arch: Arch[Facts], mixer, root) -> None:
    """Mamba-2's mixer: its sizes, conv and the eps of its gated norm (HF has one eps for all
    norms)."""
    v = arch.facts
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
        setattr(v, k, _hv(mixer, name))
    v.set(mixer_eps=_hv(mixer.child("norm"), "eps"))
    if _hv(mixer, "inner") != v.get("ssm_expand") * _hv(root, "dim"):
        arch.problems.append(
            f"Mamba2Mixer inner = {_hv(mixer, 'inner')} is not expand x dim "
            "(transformers' intermediate size is int(expand * hidden_size))"
        )


def _read_latent_attention(arch: Arch[Facts], attn) -> None:
    """DeepSeek's multi-head latent attention: ranks, head dims, rope (interleaved or not)."""
    v = arch.facts
    v.set(
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
        setattr(v, k, _hv(attn, k))
    v.set(rope_theta=float(_hv(attn, "rope_theta")))
    for k in ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        setattr(v, f"rope_{k}", float(_hv(attn, f"rope_{k}")))
    v.set(rope_untruncated=False, rope_attention_factor=0.0)
    if _hv(attn.child("q_norm"), "eps") not in (None, _hv(attn.child("kv_norm"), "eps")):
        arch.problems.append(
            "MLAttention's q_norm and kv_norm eps differ (Hugging Face has one rms_norm_eps)"
        )
    v.set(latent_norm_eps=_hv(attn.child("kv_norm"), "eps"))


def _read_attention(arch: Arch[Facts], attn) -> None:
    v = arch.facts
    if attn is not None and attn.layer == "MLAttention":
        _read_latent_attention(arch, attn)
        return
    if attn is None or attn.layer != "Attention":
        arch.problems.append("the block's attention is not std's Attention")
        return
    for k in ("head_dim", "kv_heads", "causal", "rope"):
        setattr(v, k, _hv(attn, k))
    if v.rope:
        v.set(
            rope_theta=float(_hv(attn, "rope_theta")),
            rope_dim=_hv(attn, "rope_dim"),
            rope_scaling=_hv(attn, "rope_scaling"),
            rope_original_max_seq=_hv(attn, "rope_original_max_seq"),
            rope_untruncated=_hv(attn, "rope_untruncated"),
        )
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
            setattr(v, f"rope_{k}", float(_hv(attn, f"rope_{k}")))
        if _hv(attn, "rope_interleaved"):
            arch.problems.append(
                "attention rope_interleaved = true (Llama-family checkpoints are half-split)"
            )
    v.set(window=_hv(attn, "window"))
    v.attn_bias = _hv(attn, "bias")
    v.out_bias = _hv(attn, "out_bias")
    v.set(scale=float(_hv(attn, "scale", 0.0)), softcap=float(_hv(attn, "softcap", 0.0)))
    v.qk_norm = _hv(attn, "qk_norm")
    if v.qk_norm:
        eps = {_hv(attn.child(c), "eps") for c in ("q_norm", "k_norm")}
        v.set(qk_norm_eps=eps.pop() if len(eps) == 1 else None)


def _read_feed_forward(arch: Arch[Facts], mlp) -> None:
    v = arch.facts
    v.mlp = mlp.layer if mlp is not None else None
    if v.mlp == "SwiGLU":
        v.hidden = _hv(mlp, "hidden")
    elif v.mlp == "GatedMLP":
        v.hidden, v.act = _hv(mlp, "hidden"), _hv(mlp, "act")
    elif v.mlp == "MLP":
        v.hidden, v.act, v.mlp_bias = _hv(mlp, "hidden"), _hv(mlp, "act"), _hv(mlp, "bias")
    elif v.mlp == "MoE":
        for k in ("hidden", "experts", "top_k", "normalize", "shared"):
            setattr(v, k, _hv(mlp, k))
        v.set(capacity_factor=float(_hv(mlp, "capacity_factor")))
    elif v.mlp == "DeepSeekMoE":
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
            setattr(v, k, _hv(mlp, k))
        v.set(
            routed_scale=float(_hv(mlp, "scale")),
            capacity_factor=float(_hv(mlp, "capacity_factor")),
        )
        if _hv(mlp, "shared_hidden") != v.hidden:
            arch.problems.append(
                "DeepSeekMoE shared_hidden differs from hidden (HF's shared experts are "
                "moe_intermediate_size wide)"
            )
    else:
        arch.problems.append(
            f"the feed-forward layer is {v.mlp}; HF families have SwiGLU, GatedMLP, MLP or MoE"
        )
