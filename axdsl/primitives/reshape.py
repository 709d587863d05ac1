"""Reshapes of named dims: split one dim into several, merge two adjacent dims into one.

    split(x, dim, [heads, head_dim])     [B, S, dim=64] -> [B, S, heads=4, head_dim=16]
    merge(x, heads, head_dim)            [B, S, heads=4, head_dim=16] -> [B, S, heads*head_dim=64]

Sizes are static, so the products are checked at build time. Both are views of one buffer.
"""

from __future__ import annotations

import math

from axdsl.ir import nodes as ir
from axdsl.ir.expr import BinOp, Binary
from axdsl.primitives.base import Primitive, Signature, Static, StaticKind, view_memory
from axdsl.primitives.reductions import axis_of, checked_axis, ir_fmt
from axdsl.primitives.slicing import operand, part


def _sized(ctx, prim: ir.Prim, dims) -> None:
    for d in dims:
        if d.size is None:
            ctx.fail(
                prim.span,
                f"`{prim.name}` needs dims of known size, got `{d}`",
                "free dims such as B and S have no static size",
            )


def reshape_code(x: str, ndim_after: int, middle: list[str], removed: int) -> str:
    """`x.reshape(*x.shape[:-k], a, b, *x.shape[-j:])`: `removed` dims ending `ndim_after` dims from
    the end are replaced by `middle` (sizes as code); dims before and after are kept."""
    start = ndim_after + removed
    parts = [f"*{x}.shape[:-{start}]", *middle]
    if ndim_after:
        parts.append(f"*{x}.shape[-{ndim_after}:]")
    return f"{x}.reshape({', '.join(parts)})"


# ---------------------------------------------------------------- split
def _split_shape(ctx, prim, args):
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("over"))
    into = prim.attr("into")
    _sized(ctx, prim, (dims[i], *into))
    product = math.prod(d.size for d in into)
    if product != dims[i].size:
        sizes = " * ".join(str(d.size) for d in into)
        ctx.fail(
            prim.span,
            f"cannot split `{dims[i]}` into {ir_fmt(into)}: "
            f"{sizes} = {product}, not {dims[i].size}",
            "the sizes of the new dims must multiply to the size of the dim they split",
        )
    return dims[:i] + tuple(into) + dims[i + 1 :]


def _emit_split(ctx, prim, args, precs) -> str:
    dims = prim.args[0].type.dims
    after = len(dims) - 1 - checked_axis(dims, prim.attr("over"))
    return reshape_code(
        operand(ctx, prim, args[0]), after, [ctx.dim_code(d) for d in prim.attr("into")], 1
    )


# ---------------------------------------------------------------- merge
def _merge_shape(ctx, prim, args):
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("first"))
    j = axis_of(ctx, prim, dims, prim.attr("second"))
    if j != i + 1:
        ctx.fail(
            prim.span,
            f"`merge` needs adjacent dims, `{dims[i]}` then `{dims[j]}`, in {ir_fmt(dims)}",
            "move them next to each other first (einsum or transpose)",
        )
    a, b = dims[i], dims[j]
    _sized(ctx, prim, (a, b))
    size = Binary(BinOp.MUL, a.size_expr, b.size_expr)
    merged = ir.Dim(f"{part(a.name)}*{part(b.name)}", a.size * b.size, size)
    return dims[:i] + (merged,) + dims[j + 1 :]


def _emit_merge(ctx, prim, args, precs) -> str:
    dims = prim.args[0].type.dims
    after = len(dims) - 2 - checked_axis(dims, prim.attr("first"))
    return reshape_code(operand(ctx, prim, args[0]), after, ["-1"], 2)


PRIMITIVES = (
    Primitive(
        "split",
        Signature(
            ("x",),
            (Static("over", StaticKind.DIM), Static("into", StaticKind.DIMS)),
            doc="split the named dim `over` into the dims `into` (sizes multiply to it)",
        ),
        emit=_emit_split,
        shape=_split_shape,
        memory=view_memory,
    ),
    Primitive(
        "merge",
        Signature(
            ("x",),
            (Static("first", StaticKind.DIM), Static("second", StaticKind.DIM)),
            doc="merge two adjacent named dims into one (their product)",
        ),
        emit=_emit_merge,
        shape=_merge_shape,
        memory=view_memory,
    ),
)
