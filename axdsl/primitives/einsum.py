"""`einsum("B S dim, dim mlp -> B S mlp", x, w)`: a contraction over named dims.

The spec names every dim of every operand; names resolve to hyperparameters (sized dims) or to
the forward's free dims (B, S). FLOPs, when an operand is a parameter: 2 x the product of the
sizes of every named dim other than B and S.
"""

from __future__ import annotations

import math

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Flops, Primitive, Signature, Static, StaticKind
from axdsl.primitives.reductions import ir_fmt
from axdsl.syntax import ast

TOKEN_DIMS = ("B", "S")  # free dims of activations by convention (see annotate_sharding)


def _lower(ctx, call: ast.Call) -> ir.Prim:
    if not call.args or not isinstance(call.args[0], ast.Str):
        ctx.fail(call.span, "`einsum` takes a spec string first", 'write einsum("B S dim, dim mlp -> B S mlp", x, w)')
    text = call.args[0].value
    if "->" not in text:
        ctx.fail(call.args[0].span, "an einsum spec needs `->`", 'e.g. "B S dim, dim mlp -> B S mlp"')
    lhs, rhs = text.split("->", 1)
    operands = tuple(tuple(part.split()) for part in lhs.split(","))
    out = tuple(rhs.split())
    tensors = tuple(ctx.expr(a) for a in call.args[1:])
    if len(operands) != len(tensors):
        ctx.fail(call.span, f"einsum spec names {len(operands)} operand(s) but {len(tensors)} were given")
    names = {n for op in operands for n in op} | set(out)
    dims = tuple((n, ctx.dim_by_name(n, call.args[0].span)) for n in sorted(names))
    for n in out:
        if not any(n in op for op in operands):
            ctx.fail(call.args[0].span, f"einsum output dim `{n}` appears in no operand")
    return ir.Prim("einsum", tensors, (("spec", ir.EinsumSpec(operands, out, dims)),), call.span)


def _shape(ctx, prim: ir.Prim, args):
    spec: ir.EinsumSpec = prim.attr("spec")
    named = dict(spec.dims)
    for names, a in zip(spec.operands, args):
        if not isinstance(a.type, ir.TensorType):
            ctx.fail(a.span, "einsum operands must be tensors")
        actual = a.type.dims
        if len(names) != len(actual):
            ctx.fail(a.span, f"einsum operand is {ir_fmt(actual)} but the spec names {len(names)} dims: "
                     f"{' '.join(names)}")
        for n, d in zip(names, actual):
            want = named[n]
            if want.is_free and d.is_free:
                continue
            if not want.same(d) and not (want.is_free and d.size is not None):
                ctx.fail(a.span, f"einsum dim `{n}` is {want} but the operand has `{d}` there")
    actual_by_name = {}  # free names in the output take the operand's actual dim
    for names, a in zip(spec.operands, args):
        actual_by_name.update(zip(names, a.type.dims))
    return tuple(actual_by_name[n] for n in spec.out)


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    return f"jnp.einsum({ctx.py_str(ctx.einsum_spec(prim))}, {', '.join(args)})"


def _flops(ctx, prim: ir.Prim) -> Flops:
    if not any(ctx.param_at(a) is not None for a in prim.args):
        return Flops()
    sizes: dict[str, int] = {}
    for names, a in zip(prim.attr("spec").operands, prim.args):
        for n, d in zip(names, a.type.dims):
            if n not in TOKEN_DIMS and d.size is not None:
                sizes[n] = d.size
    return Flops(matmul=2 * math.prod(sizes.values()))


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """Keeps every operand; a dot (for save_dots) when it has no batch dims and a weight operand."""
    spec: ir.EinsumSpec = prim.attr("spec")
    batch_dims = set()
    if len(spec.operands) > 1:
        batch_dims = set.intersection(*(set(o) for o in spec.operands)) & set(spec.out)
    out = t.new(dims, t.promote(*args), label, args, dot=not batch_dims and any(not a.activation for a in args))
    for a in args:
        t.save(a)
    return out


PRIMITIVES = (
    Primitive("einsum", Signature((), (Static("spec", StaticKind.EINSUM),), doc='einsum("B S dim, dim mlp -> B S mlp", x, w) over named dims'),
              emit=_emit, shape=_shape, flops=_flops, lower=_lower, scalar_operands=True, contraction=True,
              memory=_memory),
)
