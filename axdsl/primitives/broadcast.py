"""Broadcast a tensor along a new named dim: copies of it side by side.

    broadcast(k_pe, heads, before = rope_dim)
        [B, S, rope_dim=64] -> [B, S, heads=128, rope_dim=64]

Multi-head latent attention (DeepSeek-V2/V3) shares one rotary key across all heads; this gives
it the heads dim the attention primitive needs. The new dim's size is static; the copies are a
view in XLA (`jnp.broadcast_to`), materialized only where a consumer needs them.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Primitive, Signature, Static, StaticKind
from axdsl.primitives.reductions import axis_of, checked_axis
from axdsl.primitives.slicing import operand


def _shape(ctx, prim: ir.Prim, args) -> tuple[ir.Dim, ...]:
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("before"))
    new = prim.attr("new")
    if new.size is None:
        ctx.fail(
            prim.span,
            f"`broadcast` needs a new dim of known size, got `{new}`",
            "free dims such as B and S have no static size; broadcast along a hyperparameter dim",
        )
    return dims[:i] + (new,) + dims[i:]


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    dims = ir.tensor_type(prim.args[0]).dims
    after = len(dims) - checked_axis(dims, prim.attr("before"))  # dims from `before` to the end
    x = operand(ctx, prim, args[0])
    index = "[..., " + ", ".join(["None"] + [":"] * after) + "]"
    shape = f"(*{x}.shape[:-{after}], {ctx.dim_code(prim.attr('new'))}, *{x}.shape[-{after}:])"
    return f"jnp.broadcast_to({x}{index}, {shape})"


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """The broadcast result is a new tensor; its backward (a sum over the new dim) keeps nothing."""
    return t.new(dims, args[0].dtype, label, (args[0],))


PRIMITIVES = (
    Primitive(
        "broadcast",
        Signature(
            ("x",),
            (Static("new", StaticKind.DIM), Static("before", StaticKind.DIM)),
            doc="copies of x along a new dim `new`, inserted before the dim `before`",
        ),
        emit=_emit,
        shape=_shape,
        memory=_memory,
    ),
)
