"""`quantized`: a matmul with a parameter operand run in fp8 or int8, made by quantize_matmuls.

It wraps the `x @ w` or two-operand einsum it replaces (its only argument) and carries the
format; it is emitted as `fp8_einsum(spec, left, right)` or `int8_einsum(spec, left, right)`, a
call to a helper copied into the generated model whose source is below. Both helpers take the
two-operand einsum spec of the matmul they replace, return its dtype, and work under jit, grad
and scan with f32 or bf16 operands. Its FLOPs are the wrapped matmul's (analyses walk into it).
"""

from __future__ import annotations

from axdsl.errors import InternalError
from axdsl.ir import nodes as ir
from axdsl.primitives.base import Helper, HelperSection, Primitive, Signature, Static, StaticKind
from axdsl.primitives.base import Source

QUANTIZED = "quantized"  # the primitive's name, for the passes that make or check its calls


def wrap(e: ir.TExpr, fmt: ir.QuantFormat) -> ir.Prim:
    """The quantized form of the matmul `e`."""
    return ir.Prim(
        QUANTIZED, (e,), (("format", fmt),), e.span, e.type, decoding=ir.Decoding.POSITIONWISE
    )


def _matmul(prim: ir.Prim) -> ir.Bin | ir.Prim:
    """The matmul a quantized primitive wraps: a `@` or an einsum (what quantize_matmuls wraps)."""
    inner = prim.args[0]
    if not isinstance(inner, (ir.Bin, ir.Prim)):
        raise InternalError(f"a quantized primitive wraps a matmul, got {type(inner).__name__}")
    return inner


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    inner = _matmul(prim)
    if isinstance(inner, ir.Bin):
        left, right = ctx.expr(inner.left)[0], ctx.expr(inner.right)[0]
        spec = ctx.matmul_spec(ir.tensor_type(inner.left).dims, ir.tensor_type(inner.right).dims)
    else:
        left, right = (ctx.expr(a)[0] for a in inner.args)
        spec = ctx.einsum_spec(inner)
    fmt = prim.attr("format")
    if helper_can_run(spec):
        ctx.use_helper(f"{fmt}_einsum")
        ctx.quant_comment(fmt)
    return emit_quantized(fmt, spec, left, right)


def _needs(prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    """`fp8_einsum`/`int8_einsum` where it can run the wrapped contraction: always for `@`, and
    for an einsum when `helper_can_run` accepts its spec (distinct names map to distinct
    letters, so its names decide as the letters would)."""
    inner = _matmul(prim)
    if isinstance(inner, ir.Prim):
        spec: ir.EinsumSpec = inner.attr("spec")
        if not _names_can_run(spec.operands, spec.out):
            return ()
    return (f"{prim.attr('format')}_einsum",)


def _names_can_run(operands: tuple[tuple[str, ...], ...], out: tuple[str, ...]) -> bool:
    """`helper_can_run` on an einsum written with names, one per letter."""
    if len(operands) != 2 or any(len(set(t)) != len(t) for t in operands):
        return False
    left, right = operands
    return all(c in right or c in out for c in left) and all(c in left or c in out for c in right)


def emit_quantized(fmt: str, spec: str, left: str, right: str) -> str:
    """`fp8_einsum(spec, left, right)`; a plain `jnp.einsum` for a spec the helpers cannot run.

    The fp8 backward pass derives its two einsums from the spec (for `ab,bc->ac`: `ac,bc->ab` and
    `ab,ac->bc`), which needs every letter of an operand in the other operand or the output.
    Every matmul satisfies that; an einsum that also sums a dim of one operand alone does not, and
    is left unquantized rather than failing when the generated code runs.
    """
    quoted = repr(str(spec))  # as codegen's py_str: a literal that cannot break out of its quotes
    if not helper_can_run(spec):
        return f"jnp.einsum({quoted}, {left}, {right})"
    return f"{fmt}_einsum({quoted}, {left}, {right})"


def helper_can_run(spec: str) -> bool:
    """Whether the fp8/int8 helpers can run this two-operand einsum spec (see emit_quantized)."""
    if spec.count("->") != 1:
        return False
    inputs, out = spec.split("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        return False
    letters = [t.replace("...", "") for t in terms]
    if any(len(set(t)) != len(t) for t in letters):
        return False
    left, right = letters
    return all(c in right or c in out for c in left) and all(c in left or c in out for c in right)


FP8_EINSUM = Source(
    "quantized",
    ("_fp8_quantize", "fp8_einsum", "_fp8_einsum", "_fp8_einsum_fwd", "_fp8_einsum_bwd"),
)

INT8_EINSUM = Source(
    "quantized",
    (
        "_int8_quantize",
        "_summed_axes",
        "int8_einsum",
        "_int8_einsum",
        "_int8_einsum_fwd",
        "_int8_einsum_bwd",
    ),
)


_IMPORTS = (
    "import functools",
    "import jax",
    "import jax.numpy as jnp",
    "from jax.ad_checkpoint import checkpoint_name",
)
# The name the helpers give their outputs: save_dots saves it (codegen's REMAT_POLICY).
QUANTIZED_POINT = "quantized_matmul"
_HELPERS = (
    Helper("fp8_einsum", FP8_EINSUM, _IMPORTS, HelperSection.MATMUL),
    Helper("int8_einsum", INT8_EINSUM, _IMPORTS, HelperSection.MATMUL),
)


def operands(prim: ir.Prim) -> tuple[ir.TExpr, ...]:
    """The wrapped matmul's operands: what the memory tracer evaluates in place of `prim.args`."""
    inner = _matmul(prim)
    return (inner.left, inner.right) if isinstance(inner, ir.Bin) else inner.args


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """A custom VJP. fp8 keeps both operands quantized, one byte each (the weight gathered);
    int8's straight-through backward keeps them unquantized, as the matmul it replaces does
    (`_int8_einsum_fwd` returns (x, w)). `args` are the wrapped matmul's operands (`operands`)."""
    fmt, where = prim.attr("format"), label.rsplit(": ", 1)[0]
    out = t.new(dims, t.promote(*args), f"{where}: {fmt} matmul", args, dot=True)
    if fmt == ir.QuantFormat.INT8:
        for v in args:
            t.save(v)
        return out
    for v in args:
        b = v.base
        if b.is_literal:
            continue
        t.save(t.internal(b.dims, "i8", f"{where}: {b.label} in {fmt}", (b,), weight=b.is_param))
    return out


PRIMITIVES = (
    Primitive(
        QUANTIZED,
        Signature(
            ("matmul",),
            (Static("format", StaticKind.FORMAT),),
            doc="a matmul in fp8 or int8 (made by quantize_matmuls)",
        ),
        emit=_emit,
        see_through=True,
        internal=True,
        emits_operands=False,
        memory=_memory,
        operands=operands,
        needs=_needs,
        helpers=_HELPERS,
    ),
)
