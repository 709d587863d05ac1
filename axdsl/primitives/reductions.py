"""Reductions over a named dim (kept as size 1) and softmax."""

from __future__ import annotations

from axdsl.errors import InternalError
from axdsl.ir import nodes as ir
from axdsl.ir.expr import Const
from axdsl.primitives.base import (
    FailContext,
    Primitive,
    Saves,
    Signature,
    Static,
    StaticKind,
    linear_memory,
    saves_memory,
)

ONE = ir.Dim("1", 1, Const(1))


def axis_index(dims: tuple[ir.Dim, ...], over: ir.Dim) -> int | None:
    """The position of `over` in `dims`, by name, else by size; None when not exactly one
    matches."""
    by_name = [i for i, d in enumerate(dims) if d.name == over.name]
    if len(by_name) == 1:
        return by_name[0]
    by_size = [i for i, d in enumerate(dims) if over.size is not None and d.size == over.size]
    return by_size[0] if len(by_size) == 1 else None


def axis_of(ctx: FailContext, prim: ir.Prim, dims: tuple[ir.Dim, ...], over: ir.Dim) -> int:
    """`axis_index`, or a located error saying why the dim is ambiguous or missing."""
    i = axis_index(dims, over)
    if i is None:
        matches = any(
            d.name == over.name or (over.size is not None and d.size == over.size) for d in dims
        )
        what = "several dims match" if matches else "no dim matches"
        ctx.fail(prim.span, f"`{prim.name}` over `{over}`: {what} in {ir_fmt(dims)}")
    return i


def ir_fmt(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def negative_axis(dims: tuple[ir.Dim, ...], over: ir.Dim) -> int:
    """The axis counted from the end: valid under leading `...` dims in generated code."""
    return checked_axis(dims, over) - len(dims)


def checked_axis(dims: tuple[ir.Dim, ...], over: ir.Dim) -> int:
    """`axis_index` in a stage after infer_shapes, which already reported an ambiguous or missing
    dim as the user's error (`axis_of`): no single match here is a compiler bug."""
    i = axis_index(dims, over)
    if i is None:
        raise InternalError(f"no single dim matches `{over}` in {ir_fmt(dims)}")
    return i


def _reduce_shape(ctx, prim, args):
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("over"))
    return dims[:i] + (ONE,) + dims[i + 1 :]


def _reduction(name: str) -> Primitive:
    def emit(ctx, prim, args, precs) -> str:
        axis = negative_axis(prim.args[0].type.dims, prim.attr("over"))
        return f"jnp.{name}({args[0]}, axis={axis}, keepdims=True)"

    return Primitive(
        name,
        Signature(
            ("x",),
            (Static("over", StaticKind.DIM),),
            doc=f"{name} over a named dim, kept as size 1",
        ),
        emit=emit,
        shape=_reduce_shape,
        memory=None if name == "max" else linear_memory,
    )  # max: keeps its input


def _softmax_shape(ctx, prim, args):
    dims = args[0].type.dims
    if prim.attr("over") is not None:
        axis_of(ctx, prim, dims, prim.attr("over"))
    return dims


def _emit_softmax(ctx, prim, args, precs) -> str:
    over = prim.attr("over")
    axis = negative_axis(prim.args[0].type.dims, over) if over is not None else -1
    return f"jax.nn.softmax({args[0]}, axis={axis})"


PRIMITIVES = (
    *(_reduction(n) for n in ("sum", "mean", "max")),
    Primitive(
        "softmax",
        Signature(
            ("x",),
            (Static("over", StaticKind.DIM, None),),
            doc="softmax over a named dim (default last)",
        ),
        emit=_emit_softmax,
        shape=_softmax_shape,
        memory=saves_memory(Saves(input=False, same=1, output=True)),
    ),
)
