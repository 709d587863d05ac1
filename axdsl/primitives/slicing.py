"""Primitives that cut and join tensors along a named dim: slice, concat, stack, pad.

Every bound is static (a hyperparameter expression), so each result dim has a known size and
shapes stay checked at build time:

    slice(q, head_dim, 0, rotary_dim)     [B, S, heads, head_dim=64] -> [B, S, heads, rotary_dim=32]
    concat(rot, rest, over = head_dim)    [..., 32] and [..., 32]     -> [..., head_dim=64]
    pad(x, dim, 0, 2)                     [B, S, dim=8]               -> [B, S, dim+2=10]
    stack(a, b)                           [B, S] and [B, S]           -> [B, S, 2]
"""

from __future__ import annotations

import re

from axdsl.errors import InternalError
from axdsl.ir import nodes as ir
from axdsl.ir.expr import BinOp, Binary, Const, Expr, field_of
from axdsl.primitives.base import Primitive, Signature, Static, StaticKind, linear_memory
from axdsl.primitives.reductions import axis_index, axis_of, checked_axis, ir_fmt


def label(v: ir.HValue) -> str:
    """A static size's name in a dim: its hyperparameter (`rotary_dim`) or its number (`8`)."""
    return field_of(v.expr) or str(v.value)


def size_of(v: ir.HValue) -> Expr:
    """A static size's expression (one written in the spec always has one)."""
    return v.expr if v.expr is not None else Const(v.value)


def part(name: str) -> str:
    """A dim name inside a compound one: `head_dim`, or `(heads*head_dim)` when it has operators."""
    return name if re.fullmatch(r"\w+", name) else f"({name})"


def index_at(axis: int, item: str) -> str:
    """`[..., item]` at negative `axis`, the dims after it taken whole: `[..., :8, :]`."""
    return "[..., " + ", ".join([item] + [":"] * (-axis - 1)) + "]"


def operand(ctx, prim: ir.Prim, code: str) -> str:
    """The operand as a name, for code that reads its `.shape` or `.ndim` besides using it: an
    expression is computed once into a local first (`merge_in = y * 2.0`)."""
    if re.fullmatch(r"[\w.]+(\[[^\[\]]*\])*", code):
        return code
    name = ctx.fresh(f"{prim.name}_in")
    ctx.line(f"{name} = {code}  # {ctx.shape_comment(prim.args[0].type)}")
    return name


def _sized(ctx, prim: ir.Prim, d: ir.Dim) -> None:
    if d.size is None:
        ctx.fail(
            prim.span,
            f"`{prim.name}` needs a dim of known size, got `{d}`",
            "free dims such as B and S have no static size; cut and join sized dims",
        )


def _neg(dims: tuple[ir.Dim, ...], i: int) -> int:
    return i - len(dims)


# ---------------------------------------------------------------- slice
def _slice_shape(ctx, prim, args):
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("over"))
    d = dims[i]
    _sized(ctx, prim, d)
    start, stop = prim.attr("start"), prim.attr("stop")
    if not 0 <= start.value < stop.value <= d.size:
        ctx.fail(
            prim.span,
            f"`slice` of `{d}` from {start.value} to {stop.value} is out of range",
            f"need 0 <= start < stop <= {d.size}",
        )
    # Named as the expression a forward would write for its size (`rotary_dim`,
    # `head_dim - rotary_dim`), so a later `over` can name it.
    end = part(d.name) if stop.value == d.size else label(stop)
    if start.value == 0:
        out = ir.Dim(end, stop.value, stop.expr)
    else:
        size = Binary(BinOp.SUB, size_of(stop), size_of(start))
        out = ir.Dim(f"{end}-{label(start)}", stop.value - start.value, size)
    return dims[:i] + (out,) + dims[i + 1 :]


def _emit_slice(ctx, prim, args, precs) -> str:
    dims = prim.args[0].type.dims
    axis = _neg(dims, checked_axis(dims, prim.attr("over")))
    start, stop = prim.attr("start"), prim.attr("stop")
    begin = "" if start.value == 0 else ctx.code(start)
    end = "" if stop.value == dims[axis].size else ctx.code(stop)
    return ctx.paren(args[0], precs[0], ctx.ATOM) + index_at(axis, f"{begin}:{end}")


# ---------------------------------------------------------------- concat
def join_axis(
    a: tuple[ir.Dim, ...], b: tuple[ir.Dim, ...], over: ir.Dim
) -> tuple[int, ir.Dim] | str:
    """The axis `concat` joins along and the dim it becomes, or why there is none.

    `over` is a dim of `a` (by name, then size): the result joins their sizes (`rot+rest`). Or it
    is the result dim itself (`over = head_dim`): the one axis where the sizes add up to it."""
    i = axis_index(a, over)
    if i is not None:
        da, db = a[i], b[i]
        if da.size is None or db.size is None:
            return f"`concat` needs a dim of known size, got `{da}` and `{db}`"
        size = Binary(BinOp.ADD, da.size_expr, db.size_expr)
        return i, ir.Dim(f"{part(da.name)}+{part(db.name)}", da.size + db.size, size)
    hits = [
        j
        for j, (x, y) in enumerate(zip(a, b, strict=True))
        if x.size is not None
        and y.size is not None
        and over.size is not None
        and x.size + y.size == over.size
    ]
    if len(hits) != 1:
        what = (
            "several dims add up to it"
            if hits
            else "no dim of the first operand matches it and no two add up to it"
        )
        return f"`concat` over `{over}`: {what} in {ir_fmt(a)} and {ir_fmt(b)}"
    return hits[0], over


