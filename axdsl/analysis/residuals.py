"""What each operation saves for the backward: one small rule per primitive (and binary operator).

Residuals are modelled per operation as jax 0.10 saves them (`jax.ad_checkpoint.
print_saved_residuals`): a matmul or einsum keeps its activation operands; `a * b` keeps each
operand whose partner is differentiable; casts, sums, means, adds and rope keep nothing; each
elementwise function keeps what its derivative reads (table `UNARY`); XLA attention keeps q, k,
v, the mask, the masked logits and exp in float32 and the probabilities in the compute dtype
([B, heads, S, S] each), flash kernels (cudnn, splash) keep q, k, v, the output and the
log-sum-exp; fp8/int8 matmuls keep both operands in one byte each (the weight gathered).

A rule is `rule(t, e, args, dims, label) -> Val`: `t` is the tracer (`t.new(...)` makes a value
in the current scope, `t.save(v)` keeps it for the backward), `e` the `ir.Prim`, `args` its
evaluated operands, `dims` its result dims. `PRIM_RESIDUALS` maps a primitive name to its rule;
a primitive it does not name is elementwise (`unary`); `quantized` wraps a matmul and is
the tracer's to evaluate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from axdsl.analysis.values import Val, attr_value, promote
from axdsl.ir import nodes as ir

if TYPE_CHECKING:
    from axdsl.analysis.trace import Tracer

# What each elementwise function's backward reads (jax 0.10.2, measured with
# print_saved_residuals): (keeps its input, extra same-dtype tensors, extra bool tensors,
# keeps its output).
UNARY = {
    "silu": (True, 2, 0, False),
    "gelu": (True, 4, 0, False),  # tanh approximation (jax.nn.gelu's default)
    "relu": (False, 1, 1, False),
    "sigmoid": (False, 1, 0, False),
    "tanh": (False, 1, 0, False),
    "exp": (False, 0, 0, True),
    "log": (True, 0, 0, False),
    "rsqrt": (False, 1, 0, False),
    "sqrt": (False, 1, 0, False),
    "abs": (False, 0, 1, False),
    "square": (False, 1, 0, False),
    "softmax": (False, 1, 0, True),
}
LINEAR = ("cast", "mean", "sum", "rope", "prefix", "transpose", "split_heads", "merge_heads", "embed")
VIEWS = ("transpose", "split_heads", "merge_heads")
FLASH_KERNELS = ("cudnn", "splash")

Rule = Callable[["Tracer", ir.Prim, list[Val], tuple[ir.Dim, ...], str], Val]


# ---------------------------------------------------------------------------- binary operators
def matmul(t: Tracer, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a @ b` keeps both operands; its output is a dot unless both operands are activations."""
    out = t.new(dims, dtype, f"{where}: matmul", (a, b), dot=not (a.activation and b.activation))
    t.save(a)
    t.save(b)
    return out


