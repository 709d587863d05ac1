"""The forward primitives: their signatures (tensor operands, static attributes) and lowering.

A primitive call in a forward, `rope(q, theta = rope_theta)`, becomes `ir.Prim("rope", (q,),
(("theta", HValue(500000.0, "cfg.rope_theta")),))`. Static attributes are evaluated at build time;
their `code` keeps generated code symbolic. Shapes are inferred in `passes/infer_shapes.py`, code
is emitted in `codegen/expressions.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from axdsl.errors import did_you_mean
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import HValue
from axdsl.syntax import ast

REQUIRED = object()


@dataclass(frozen=True)
class Signature:
    tensors: tuple[str, ...]  # positional tensor operands
    statics: tuple[tuple[str, str, object], ...] = ()  # (name, kind, default); kind: int/float/...
    optional_tensors: tuple[str, ...] = ()  # keyword-only tensor operands
    doc: str = ""


_UNARY = ("relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "rsqrt", "sqrt", "abs", "square")
# The kinds `activate(x, kind)` accepts; the string becomes a function name in generated code.
ACTIVATIONS = ("gelu", "relu", "silu", "sigmoid", "tanh")

PRIMITIVES: dict[str, Signature] = {
    **{name: Signature(("x",), doc=f"elementwise {name}") for name in _UNARY},
    "activate": Signature(("x",), (("kind", "string", REQUIRED),), doc="activation chosen by a string"),
    "softmax": Signature(("x",), (("over", "dim", None),), doc="softmax over a named dim (default last)"),
    "sum": Signature(("x",), (("over", "dim", REQUIRED),), doc="sum over a named dim, kept as size 1"),
    "mean": Signature(("x",), (("over", "dim", REQUIRED),), doc="mean over a named dim, kept as size 1"),
    "max": Signature(("x",), (("over", "dim", REQUIRED),), doc="max over a named dim, kept as size 1"),
    "split_heads": Signature(("x",), (("heads", "int", REQUIRED),), doc="[..., h*d] -> [..., h, d]"),
    "merge_heads": Signature(("x",), doc="[..., h, d] -> [..., h*d]"),
    "rope": Signature(("x",), (("theta", "float", 10000.0),), doc="rotary embedding on [B, S, H, D]"),
    "attention": Signature(
        ("q", "k", "v"), (("causal", "bool", False), ("window", "int", 0)), ("mask",),
        doc="scaled dot-product attention; the kernel is chosen by a target pass",
    ),
    "embed": Signature(("table", "ids"), doc="embedding lookup: table[ids]"),
    "cast": Signature(("x",), (("dtype", "dtype", REQUIRED),), doc="convert to a dtype"),
    "dropout": Signature(("x",), (("rate", "float", REQUIRED),), doc="dropout in training only"),
    "transpose": Signature(("x",), doc="swap the last two dims"),
    "prefix": Signature(("x",), (("n", "dim", REQUIRED),), doc="the first n rows of x"),
    "einsum": Signature((), doc='einsum("B S dim, dim mlp -> B S mlp", x, w) over named dims'),
    "moe": Signature(
        ("x", "logits", "w_gate", "w_up", "w_down"),
        (("top_k", "int", 2), ("capacity_factor", "float", 1.25), ("normalize", "bool", True),
         ("aux_weight", "float", 0.01), ("z_weight", "float", 0.001)),
        doc="mixture of SwiGLU experts: softmax router, top-k, capacity (<= 0: dropless), aux losses",
    ),
}
# Primitives that add auxiliary losses to the training loss (threaded through generated code).
AUX_PRIMITIVES = ("moe",)


class LowerError(Exception):
    pass


def lower_primitive(ctx, call: ast.Call, name: str) -> ir.Prim:
    """Lower a primitive call; `ctx` gives `expr(e)` for tensors and `static(e)`, `dim(e)` for attrs."""
    if name == "einsum":
        return _lower_einsum(ctx, call)
    sig = PRIMITIVES[name]
    if len(call.args) > len(sig.tensors) + len(sig.statics):
        ctx.fail(call.span, f"`{name}` takes at most {len(sig.tensors) + len(sig.statics)} positional arguments")
    if len(call.args) < len(sig.tensors):
        ctx.fail(call.span, f"`{name}` needs {len(sig.tensors)} tensor argument(s): {', '.join(sig.tensors)}")
    tensors = tuple(ctx.expr(a) for a in call.args[: len(sig.tensors)])
    given: dict[str, ast.Expr] = {}
    for (sname, _, _), a in zip(sig.statics, call.args[len(sig.tensors):]):
        given[sname] = a
    optional: dict[str, ir.TExpr] = {}
    for kw in call.kwargs:
        if kw.name in sig.optional_tensors:
            optional[kw.name] = ctx.expr(kw.value)
        elif any(kw.name == s[0] for s in sig.statics):
            if kw.name in given:
                ctx.fail(kw.span, f"`{kw.name}` is given twice")
            given[kw.name] = kw.value
        else:
            names = [s[0] for s in sig.statics] + list(sig.optional_tensors)
            ctx.fail(kw.span, f"`{name}` has no argument `{kw.name}`", did_you_mean(kw.name, names))
    attrs = []
    for sname, kind, default in sig.statics:
        if sname in given:
            value = ctx.dim(given[sname]) if kind == "dim" else ctx.static(given[sname], kind, sname)
        elif default is REQUIRED:
            ctx.fail(call.span, f"`{name}` needs `{sname}`")
        elif default is None:
            value = None
        else:
            value = HValue(default, repr(default))
        attrs.append((sname, value))
    if name == "activate":
        _check_activation(ctx, given["kind"], dict(attrs)["kind"])
    args = tensors + tuple(optional[k] for k in sig.optional_tensors if k in optional)
    attrs.append(("optional", tuple(k for k in sig.optional_tensors if k in optional)))
    return ir.Prim(name, args, tuple(attrs), call.span)


def _check_activation(ctx, expr: ast.Expr, kind: HValue) -> None:
    """Only known activation names may reach generated code (no code injection through strings)."""
    if kind.value not in ACTIVATIONS:
        shown = kind.value if len(kind.value) <= 40 else kind.value[:37] + "..."
        ctx.fail(expr.span, f"unknown activation {json.dumps(shown)} for `activate`",
                 did_you_mean(kind.value, ACTIVATIONS) or f"activations are {', '.join(ACTIVATIONS)}")


def _lower_einsum(ctx, call: ast.Call) -> ir.Prim:
    if not call.args or not isinstance(call.args[0], ast.Str):
        ctx.fail(call.span, "`einsum` takes a spec string first",
                 'write einsum("B S dim, dim mlp -> B S mlp", x, w)')
    spec = call.args[0].value
    if "->" not in spec:
        ctx.fail(call.args[0].span, "an einsum spec needs `->`", 'e.g. "B S dim, dim mlp -> B S mlp"')
    lhs, rhs = spec.split("->", 1)
    operands = [tuple(part.split()) for part in lhs.split(",")]
    out = tuple(rhs.split())
    tensors = tuple(ctx.expr(a) for a in call.args[1:])
    if len(operands) != len(tensors):
        ctx.fail(call.span, f"einsum spec names {len(operands)} operand(s) but {len(tensors)} were given")
    names = {n for op in operands for n in op} | set(out)
    dims = {n: ctx.dim_by_name(n, call.args[0].span) for n in sorted(names)}
    for n in out:
        if not any(n in op for op in operands):
            ctx.fail(call.args[0].span, f"einsum output dim `{n}` appears in no operand")
    return ir.Prim("einsum", tensors, (("operands", tuple(operands)), ("out", out), ("dims", tuple(dims.items()))),
                   call.span)
