"""Small helper functions copied into generated code only when an emitted line calls them.

The emitters record which helpers they call (`FunctionEmitter.helpers`); `select` returns their
source and the imports that source needs, so nothing is found by searching rendered text. A
helper holds only the paths the spec uses: a dropless MoE ships no capacity dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from axdsl.codegen import kernels, quant

APPLY_ROPE = '''def apply_rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding on x [B, S, heads, head_dim] (Llama's half-split layout)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))  # [head_dim / 2]
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freqs  # [S, head_dim / 2]
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)'''

DROPOUT = '''def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity when `rng` is None (evaluation)."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _fold(rng: jax.Array | None, i) -> jax.Array | None:
    """A distinct key per dropout site and layer; None stays None."""
    return None if rng is None else jax.random.fold_in(rng, i)'''


@dataclass(frozen=True)
class Helper:
    """The source of one helper and the import lines it needs."""

    code: str
    imports: tuple[str, ...] = ("import jax", "import jax.numpy as jnp")


def _moe_router(capacity: bool, dropless: bool) -> str:
    """moe_swiglu with only the dispatch paths in use (both, and the branch, when a Config decides)."""
    params = [p for p in MOE_PARAMS if capacity or p != "capacity_factor: float"]
    signature = "def moe_swiglu(\n" + "".join(f"    {p},\n" for p in params) + ") -> tuple[jax.Array, jax.Array]:\n"
    doc = [MOE_DOC_HEAD]
    if capacity:
        doc.append(MOE_DOC_CAPACITY)
    if dropless:
        doc.append(MOE_DOC_DROPLESS)
    if capacity and dropless:
        tail = ("    if capacity_factor > 0:\n        " + MOE_CALL_CAPACITY + "\n    else:\n        "
                + MOE_CALL_DROPLESS)
    else:
        tail = "    " + (MOE_CALL_CAPACITY if capacity else MOE_CALL_DROPLESS)
    return (signature + '    """' + " ".join(doc) + MOE_DOC_TAIL + '    """\n' + MOE_ROUTING
            + tail + "\n    return y.astype(x.dtype), aux")


MOE_PARAMS = ("x: jax.Array", "logits: jax.Array", "w_gate: jax.Array", "w_up: jax.Array",
              "w_down: jax.Array", "top_k: int", "capacity_factor: float", "normalize: bool",
              "aux_weight: float", "z_weight: float")
MOE_DOC_HEAD = """Mixture of SwiGLU experts on x [B, S, dim] with router logits [B, S, experts].

    Each token goes to its `top_k` experts, weighted by the router softmax (renormalized over the
    chosen k when `normalize`, as Mixtral and Qwen3 do)."""
MOE_DOC_CAPACITY = """With capacity_factor > 0 an expert takes
    at most ceil(top_k * S * capacity_factor / experts) tokens of each sequence, first choices
    first (GShard, Switch); tokens over capacity skip that expert and keep their residual."""
MOE_DOC_DROPLESS = """Nothing is dropped (the spec's
    capacity_factor <= 0): tokens are sorted by expert and run through grouped matmuls."""
MOE_DOC_TAIL = """
    Returns (y [B, S, dim], auxiliary loss []): aux_weight x the Switch load-balancing loss plus
    z_weight x the router z-loss (ST-MoE).
