"""`einsum("B S dim, dim mlp -> B S mlp", x, w)`: a contraction over named dims.

The spec names every dim of every operand; names resolve to hyperparameters (sized dims) or to
the forward's free dims (B, S). FLOPs, when an operand is a parameter: 2 x the product of the
sizes of every named dim other than B and S.

Kernels (select_kernels; `@` follows the same choice, see `dense_matmuls`):

    xla     jnp.einsum(spec, x, w), differentiated by JAX
    dense   dense(x, w, contract): the same forward (jnp.tensordot) for an activation whose last
            dims contract with a weight's first dims, the output keeping the rest in order
            ("B S dim, dim heads head_dim -> B S heads head_dim"); its backward computes the
            weight's gradient as one matmul of the activations flattened to [tokens, in] and
            transposed, with the output's gradient [tokens, out]. Left to autodiff, XLA:CPU
            transposes the (larger) output gradient element by element instead: 23% of a train
            step on benchmarks/vs_maxtext.py's model (cpu's first choice)
"""

from __future__ import annotations

import math

from axdsl.ir import nodes as ir
from axdsl.primitives.base import (
    Flops,
    Helper,
    KernelRule,
    Primitive,
    Signature,
    Static,
    StaticKind,
)
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ir_fmt
from axdsl.syntax import ast
from axdsl.targets import profiles

TOKEN_DIMS = ("B", "S")  # free dims of activations by convention (see annotate_sharding)


def _lower(ctx, call: ast.Call) -> ir.Prim:
    first = call.args[0] if call.args else None
    if not isinstance(first, ast.Str):
        return ctx.fail(  # fail raises: the return tells the type checker so
            call.span,
            "`einsum` takes a spec string first",
            'write einsum("B S dim, dim mlp -> B S mlp", x, w)',
        )
    text = first.value
    if "->" not in text:
        ctx.fail(first.span, "an einsum spec needs `->`", 'e.g. "B S dim, dim mlp -> B S mlp"')
    lhs, rhs = text.split("->", 1)
    operands = tuple(tuple(part.split()) for part in lhs.split(","))
    out = tuple(rhs.split())
    tensors = tuple(ctx.expr(a) for a in call.args[1:])
    if len(operands) != len(tensors):
        ctx.fail(
            call.span, f"einsum spec names {len(operands)} operand(s) but {len(tensors)} were given"
        )
    names = {n for op in operands for n in op} | set(out)
    dims = tuple((n, ctx.dim_by_name(n, call.args[0].span)) for n in sorted(names))
    for n in out:
        if not any(n in op for op in operands):
            ctx.fail(call.args[0].span, f"einsum output dim `{n}` appears in no operand")
    spec = ir.EinsumSpec(operands, out, dims)
    return ir.Prim(
        "einsum", tensors, (("spec", spec),), call.span, decoding=ir.Decoding.POSITIONWISE
    )


def _shape(ctx, prim: ir.Prim, args):
    spec: ir.EinsumSpec = prim.attr("spec")
    named = dict(spec.dims)
    for names, a in zip(spec.operands, args, strict=False):
        if not isinstance(a.type, ir.TensorType):
            ctx.fail(a.span, "einsum operands must be tensors")
        actual = a.type.dims
        if len(names) != len(actual):
            ctx.fail(
                a.span,
                f"einsum operand is {ir_fmt(actual)} but the spec names {len(names)} dims: "
                f"{' '.join(names)}",
            )
        for n, d in zip(names, actual, strict=True):
            want = named[n]
            if want.is_free and d.is_free:
                continue
            if not want.same(d) and not (want.is_free and d.size is not None):
                ctx.fail(a.span, f"einsum dim `{n}` is {want} but the operand has `{d}` there")
    actual_by_name: dict[str, ir.Dim] = {}  # free names in the output take the operand's actual dim
    for names, a in zip(spec.operands, args, strict=True):
        actual_by_name.update(zip(names, a.type.dims, strict=True))
    return tuple(actual_by_name[n] for n in spec.out)


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    kernel = prim.kernel.kernel if prim.kernel is not None else None
    if kernel is ir.Kernel.DENSE and (contract := _dense_contract(prim)) is not None:
        return dense_call(ctx, args[0], args[1], contract)
    return f"jnp.einsum({ctx.py_str(ctx.einsum_spec(prim))}, {', '.join(args)})"


