"""Mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), auxiliary losses.

FLOPs: top_k x 2 x (elements of one expert's three matrices): only routed experts work;
capacity padding is not counted (MaxText).
"""

from __future__ import annotations

import math

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Flops, Primitive, Signature, Static, StaticKind
from axdsl.primitives.reductions import ir_fmt

OPTIONS = ("top_k", "capacity_factor", "normalize", "aux_weight", "z_weight")


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
        paths = ("moe_capacity", "moe_dropless")
    else:
        paths = ("moe_capacity",) if cf.value > 0 else ("moe_dropless",)
    for helper in paths:
        ctx.use_helper(helper)
    names = OPTIONS if "moe_capacity" in paths else tuple(k for k in OPTIONS if k != "capacity_factor")
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


PRIMITIVES = (
    Primitive("moe", Signature(
        ("x", "logits", "w_gate", "w_up", "w_down"),
        (Static("top_k", StaticKind.INT, 2), Static("capacity_factor", StaticKind.FLOAT, 1.25),
         Static("normalize", StaticKind.BOOL, True), Static("aux_weight", StaticKind.FLOAT, 0.01),
         Static("z_weight", StaticKind.FLOAT, 0.001)),
        doc="mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), aux losses"),
        emit=_emit, shape=_shape, flops=_flops, memory=_memory, unused_params=_unused_params,
        aux_loss=True),
)