def multiply(t: Tracer, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a * b` keeps each operand whose partner is differentiable."""
    out = t.new(dims, dtype, f"{where}: *", (a, b))
    if b.differentiable:
        t.save(a)
    if a.differentiable:
        t.save(b)
    return out


def divide(t: Tracer, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a / b` keeps the divisor and the quotient when the divisor is differentiable."""
    out = t.new(dims, dtype, f"{where}: /", (a, b))
    if b.differentiable:
        t.save(b)
        t.save(out)
    return out


BINARY_RESIDUALS = {"@": matmul, "*": multiply, "/": divide}


def binary(t: Tracer, op: str, a: Val, b: Val, dims, where: str) -> Val:
    """`a op b`; operators without a rule (+, -) keep nothing."""
    dtype = promote(a, b)
    rule = BINARY_RESIDUALS.get(op)
    if rule is not None:
        return rule(t, a, b, dims, dtype, where)
    return t.new(dims, dtype, f"{where}: {op}", (a, b))


# ---------------------------------------------------------------------------- primitives
def cast(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    target = attr_value(e.attr("dtype"))
    target = target.name if isinstance(target, ir.DType) else str(target)
    if target == args[0].dtype:
        return args[0]
    return t.new(dims, target, label, (args[0],))


def view(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """A reshape or transpose: the same buffer, seen with other dims."""
    return t.new(dims, args[0].dtype, label, (args[0],), kind="view")


def linear(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """Sums, means, rope: the backward needs none of the inputs."""
    return t.new(dims, args[0].dtype, label, (args[0],))


def prefix(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """A slice of a parameter is a parameter (a learned position table); else linear."""
    x = args[0]
    if x.kind == "param":
        return Val(dims, x.dtype, "param", label)
    return linear(t, e, args, dims, label)


def embed(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """A table lookup: depends on the ids, keeps nothing."""
    return t.new(dims, args[0].dtype, label, (args[1],))


def einsum(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """Keeps every operand; a dot (for save_dots) when it has no batch dims and a weight operand."""
    operands = e.attr("spec").operands
    out_names = set(e.attr("spec").out)
    batch_dims = set()
    if len(operands) > 1:
        batch_dims = set.intersection(*(set(o) for o in operands)) & out_names
    out = t.new(dims, promote(*args), label, args,
                dot=not batch_dims and any(not a.activation for a in args))
    for a in args:
        t.save(a)
    return out


def dropout(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """Keeps its boolean mask."""
    x = args[0]
    out = t.new(dims, x.dtype, label, (x,))
    t.save(t.new(dims, "bool", f"{label} mask", (x,), kind="internal"))
    return out


def attention(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """q, k, v; then flash kernels the output and log-sum-exp, XLA the [B, heads, S, S] internals."""
    q, k, v = args[:3]
    heads = q.dims[-2]
    out = t.new(dims, q.dtype, label, (q, k, v))
    for x in (q, k, v):
        t.save(x)
    if (e.kernel.kernel if e.kernel is not None else "xla") in FLASH_KERNELS:
        t.save(out)
        t.save(t.new((q.dims[0], heads, q.dims[1]), "f32", f"{label} logsumexp", (q, k), kind="internal"))
        return out
    # keys: the full sequence (never split over `seq` in this model)
    scores = (q.dims[0], heads, q.dims[1], ir.Dim("S_kv", t.seq))
    internals = [("f32", "masked logits"), ("f32", "exp")]
    if attr_value(e.attr("causal")) or attr_value(e.attr("window")) or len(args) > 3:
        internals.append(("bool", "mask"))
    if q.dtype != "f32":
        internals.append((q.dtype, "probabilities"))
    for dtype, what in internals:
        t.save(t.new(scores, dtype, f"{label} {what}", (q, k), kind="internal"))
    return out


def moe(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """Mixture of SwiGLU experts (the generated `moe_swiglu`): router softmax, then either
    one-hot dispatch to [B, experts, capacity] slots (capacity_factor > 0) or tokens sorted
    by expert and grouped matmuls (dropless); each expert runs a SwiGLU on its tokens.
    Expert matmuls are batched over experts, so save_dots keeps none of them."""
    x, logits, w_gate = args[0], args[1], args[2]
    top_k = int(attr_value(e.attr("top_k"), 1))
    cf = float(attr_value(e.attr("capacity_factor"), 0.0))
    experts, hidden, model_dim = w_gate.dims[0], w_gate.dims[-1], x.dims[-1]
    b, s = x.dims[0], x.dims[1]
    out = t.new(dims, x.dtype, label, tuple(args))
    t.save(t.new((b, s, experts), "f32", f"{label} router softmax", (logits,), kind="internal"))
    k = ir.Dim("top_k", top_k)
    if cf > 0:
        cap = ir.Dim("capacity", max(1, math.ceil(top_k * t.seq * cf / experts.size)))
        slot = (b, experts, cap)
        for what, d in (("slots", (b, k, s, experts, cap)), ("dispatch", (b, s, experts, cap)),
                        ("combine", (b, s, experts, cap))):
            t.save(t.new(d, x.dtype, f"{label} {what}", (logits,), kind="internal"))
    else:
        slot = (b, s, k)
    inner = [("expert inputs", model_dim), ("gate", hidden), ("silu residual", hidden),
             ("silu residual", hidden), ("up", hidden), ("hidden", hidden), ("expert outputs", model_dim)]
    for what, d in inner:
        t.save(t.new(slot + (d,), x.dtype, f"{label} {what}", (x, logits), kind="internal"))
    return out


def unary(t: Tracer, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
    """An elementwise function (`activate` names it): what its derivative reads (`UNARY`)."""
    x = args[0]
    fn = attr_value(e.attr("kind")) if e.name == "activate" else e.name
    rule = UNARY.get(fn)
    out = t.new(dims, x.dtype, f"{label} {fn}" if fn != e.name else label, (x,))
    if rule is None:  # max and anything new: assume it keeps its input
        t.save(x)
        return out
    keep_in, same, bools, keep_out = rule
    if keep_in:
        t.save(x)
    for _ in range(same):
        t.save(t.new(dims, x.dtype, f"{label} {fn} residual", (x,), kind="internal"))
    for _ in range(bools):
        t.save(t.new(dims, "bool", f"{label} {fn} mask", (x,), kind="internal"))
    if keep_out:
        t.save(out)
    return out


def quantized(t: Tracer, e: ir.Prim, operands: list[Val], dims, where: str) -> Val:
    """fp8/int8 matmul (a custom VJP): keeps both operands in one byte each (the weight gathered).

    Unlike the rules above it takes the inner matmul's operands (the tracer evaluates those in
    place of `e.args`) and the instance path `where` for its labels."""
    fmt = e.attr("format")
    out = t.new(dims, promote(*operands), f"{where}: {fmt} matmul", operands, dot=True)
    for v in operands:
        b = v.base
        if b.kind == "lit":
            continue
        t.save(t.new(b.dims, "i8", f"{where}: {b.label} in {fmt}", (b,),
                     kind="internal", weight=b.kind == "param"))
    return out


PRIM_RESIDUALS: dict[str, Rule] = {
    "cast": cast,
    **{name: view for name in VIEWS},
    "prefix": prefix,
    "embed": embed,
    "einsum": einsum,
    "attention": attention,
    "moe": moe,
    "dropout": dropout,
    **{name: linear for name in LINEAR if name not in ("cast", "prefix", "embed") + VIEWS},
}


def residuals_rule(name: str) -> Rule:
    """The rule of primitive `name` (elementwise `unary` when it has none of its own)."""
    return PRIM_RESIDUALS.get(name, unary)