def _needs(prim: ir.Prim, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    """`dense` where the dense kernel runs the call (as `_emit` decides)."""
    kernel = prim.kernel.kernel if prim.kernel is not None else None
    return ("dense",) if kernel is ir.Kernel.DENSE and _dense_contract(prim) is not None else ()


def matmul_needs(e: ir.Bin, schedule: ir.Schedule | None) -> tuple[str, ...]:
    """`dense` where `x @ weight` is written `dense(x, weight)` (codegen's matmul)."""
    dense = dense_matmuls(schedule) and is_weight(e.right) and not is_weight(e.left)
    return ("dense",) if dense else ()


def dense_call(ctx, x: str, w: str, contract: int) -> str:
    """`dense(x, w)` (or `dense(x, w, contract)`), with its helper."""
    ctx.use_helper("dense")
    return f"dense({x}, {w})" if contract == 1 else f"dense({x}, {w}, {contract})"


def _dense_contract(prim: ir.Prim) -> int | None:
    """How many dims an activation [lead..., in...] x weight [in..., rest...] -> [lead..., rest...]
    contracts (the `dense` kernel's shape); None for any other einsum."""
    spec: ir.EinsumSpec = prim.attr("spec")
    if len(spec.operands) != 2 or not is_weight(prim.args[1]) or is_weight(prim.args[0]):
        return None
    (x, w), out = spec.operands, spec.out
    n = len(x) + len(w) - len(out)
    if n <= 0 or n % 2 or len(set(x) | set(w)) != len(x) + len(w) - n // 2:
        return None
    n //= 2
    ok = n <= min(len(x), len(w)) and x[len(x) - n :] == w[:n] and out == x[: len(x) - n] + w[n:]
    return n if ok else None


def is_weight(e: ir.TExpr) -> bool:
    """A parameter of the layer (or of a child) read as it is."""
    return isinstance(e, ir.Ref) and e.kind in (ir.RefKind.PARAM, ir.RefKind.CHILD_PARAM)


def _violations(
    kernel: ir.Kernel, prim: ir.Prim, model: ir.Model, sched: ir.Schedule | None = None
) -> list[str]:
    if kernel is ir.Kernel.DENSE and _dense_contract(prim) is None:
        return ["an einsum that is not an activation's last dims times a weight's first dims"]
    return []


def dense_matmuls(schedule: ir.Schedule | None) -> bool:
    """Whether `x @ weight` is written `dense(x, weight)` on this schedule: the einsum kernel
    it forces (`kernels(einsum = dense)`), else the profile's first choice."""
    if schedule is None:
        return False
    choice = dict(schedule.kernels).get("einsum")
    if choice is not None and choice.value is not None:
        return choice.value is ir.Kernel.DENSE
    preferred = profiles()[schedule.profile].kernels.get("einsum", (ir.Kernel.XLA,))
    return preferred[0] is ir.Kernel.DENSE


DENSE = Source("dense", ("dense", "_dense_fwd", "_dense_bwd"))


def _flops(ctx, prim: ir.Prim) -> Flops:
    if not any(ctx.param_at(a) is not None for a in prim.args):
        return Flops()
    sizes: dict[str, int] = {}
    for names, a in zip(prim.attr("spec").operands, prim.args, strict=True):
        for n, d in zip(names, ir.tensor_type(a).dims, strict=True):
            if n not in TOKEN_DIMS and d.size is not None:
                sizes[n] = d.size
    return Flops(matmul=2 * math.prod(sizes.values()))


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """Keeps every operand; a dot (for save_dots) when it has no batch dims and a weight operand."""
    spec: ir.EinsumSpec = prim.attr("spec")
    batch_dims = set()
    if len(spec.operands) > 1:
        batch_dims = set.intersection(*(set(o) for o in spec.operands)) & set(spec.out)
    out = t.new(
        dims,
        t.promote(*args),
        label,
        args,
        dot=not batch_dims and any(not a.activation for a in args),
    )
    for a in args:
        t.save(a)
    return out


PRIMITIVES = (
    Primitive(
        "einsum",
        Signature(
            (),
            (Static("spec", StaticKind.EINSUM),),
            doc='einsum("B S dim, dim mlp -> B S mlp", x, w) over named dims',
        ),
        emit=_emit,
        shape=_shape,
        flops=_flops,
        lower=_lower,
        scalar_operands=True,
        contraction=True,
        memory=_memory,
        kernels=KernelRule((ir.Kernel.XLA, ir.Kernel.DENSE), _violations),
        needs=_needs,
        helpers=(
            Helper(
                "dense",
                DENSE,
                ("import functools", "import math", "import jax", "import jax.numpy as jnp"),
            ),
        ),
    ),
)