def _concat_shape(ctx, prim, args):
    a, b = args[0].type.dims, args[1].type.dims
    if len(a) != len(b) or any(d.is_ellipsis for d in a) != any(d.is_ellipsis for d in b):
        ctx.fail(prim.span, f"`concat` needs operands of one rank, got {ir_fmt(a)} and {ir_fmt(b)}")
    joined = join_axis(a, b, prim.attr("over"))
    if isinstance(joined, str):
        ctx.fail(
            prim.span,
            joined,
            "name a dim of the first operand, or the joined dim whose size is the sum",
        )
    i, out = joined
    for j, (x, y) in enumerate(zip(a, b, strict=True)):
        if j != i and not x.same(y):
            ctx.fail(
                prim.span,
                f"`concat` over `{prim.attr('over')}`: the operands differ in another dim, "
                f"`{x}` and `{y}`",
                f"operands are {ir_fmt(a)} and {ir_fmt(b)}; only the joined dim may differ",
            )
    return a[:i] + (out,) + a[i + 1 :]


def _emit_concat(ctx, prim, args, precs) -> str:
    a = prim.args[0].type.dims
    joined = join_axis(a, prim.args[1].type.dims, prim.attr("over"))
    if isinstance(joined, str):  # infer_shapes reported this as the user's error
        raise InternalError(joined)
    i, _ = joined
    return f"jnp.concatenate([{args[0]}, {args[1]}], axis={_neg(a, i)})"


def _join_memory(t, prim, args, dims, label: str):
    """Concatenating or stacking copies its operands and keeps none of them."""
    return t.new(dims, t.promote(*args), label, tuple(args))


# ---------------------------------------------------------------- stack
_TWO = ir.Dim("2", 2, Const(2))


def _stack_shape(ctx, prim, args):
    a, b = args[0].type.dims, args[1].type.dims
    if len(a) != len(b) or not all(x.same(y) for x, y in zip(a, b, strict=True)):
        ctx.fail(prim.span, f"`stack` needs operands of one shape, got {ir_fmt(a)} and {ir_fmt(b)}")
    return a + (_TWO,)


# ---------------------------------------------------------------- pad
def _pad_shape(ctx, prim, args):
    dims = args[0].type.dims
    i = axis_of(ctx, prim, dims, prim.attr("over"))
    d = dims[i]
    _sized(ctx, prim, d)
    before, after = prim.attr("before"), prim.attr("after")
    if before.value < 0 or after.value < 0:
        ctx.fail(
            prim.span,
            f"`pad` needs before >= 0 and after >= 0, got {before.value} and {after.value}",
            "cut with `slice` instead",
        )
    extra = [v for v in (before, after) if v.value]
    name = part(d.name) + (
        f"+{label(extra[0])}"
        if len(extra) == 1
        else f"+{before.value + after.value}" if extra else ""
    )
    size = d.size_expr
    for v in extra:
        size = Binary(BinOp.ADD, size, size_of(v))
    return dims[:i] + (ir.Dim(name, d.size + before.value + after.value, size),) + dims[i + 1 :]


def _emit_pad(ctx, prim, args, precs) -> str:
    dims = prim.args[0].type.dims
    axis = _neg(dims, checked_axis(dims, prim.attr("over")))
    width = f"({ctx.code(prim.attr('before'))}, {ctx.code(prim.attr('after'))})"
    value = ctx.code(prim.attr("value"))
    x = args[0]
    if any(d.is_ellipsis for d in dims):
        x = operand(ctx, prim, x)
        widths = (
            f"[(0, 0)] * ({x}.ndim - {-axis}) + [{', '.join([width] + ['(0, 0)'] * (-axis - 1))}]"
        )
    else:
        widths = (
            "["
            + ", ".join(width if j - len(dims) == axis else "(0, 0)" for j in range(len(dims)))
            + "]"
        )
    return f"jnp.pad({x}, {widths}, constant_values={value})"


PRIMITIVES = (
    Primitive(
        "slice",
        Signature(
            ("x",),
            (
                Static("over", StaticKind.DIM),
                Static("start", StaticKind.INT),
                Static("stop", StaticKind.INT),
            ),
            doc="x[start:stop] along the named dim `over` (static bounds)",
        ),
        emit=_emit_slice,
        shape=_slice_shape,
        memory=linear_memory,
    ),
    Primitive(
        "concat",
        Signature(
            ("a", "b"),
            (Static("over", StaticKind.DIM),),
            doc="join a and b along `over` (a dim of a, or the joined dim); other dims must match",
        ),
        emit=_emit_concat,
        shape=_concat_shape,
        memory=_join_memory,
    ),
    Primitive(
        "stack",
        Signature(("a", "b"), doc="a and b of one shape stacked on a new last dim of size 2"),
        emit=lambda ctx, prim, a, p: f"jnp.stack([{a[0]}, {a[1]}], axis=-1)",
        shape=_stack_shape,
        memory=_join_memory,
    ),
    Primitive(
        "pad",
        Signature(
            ("x",),
            (
                Static("over", StaticKind.DIM),
                Static("before", StaticKind.INT),
                Static("after", StaticKind.INT),
                Static("value", StaticKind.FLOAT, 0.0),
            ),
            doc="pad the named dim `over` with `before` and `after` entries of `value`",
        ),
        emit=_emit_pad,
        shape=_pad_shape,
        memory=linear_memory,
    ),
)
