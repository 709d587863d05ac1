"""Mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), auxiliary losses.

FLOPs: top_k x 2 x (elements of one expert's three matrices): only routed experts work;
capacity padding is not counted (MaxText).

Generated code: `y, aux = moe_swiglu(...)`, a helper copied into the model with only the dispatch
paths the spec uses (`moe_swiglu.capacity`, `moe_swiglu.dropless`); its source is below.
"""

from __future__ import annotations

import math

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Flops, Helper, HelperSection, Primitive, Signature, Static, StaticKind
from axdsl.primitives.reductions import ir_fmt

OPTIONS = ("top_k", "capacity_factor", "normalize", "aux_weight", "z_weight")
ROUTER = "moe_swiglu"  # helpers: the router, and the two dispatch paths it may call
CAPACITY, DROPLESS = f"{ROUTER}.capacity", f"{ROUTER}.dropless"


def _shape(ctx, prim: ir.Prim, args):
    x, logits, w_gate, w_up, w_down = (a.type.dims for a in args)
    if len(x) != 3 or any(d.is_ellipsis for d in x):
        ctx.fail(prim.span, f"`moe` needs x as [B, S, dim], got {ir_fmt(x)}")
    if len(logits) != 3 or not logits[0].same(x[0]) or not logits[1].same(x[1]):
        ctx.fail(prim.span, f"`moe` needs router logits as [B, S, experts] for x {ir_fmt(x)}, got {ir_fmt(logits)}")
    experts = logits[2]
    for name, w, want in (("w_gate", w_gate, (experts, x[2], None)), ("w_up", w_up, (experts, x[2], None)),
                          ("w_down", w_down, (experts, None, x[2]))):
        if len(w) != 3 or not all(d is None or d.same(g) for d, g in zip(want, w)):
            shape = ", ".join("hidden" if d is None else str(d) for d in want)
            ctx.fail(prim.span, f"`moe` needs {name} as [{shape}], got {ir_fmt(w)}")
    if not w_gate[2].same(w_up[2]) or not w_gate[2].same(w_down[1]):
        ctx.fail(prim.span, f"`moe` expert hidden dims differ: {w_gate[2]}, {w_up[2]}, {w_down[1]}")
    k = prim.attr("top_k")
    if not 1 <= k.value <= (experts.size or k.value):
        ctx.fail(prim.span, f"`moe` top_k = {k.value} must be between 1 and the {experts.size} experts")
    return x


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    """`y, aux = moe_swiglu(...)` as its own statement; aux joins this layer's auxiliary loss.

    The generated helper holds only the routing the spec uses: a capacity written in the spec
    picks the capacity or the dropless path; one read from Config keeps both."""
    out, aux = ctx.fresh("moe_y"), ctx.fresh("moe_aux")
    ctx.add_aux(aux)
    cf = prim.attr("capacity_factor")
    if "cfg." in cf.code:  # a Config value decides at run time: both paths
        paths = (CAPACITY, DROPLESS)
    else:
        paths = (CAPACITY,) if cf.value > 0 else (DROPLESS,)
    for helper in (ROUTER, *paths):
        ctx.use_helper(helper)
    names = OPTIONS if CAPACITY in paths else tuple(k for k in OPTIONS if k != "capacity_factor")
    kwargs = ", ".join(f"{k}={prim.attr(k).code}" for k in names)
    ctx.line(f"{out}, {aux} = moe_swiglu({', '.join(args)}, {kwargs})  # {ctx.shape_comment(prim.type)}, []")
    return out


def _flops(ctx, prim: ir.Prim) -> Flops:
    total = 0
    for w in prim.args[2:5]:
        p = ctx.param_at(w)
        if p is not None:
            total += math.prod(d.size for d in p.dims) // p.dims[0].size  # one expert
    return Flops(matmul=2 * prim.attr("top_k").value * total)


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """The generated `moe_swiglu`: router softmax, then either one-hot dispatch to [B, experts,
    capacity] slots (capacity_factor > 0) or tokens sorted by expert and grouped matmuls
    (dropless); each expert runs a SwiGLU on its tokens. Expert matmuls are batched over experts,
    so save_dots keeps none of them."""
    x, logits, w_gate = args[0], args[1], args[2]
    top_k = int(t.static(prim.attr("top_k"), 1))
    cf = float(t.static(prim.attr("capacity_factor"), 0.0))
    experts, hidden, model_dim = w_gate.dims[0], w_gate.dims[-1], x.dims[-1]
    b, s = x.dims[0], x.dims[1]
    out = t.new(dims, x.dtype, label, tuple(args))
    t.save(t.internal((b, s, experts), "f32", f"{label} router softmax", (logits,)))
    k = ir.Dim("top_k", top_k)
    if cf > 0:
        cap = ir.Dim("capacity", max(1, math.ceil(top_k * t.seq * cf / experts.size)))
        slot = (b, experts, cap)
        for what, d in (("slots", (b, k, s, experts, cap)), ("dispatch", (b, s, experts, cap)),
                        ("combine", (b, s, experts, cap))):
            t.save(t.internal(d, x.dtype, f"{label} {what}", (logits,)))
    else:
        slot = (b, s, k)
    inner = [("expert inputs", model_dim), ("gate", hidden), ("silu residual", hidden),
             ("silu residual", hidden), ("up", hidden), ("hidden", hidden), ("expert outputs", model_dim)]
    for what, d in inner:
        t.save(t.internal(slot + (d,), x.dtype, f"{label} {what}", (x, logits)))
    return out


def _unused_params(ctx, prim: ir.Prim) -> int:
    """Expert weights a token does not use: (experts - top_k) / experts of them."""
    experts = prim.args[1].type.dims[-1].size
    k = prim.attr("top_k").value
    weights = (ctx.param_at(a) for a in prim.args[2:])
    elems = sum(math.prod(d.size for d in p.dims) for p in weights if p is not None)
    return elems * (experts - k) // experts


# ---------------------------------------------------------------------------- generated code
def _moe_swiglu(used: frozenset[str]) -> str:
    """moe_swiglu with only the dispatch paths in use (both, and the branch, when a Config decides)."""
    capacity, dropless = CAPACITY in used, DROPLESS in used
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


_JAX = ("import jax", "import jax.numpy as jnp")
_HELPERS = (Helper(ROUTER, _moe_swiglu, _JAX, HelperSection.LAYER),
            Helper(CAPACITY, MOE_CAPACITY, _JAX + ("import math",), HelperSection.LAYER),
            Helper(DROPLESS, MOE_DROPLESS, _JAX, HelperSection.LAYER))


PRIMITIVES = (
    Primitive("moe", Signature(
        ("x", "logits", "w_gate", "w_up", "w_down"),
        (Static("top_k", StaticKind.INT, 2), Static("capacity_factor", StaticKind.FLOAT, 1.25),
         Static("normalize", StaticKind.BOOL, True), Static("aux_weight", StaticKind.FLOAT, 0.01),
         Static("z_weight", StaticKind.FLOAT, 0.001)),
        doc="mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), aux losses"),
        emit=_emit, shape=_shape, flops=_flops, memory=_memory, unused_params=_unused_params,
        aux_loss=True, helpers=_HELPERS),
)
