"""Primitives that move dims around: head splitting and merging, transpose, prefix, embedding."""

from __future__ import annotations

from axdsl.ir.expr import BinOp, Binary, field_of, spec_text
from axdsl.ir.nodes import Dim
from axdsl.syntax.ast import at_least
from axdsl.primitives.base import (
    Decoding,
    Primitive,
    Signature,
    Static,
    StaticKind,
    linear_memory,
    view_memory,
)
from axdsl.primitives.reductions import ir_fmt


def _split_heads_shape(ctx, prim, args):
    dims = args[0].type.dims
    heads = prim.attr("heads")
    last = dims[-1]
    if last.size is None:
        ctx.fail(prim.span, f"`split_heads` needs a known last dim, got `{last}`")
    if last.size % heads.value:
        ctx.fail(
            prim.span,
            f"cannot split `{last}` into {heads.value} heads: {heads.value} does not divide "
            f"{last.size}",
            "heads must divide the projected dim",
        )
    per = last.size // heads.value
    return dims[:-1] + (
        Dim(field_of(heads.expr) or spec_text(heads.expr), heads.value, heads.expr),
        Dim(f"{last.name}/heads", per, Binary(BinOp.FLOORDIV, last.size_expr, heads.expr)),
    )


def _merge_heads_shape(ctx, prim, args):
    dims = args[0].type.dims
    if len(dims) < 2 or dims[-1].size is None or dims[-2].size is None:
        ctx.fail(prim.span, f"`merge_heads` needs [..., heads, head_dim], got {ir_fmt(dims)}")
    h, d = dims[-2], dims[-1]
    size = Binary(BinOp.MUL, h.size_expr, d.size_expr)
    return dims[:-2] + (Dim(f"{h.name}*{d.name}", h.size * d.size, size),)


def _transpose_shape(ctx, prim, args):
    dims = args[0].type.dims
    if len(dims) < 2:
        ctx.fail(prim.span, "`transpose` needs at least 2 dims")
    return dims[:-2] + (dims[-1], dims[-2])


def _prefix_shape(ctx, prim, args):
    return (prim.attr("n"),) + args[0].type.dims[1:]


def _embed_shape(ctx, prim, args):
    table, ids = args[0].type.dims, args[1].type.dims
    if len(table) != 2:
        ctx.fail(prim.span, f"`embed` needs a [vocab, dim] table, got {ir_fmt(table)}")
    return ids + (table[1],)


def _prefix_memory(t, prim, args, dims, label: str):
    """A slice of a parameter is a parameter (a learned position table); else linear."""
    if args[0].is_param:
        return t.param_like(dims, args[0], label)
    return linear_memory(t, prim, args, dims, label)


def _embed_memory(t, prim, args, dims, label: str):
    """A table lookup: depends on the ids, keeps nothing."""
    return t.new(dims, args[0].dtype, label, (args[1],))


def _emit_prefix(ctx, prim, args, precs) -> str:
    """x[:n]; in the decode path, a prefix of the sequence's length is the rows of the new tokens'
    positions (a learned position table read from the cache position on)."""
    n = prim.attr("n")
    if ctx.decoding and ctx.is_sequence(n):
        return f"jax.lax.dynamic_slice_in_dim({args[0]}, {ctx.decode_pos}, {ctx.dim_code(n)})"
    return f"{args[0]}[: {ctx.dim_code(n)}]"


def _transpose_decode(prim) -> str | None:
    """A transpose that moves the sequence dim mixes positions; of a parameter (a tied embedding
    table) it does not."""
    dims = prim.args[0].type.dims
    return (
        None if all(not d.is_free for d in dims[-2:]) else "`transpose` of a sequence-shaped tensor"
    )


PRIMITIVES = (
    Primitive(
        "split_heads",
        Signature(
            ("x",),
            (Static("heads", StaticKind.INT, bounds=at_least(1)),),
            doc="[..., h*d] -> [..., h, d]",
        ),
        emit=lambda ctx, prim, a, p: (
            f"{a[0]}.reshape(*{a[0]}.shape[:-1], {ctx.code(prim.attr('heads'))}, -1)"
        ),
        shape=_split_heads_shape,
        memory=view_memory,
    ),
    Primitive(
        "merge_heads",
        Signature(("x",), doc="[..., h, d] -> [..., h*d]"),
        emit=lambda ctx, prim, a, p: f"{a[0]}.reshape(*{a[0]}.shape[:-2], -1)",
        shape=_merge_heads_shape,
        memory=view_memory,
    ),
    Primitive(
        "transpose",
        Signature(("x",), doc="swap the last two dims"),
        emit=lambda ctx, prim, a, p: f"jnp.swapaxes({a[0]}, -1, -2)",
        shape=_transpose_shape,
        see_through=True,
        memory=view_memory,
        decode_check=_transpose_decode,
    ),
    Primitive(
        "prefix",
        Signature(("x",), (Static("n", StaticKind.DIM),), doc="the first n rows of x"),
        emit=_emit_prefix,
        shape=_prefix_shape,
        gathers=True,
        memory=_prefix_memory,
        decoding=Decoding.POSITIONS,
    ),
    Primitive(
        "embed",
        Signature(("table", "ids"), doc="embedding lookup: table[ids]"),
        emit=lambda ctx, prim, a, p: f"jnp.take({a[0]}, {a[1]}, axis=0)",
        shape=_embed_shape,
        gathers=True,
        memory=_embed_memory,
    ),
)