"""
MOE_ROUTING = '''    experts = logits.shape[-1]
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)  # [B, S, experts]
    weights, chosen = jax.lax.top_k(probs, top_k)  # [B, S, top_k]
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    routed = jax.nn.one_hot(chosen, experts, dtype=jnp.float32)  # [B, S, top_k, experts]
    # Per expert: its share of the routed tokens, and its mean router probability.
    load = jnp.mean(jnp.sum(routed, axis=2), axis=(0, 1)) / top_k
    importance = jnp.mean(probs, axis=(0, 1))
    aux = aux_weight * experts * jnp.sum(load * importance)
    aux = aux + z_weight * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
'''
MOE_CALL_CAPACITY = "y = _moe_with_capacity(x, weights, routed, w_gate, w_up, w_down, capacity_factor)"
MOE_CALL_DROPLESS = "y = _moe_dropless(x, weights, chosen, w_gate, w_up, w_down)"
MOE_CAPACITY = '''def _moe_with_capacity(x, weights, routed, w_gate, w_up, w_down, capacity_factor):
    """Dispatch to [B, experts, capacity] slots with one-hot einsums, run experts, combine."""
    batch, seq, top_k, experts = routed.shape
    capacity = max(1, math.ceil(top_k * seq * capacity_factor / experts))
    # Each choice's place in its expert's queue: all first choices, then all second choices, ...
    queue = routed.swapaxes(1, 2).reshape(batch, top_k * seq, experts)  # [B, top_k * S, experts]
    position = ((jnp.cumsum(queue, axis=1) - 1) * queue).astype(jnp.int32)
    kept = queue * (position < capacity)  # choices that found a slot
    slots = jax.nn.one_hot(position, capacity, dtype=x.dtype) * kept[..., None].astype(x.dtype)
    slots = slots.reshape(batch, top_k, seq, experts, capacity)
    dispatch = jnp.sum(slots, axis=1)  # [B, S, experts, capacity], 0 or 1
    combine = jnp.einsum("bksec,bsk->bsec", slots, weights.astype(x.dtype))
    xe = jnp.einsum("bsd,bsec->becd", x, dispatch)  # [B, experts, capacity, dim]
    h = jax.nn.silu(jnp.einsum("becd,edh->bech", xe, w_gate)) * jnp.einsum("becd,edh->bech", xe, w_up)
    ye = jnp.einsum("bech,ehd->becd", h, w_down)  # [B, experts, capacity, dim]
    return jnp.einsum("becd,bsec->bsd", ye, combine)'''
MOE_DROPLESS = '''def _moe_dropless(x, weights, chosen, w_gate, w_up, w_down):
    """Sort the (token, choice) pairs by expert and run grouped matmuls: no token is dropped."""
    batch, seq, dim = x.shape
    top_k, experts = chosen.shape[-1], w_gate.shape[0]
    flat = chosen.reshape(-1)  # [B * S * top_k]
    order = jnp.argsort(flat, stable=True)
    tokens = jnp.repeat(x.reshape(-1, dim), top_k, axis=0)[order]  # grouped by expert
    sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)  # tokens per expert
    gate = jax.lax.ragged_dot(tokens, w_gate, sizes)
    h = jax.nn.silu(gate) * jax.lax.ragged_dot(tokens, w_up, sizes)
    out = jax.lax.ragged_dot(h, w_down, sizes)  # [B * S * top_k, dim], sorted
    out = jnp.zeros_like(out).at[order].set(out).reshape(batch, seq, top_k, dim)
    return jnp.einsum("bskd,bsk->bsd", out, weights.astype(x.dtype))'''

HELPERS: dict[str, Helper] = {
    "apply_rope": Helper(APPLY_ROPE),
    "dropout": Helper(DROPOUT),
    "fp8_einsum": Helper(quant.FP8_EINSUM, ("import functools", "import jax", "import jax.numpy as jnp")),
    "int8_einsum": Helper(quant.INT8_EINSUM, ("import functools", "import jax", "import jax.numpy as jnp")),
    "splash_attention": Helper(kernels.SPLASH_ATTENTION, ("import functools", "import math", "import jax",
                                                          "import jax.numpy as jnp",
                                                          "from jax.sharding import PartitionSpec as P",
                                                          *kernels.IMPORTS)),
}


def select(used: set[str]) -> tuple[list[str], set[str]]:
    """(sources, import lines) of the helpers in `used`, in a fixed order; MoE as one router."""
    sources, imports = [], set()
    for name, helper in HELPERS.items():
        if name in used:
            sources.append(helper.code)
            imports.update(helper.imports)
    capacity, dropless = "moe_capacity" in used, "moe_dropless" in used
    if capacity or dropless:
        sources.append(_moe_router(capacity, dropless))
        sources += [MOE_CAPACITY] * capacity + [MOE_DROPLESS] * dropless
        imports.update(("import jax", "import jax.numpy as jnp") + ("import math",) * capacity)
    return sources, imports
