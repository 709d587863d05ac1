"""`quantized`: a matmul with a parameter operand run in fp8 or int8, made by quantize_matmuls.

It wraps the `x @ w` or two-operand einsum it replaces (its only argument) and carries the
format; codegen emits the generated model's `fp8_einsum` or `int8_einsum` helper. Its FLOPs
are the wrapped matmul's (analyses walk into it).
"""

from __future__ import annotations

from axdsl.codegen import quant
from axdsl.ir import nodes as ir
from axdsl.primitives.base import Primitive, Signature, Static, StaticKind


def wrap(e: ir.TExpr, fmt: ir.QuantFormat) -> ir.Prim:
    """The quantized form of the matmul `e`."""
    return ir.Prim("quantized", (e,), (("format", fmt),), e.span, e.type)


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    inner = prim.args[0]
    if isinstance(inner, ir.Bin):
        left, right = ctx.expr(inner.left)[0], ctx.expr(inner.right)[0]
        spec = ctx.matmul_spec(inner.left.type.dims, inner.right.type.dims)
    else:
        left, right = (ctx.expr(a)[0] for a in inner.args)
        spec = ctx.einsum_spec(inner)
    fmt = prim.attr("format")
    if quant.helper_can_run(spec):
        ctx.use_helper(f"{fmt}_einsum")
        ctx.quant_comment(fmt)
    return quant.emit_quantized(fmt, spec, left, right)


def operands(prim: ir.Prim) -> tuple[ir.TExpr, ...]:
    """The wrapped matmul's operands: what the memory tracer evaluates in place of `prim.args`."""
    inner = prim.args[0]
    return (inner.left, inner.right) if isinstance(inner, ir.Bin) else inner.args


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """A custom VJP: keeps both operands in one byte each (the weight gathered). `args` are the
    wrapped matmul's operands (see `operands`)."""
    fmt, where = prim.attr("format"), label.rsplit(": ", 1)[0]
    out = t.new(dims, t.promote(*args), f"{where}: {fmt} matmul", args, dot=True)
    for v in args:
        b = v.base
        if b.is_literal:
            continue
        t.save(t.internal(b.dims, "i8", f"{where}: {b.label} in {fmt}", (b,), weight=b.is_param))
    return out


PRIMITIVES = (
    Primitive("quantized", Signature(("matmul",), (Static("format", StaticKind.FORMAT),),
                                     doc="a matmul in fp8 or int8 (made by quantize_matmuls)"),
              emit=_emit, see_through=True, internal=True, emits_operands=False, memory=_memory,
              operands=operands),
)
