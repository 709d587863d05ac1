"""Positions, selection and running sums: iota, where, minimum, maximum, cumsum, segment_positions.

Comparisons (`a < b`, `a == b`, ...) are tensor operators of the forward (bool results, named
dims broadcast like `+`); these primitives build on them:

    pos = iota(S, trailing = 1)                      [S, 1] int32 positions 0..S-1
    causal = pos >= iota(S)                          [S, S] bool
    y = where(causal, scores, -1e9)                  [B, heads, S, S]
    y = maximum(x, 0.0)                              same as x
    c = cumsum(x, over = S)                          same as x
    p = segment_positions(segments)                  [B, S] int32: 0, 1, ... restarting at each
                                                     example

`segment_positions` is what a packed row's learned position table reads (BERT): each example of
the row starts again at position 0, as it would alone.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.primitives.base import (
    Decoding,
    Helper,
    Primitive,
    Signature,
    Static,
    StaticKind,
    linear_memory,
)
from axdsl.primitives.attention_kernels import CONTEXT_ORDER_HELPER
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ONE, axis_of, ir_fmt, negative_axis


def broadcast(shapes: list[tuple[ir.Dim, ...]]) -> tuple[ir.Dim, ...]:
    """Numpy broadcasting of named dims, aligned from the right: each pair must be the same dim
    or one of them 1. Returns the result dims, or raises ValueError naming the two dims that differ.
    """
    out: tuple[ir.Dim, ...] = shapes[0]
    for dims in shapes[1:]:
        a, b, merged = list(out), list(dims), []
        while a and b:
            x, y = a.pop(), b.pop()
            if x.is_ellipsis or y.is_ellipsis:
                if x.is_ellipsis and y.is_ellipsis and not a and not b:
                    merged.append(x)
                    break
                raise ValueError("ranks are not known")
            if x.same(y) or y.size == 1:
                merged.append(x)
            elif x.size == 1:
                merged.append(y)
            else:
                raise ValueError(f"`{x}` and `{y}` differ")
        out = tuple(a or b) + tuple(reversed(merged))
    return out


def _broadcast_shape(ctx, prim, args):
    shapes = [a.type.dims for a in args if isinstance(a.type, ir.TensorType)]
    if not shapes:
        ctx.fail(prim.span, f"`{prim.name}` needs at least one tensor operand")
    try:
        return broadcast(shapes)
    except ValueError as err:
        ctx.fail(
            prim.span,
            f"shapes do not agree for `{prim.name}`: " + " and ".join(ir_fmt(s) for s in shapes),
            f"{err}; operands must match dim by dim (from the right) or be 1",
        )


# ---------------------------------------------------------------- iota
def _iota_shape(ctx, prim, args):
    trailing = prim.attr("trailing").value
    if trailing < 0:
        ctx.fail(prim.span, f"`iota` needs trailing >= 0, got {trailing}")
    return (prim.attr("over"),) + (ONE,) * trailing


def _emit_iota(ctx, prim, args, precs) -> str:
    over = prim.attr("over")
    code = f"jnp.arange({ctx.dim_code(over)}, dtype=jnp.int32)"
    if ctx.decoding and ctx.is_sequence(
        over
    ):  # the new tokens' positions start at the cache position
        code = f"({ctx.decode_pos} + {code})"
    trailing = prim.attr("trailing").value
    return code + (f"[:, {', '.join(['None'] * trailing)}]" if trailing else "")


def _iota_memory(t, prim, args, dims, label: str):
    return t.new(dims, "i32", label, ())


def _iota_memory_of_ids(t, prim, args, dims, label: str):
    """int32 positions computed from ids: nothing to keep for a backward (there is no gradient)."""
    return t.new(dims, "i32", label, (args[0],))


# ---------------------------------------------------------------- where, minimum, maximum
def _where_memory(t, prim, args, dims, label: str):
    """Keeps its condition (the backward routes the gradient by it)."""
    out = t.new(dims, t.promote(*args[1:]), label, tuple(args))
    t.save(args[0])
    return out


def _extremum_memory(t, prim, args, dims, label: str):
    """Keeps a same-dtype tensor per tensor operand, the weight that routes the gradient to it
    (jax 0.10, measured with print_saved_residuals); a scalar operand needs none."""
    dtype = t.promote(*args)
    out = t.new(dims, dtype, label, tuple(args))
    for side, a in zip(("left", "right"), args, strict=True):
        if not a.is_literal and a.dims:
            t.save(t.internal(dims, dtype, f"{label} {side} weight", tuple(args)))
    return out


def _extremum(name: str, doc: str) -> Primitive:
    return Primitive(
        name,
        Signature(("a", "b"), doc=doc),
        emit=lambda ctx, prim, a, p: f"jnp.{name}({a[0]}, {a[1]})",
        shape=_broadcast_shape,
        scalar_operands=True,
        memory=_extremum_memory,
    )


# ---------------------------------------------------------------- cumsum
def _cumsum_shape(ctx, prim, args):
    dims = args[0].type.dims
    axis_of(ctx, prim, dims, prim.attr("over"))
    return dims


def _emit_cumsum(ctx, prim, args, precs) -> str:
    return f"jnp.cumsum({args[0]}, axis={negative_axis(prim.args[0].type.dims, prim.attr('over'))})"


# ---------------------------------------------------------------- segment_positions
SEGMENT_POSITIONS = Source("positions", ("segment_positions",))


def _segment_positions_shape(ctx, prim, args):
    dims = args[0].type.dims
    if not dims or dims[-1].is_ellipsis:
        ctx.fail(
            prim.span,
            f"`segment_positions` needs ids with a sequence as their last dim, got {ir_fmt(dims)}",
            "pass the [B, S] segment ids of a packed row",
        )
    return dims


def _segment_positions_needs(
    prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool
) -> tuple[str, ...]:
    """The helper, and context_order in a forward that runs the row in zig-zag order."""
    context = schedule.context.value if schedule is not None else None
    balanced = context is not None and bool(context.balance) and not decoding
    return ("segment_positions", CONTEXT_ORDER_HELPER.name) if balanced else ("segment_positions",)


def _emit_segment_positions(ctx, prim, args, precs) -> str:
    """In the decode path a row is one sequence whose new tokens start at the cache position:
    their positions are pos, pos + 1, ... (a packed row's restart at each segment)."""
    ctx.use_helper("segment_positions")
    if ctx.balanced:  # the row is in zig-zag order (plan_context): count runs in the original
        ctx.use_helper(CONTEXT_ORDER_HELPER.name)
        x = args[0] if args[0].isidentifier() else f"({args[0]})"
        return f"segment_positions({x}, order=context_order({x}.shape[1]))"
    if ctx.decoding or ctx.takes_pos:  # pos is 0 in the forward: one statement serves both
        return f"({ctx.decode_pos} + segment_positions({args[0]}))"
    return f"segment_positions({args[0]})"


PRIMITIVES = (
    Primitive(
        "iota",
        Signature(
            (),
            (Static("over", StaticKind.DIM), Static("trailing", StaticKind.INT, 0)),
            doc="int32 positions 0..n-1 along a dim, [over] then `trailing` dims of size 1",
        ),
        emit=_emit_iota,
        shape=_iota_shape,
        memory=_iota_memory,
        decoding=Decoding.POSITIONS,
    ),
    Primitive(
        "where",
        Signature(("cond", "a", "b"), doc="a where cond is true, else b; shapes broadcast"),
        emit=lambda ctx, prim, a, p: f"jnp.where({a[0]}, {a[1]}, {a[2]})",
        shape=_broadcast_shape,
        scalar_operands=True,
        memory=_where_memory,
    ),
    _extremum("minimum", "elementwise minimum of a and b; shapes broadcast"),
    _extremum("maximum", "elementwise maximum of a and b; shapes broadcast"),
    Primitive(
        "cumsum",
        Signature(
            ("x",),
            (Static("over", StaticKind.DIM),),
            doc="running sum along a named dim, same shape",
        ),
        emit=_emit_cumsum,
        shape=_cumsum_shape,
        memory=linear_memory,
    ),
    Primitive(
        "segment_positions",
        Signature(
            ("segments",),
            doc="int32 position of each token within its run of "
            "equal ids along the last dim (a packed example restarts at 0)",
        ),
        emit=_emit_segment_positions,
        shape=_segment_positions_shape,
        memory=_iota_memory_of_ids,
        helpers=(
            Helper(
                "segment_positions",
                SEGMENT_POSITIONS,
                ("import jax", "import jax.numpy as jnp", "import numpy as np"),
            ),
        ),
        needs=_segment_positions_needs,
        takes_positions=True,  # in zig-zag order it counts the runs in the original order
        decoding=Decoding.POSITIONS,
    ),
)
