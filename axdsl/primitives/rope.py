"""Rotary position embedding on [B, S, heads, head_dim] (Llama's half-split layout)."""

from __future__ import annotations

from axdsl.primitives.base import Primitive, Signature, Static, StaticKind, linear_memory
from axdsl.primitives.reductions import ir_fmt


def _rope_shape(ctx, prim, args):
    dims = args[0].type.dims
    if len(dims) != 4 or any(d.is_ellipsis for d in dims):
        ctx.fail(prim.span, f"`rope` needs [B, S, heads, head_dim], got {ir_fmt(dims)}")
    if dims[-1].size is None or dims[-1].size % 2:
        ctx.fail(prim.span, f"`rope` needs an even head_dim, got `{dims[-1]}`")
    return dims


PRIMITIVES = (
    Primitive("rope", Signature(("x",), (Static("theta", StaticKind.FLOAT, 10000.0),),
                                doc="rotary embedding on [B, S, H, D]"),
              emit=lambda ctx, prim, a, p: f"apply_rope({a[0]}, theta={prim.attr('theta').code})",
              shape=_rope_shape, helpers=("apply_rope",), memory=linear_memory),
)
