"""Evaluate hyperparameter expressions at build time, keeping the expression that recomputes them.

Each value comes with its `Expr` tree (axdsl/ir/expr.py): a root hyperparameter is a Config
field, a literal a constant, and arithmetic on them an operation, so generated code can write
`cfg.dim // cfg.heads` where the spec wrote `dim / heads`.

Used by `resolve` for hyperparameter defaults, model settings, shapes, initializer arguments,
static `if` conditions and the static arguments of forward primitives.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import NoReturn

from axdsl.errors import Diagnostics, Span, did_you_mean
from axdsl.ir.dtypes import INT32_MAX
from axdsl.ir.expr import BinOp, Binary, Call, Const, Expr, Items, MathFn, Unary, UnaryOp
from axdsl.ir.nodes import DTYPES, DType, HValue, LayerValue, PatternValue, RepeatValue
from axdsl.syntax import ast
from axdsl.syntax.ast import INT64_MAX

# The largest size of one dim (and a repeat count); XLA's own dynamic slices take int32 offsets.
MAX_DIM = INT32_MAX
MAX_DIM_HINT = (
    "JAX indexes with int32 (x64 is off: token ids, positions, a scan's step counter), so a dim "
    f"or a repeat count is at most 2**31 - 1 = {MAX_DIM:,}"
)


class EvalError(Exception):
    """Raised after a diagnostic was recorded, to abandon the current expression."""


Lookup = Callable[[str, ast.Name], HValue | None]

_ARITH = {"+", "-", "*", "/", "//", "%"}
_COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MATH: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "min": min,
    "max": max,
}


class Evaluator:
    """Evaluates `ast.Expr` in a scope given by `lookup(name) -> HValue | None`."""

    def __init__(self, diags: Diagnostics, layers: set[str]):
        self.diags = diags
        self.layers = layers
        # set while a library layer's default is evaluated: reports an error at the user's line
        # that set a value the default reads (their `heads = 0`), instead of inside the library
        self.report: Callable[[Span, str, str | None], None] | None = None

    def eval(self, expr: ast.Expr, lookup: Lookup, visible: Callable[[], list[str]]) -> HValue:
        method = getattr(self, "_" + type(expr).__name__)
        return method(expr, lookup, visible)

    def fail(self, span: Span, message: str, hint: str | None = None) -> NoReturn:
        if self.report is not None:
            self.report(span, message, hint)
        else:
            self.diags.error(span, message, hint)
        raise EvalError(message)

    # ---- leaves
    def _Num(self, e: ast.Num, lookup, visible) -> HValue:
        return HValue(e.value, Const(e.value))

    def _Str(self, e: ast.Str, lookup, visible) -> HValue:
        return HValue(e.value, Const(e.value))

    def _Bool(self, e: ast.Bool, lookup, visible) -> HValue:
        return HValue(e.value, Const(e.value))

    def _Name(self, e: ast.Name, lookup, visible) -> HValue:
        found = lookup(e.id, e)
        if found is not None:
            return found
        if e.id in DTYPES:
            return HValue(DType(e.id), Const(DType(e.id)))
        if e.id in self.layers:
            return HValue(LayerValue(e.id, (), e.span))
        names = visible() + sorted(self.layers) + sorted(DTYPES)
        self.fail(e.span, f"unknown name `{e.id}`", did_you_mean(e.id, names))

    def _ListExpr(self, e: ast.ListExpr, lookup, visible) -> HValue:
        items = [self.eval(i, lookup, visible) for i in e.items]
        if items and any(isinstance(i.value, LayerValue) for i in items):
            bad = next(
                (
                    it
                    for it, v in zip(e.items, items, strict=True)
                    if not isinstance(v.value, LayerValue)
                ),
                None,
            )
            if bad is not None:
                self.fail(
                    bad.span,
                    "a list of layers (a pattern) holds only layers",
                    "write `[Block(...), Block(...)]`",
                )
            return HValue(PatternValue(tuple(i.value for i in items), e.span))
        return HValue(tuple(i.value for i in items), Items(tuple(_expr(i) for i in items)))

    def _pattern_op(self, e: ast.BinOp, a, b) -> PatternValue:
        """`[A()] * 5 + [B()]`: patterns join with `+` and repeat with `* n` (n >= 1), as lists
        do."""
        if e.op == "+" and isinstance(a, PatternValue) and isinstance(b, PatternValue):
            return PatternValue(a.layers + b.layers, e.span)
        if e.op == "*":
            pattern, n = (a, b) if isinstance(a, PatternValue) else (b, a)
            if isinstance(n, int) and not isinstance(n, bool):
                if n < 1:
                    self.fail(
                        e.span,
                        f"a pattern repeated {n} times has no layers",
                        "repeat it at least once",
                    )
                return PatternValue(pattern.layers * n, e.span)
        self.fail(
            e.span,
            f"patterns of layers join with `+` and repeat with `* n`, not `{e.op}` with "
            f"{_kind(a)} and {_kind(b)}",
            "write `[Block(window = 512)] * 5 + [Block()]`",
        )

    def _EllipsisDim(self, e: ast.EllipsisDim, lookup, visible) -> HValue:
        self.fail(e.span, "`...` is only allowed in a forward's tensor shapes")

    def _When(self, e: ast.When, lookup, visible) -> HValue:
        self.fail(
            e.span,
            "`value if condition` is only allowed as an argument of a call in a forward",
            "set the value with a conditional hyperparameter default, or in an `if` block",
        )

    def _Attr(self, e: ast.Attr, lookup, visible) -> HValue:
        self.fail(e.span, "`.` is only allowed in a forward, to read a child's parameter")

    # ---- operators
    def _Unary(self, e: ast.Unary, lookup, visible) -> HValue:
        v = self.eval(e.operand, lookup, visible)
        if e.op == "not":
            if not isinstance(v.value, bool):
                self.fail(e.span, "`not` needs a bool")
            return HValue(not v.value, Unary(UnaryOp.NOT, _expr(v)))
        if not _is_number(v.value):
            self.fail(e.span, "`-` needs a number")
        return HValue(-v.value, Unary(UnaryOp.NEG, _expr(v)))

    def _BinOp(self, e: ast.BinOp, lookup, visible) -> HValue:
        if e.op == "@":
            self.fail(e.span, "`@` is a tensor operator and only allowed in a forward")
        left = self.eval(e.left, lookup, visible)
        right = self.eval(e.right, lookup, visible)
        a, b = left.value, right.value
        if e.op in ("and", "or"):
            if not (isinstance(a, bool) and isinstance(b, bool)):
                self.fail(e.span, f"`{e.op}` needs bools")
            value = (a and b) if e.op == "and" else (a or b)
            return HValue(value, _binary(e.op, left, right))
        if e.op in _COMPARE:
            if (
                _is_number(a) != _is_number(b)
                or _kind(a) != _kind(b)
                and not (_is_number(a) and _is_number(b))
            ):
                self.fail(e.span, f"cannot compare {_kind(a)} with {_kind(b)}")
            if e.op not in ("==", "!=") and not (_is_number(a) or isinstance(a, str)):
                self.fail(
                    e.span, f"`{e.op}` needs numbers or strings, got {_kind(a)}", "use `==` or `!=`"
                )
            value = _COMPARE[e.op](a, b)  # only the chosen operator runs (dtypes have no `<`)
            return HValue(value, _binary(e.op, left, right))
        if isinstance(a, PatternValue) or isinstance(b, PatternValue):
            return HValue(self._pattern_op(e, a, b))
        if not (_is_number(a) and _is_number(b)):
            hint = (
                "repeat a layer in a pattern with `[Block(...)] * 5`"
                if isinstance(a, LayerValue) or isinstance(b, LayerValue)
                else None
            )
            self.fail(e.span, f"`{e.op}` needs numbers, got {_kind(a)} and {_kind(b)}", hint)
        return self._arith(e, left, right)

    def _arith(self, e: ast.BinOp, left: HValue, right: HValue) -> HValue:
        a, b, op = left.value, right.value, e.op
        if op in ("/", "//", "%") and b == 0:
            self.fail(e.span, "division by zero")
        if op == "/":
            if isinstance(a, int) and isinstance(b, int) and a % b == 0:
                return HValue(a // b, _binary("//", left, right))
            return HValue(a / b, _binary("/", left, right))
        value = {
            "+": a + b,
            "-": a - b,
            "*": a * b,
            "//": a // b if b else 0,
            "%": a % b if b else 0,
        }[op]
        if (
            isinstance(value, int)
            and abs(value) > INT64_MAX
            or isinstance(value, float)
            and not math.isfinite(value)
        ):
            self.fail(
                e.span,
                f"{_short(a)} {op} {_short(b)} does not fit in 64 bits",
                f"integers are at most {INT64_MAX}, floats about 1.8e308",
            )
        return HValue(value, _binary(op, left, right))

    # ---- calls: layer constructors, repeat, math
    def _Call(self, e: ast.Call, lookup, visible) -> HValue:
        if not isinstance(e.func, ast.Name):
            self.fail(e.span, "only layers, `repeat` and math functions can be called here")
        fname = e.func.id
        if fname == "repeat":
            return self._repeat(e, lookup, visible)
        if fname in _MATH:
            if e.kwargs or not e.args:
                self.fail(e.span, f"`{fname}` takes positional numbers")
            vals = [self.eval(a, lookup, visible) for a in e.args]
            if not all(_is_number(v.value) for v in vals):
                self.fail(e.span, f"`{fname}` needs numbers")
            if fname == "sqrt" and (len(vals) != 1 or vals[0].value < 0):
                self.fail(e.span, "`sqrt` takes one number >= 0")
            if fname == "log" and (len(vals) != 1 or vals[0].value <= 0):
                self.fail(e.span, "`log` takes one number > 0")
            return HValue(
                _MATH[fname](*(v.value for v in vals)),
                Call(MathFn(fname), tuple(_expr(v) for v in vals)),
            )
        target = lookup(fname, e.func)
        if target is not None and isinstance(target.value, LayerValue):
            base = target.value
        elif fname in self.layers:
            base = LayerValue(fname, (), e.span)
        else:
            self.fail(
                e.func.span, f"`{fname}` is not a layer", did_you_mean(fname, sorted(self.layers))
            )
        if e.args:
            self.fail(
                e.args[0].span if hasattr(e.args[0], "span") else e.span,
                f"layer `{fname}` takes keyword arguments",
                f"write `{fname}(name = value)`",
            )
        args, spans = dict(base.args), dict(base.arg_spans)
        for kw in e.kwargs:
            args[kw.name] = self.eval(kw.value, lookup, visible)
            spans[kw.name] = kw.span
        return HValue(LayerValue(base.layer, tuple(args.items()), e.span, tuple(spans.items())))

    def _repeat(self, e: ast.Call, lookup, visible) -> HValue:
        if len(e.args) != 2 or e.kwargs:
            self.fail(
                e.span, "`repeat` takes a count and a layer", "write `repeat(layers, Block())`"
            )
        count = self.eval(e.args[0], lookup, visible)
        layer = self.eval(e.args[1], lookup, visible)
        if not isinstance(count.value, int) or isinstance(count.value, bool) or count.value < 1:
            self.fail(e.args[0].span, f"`repeat` count must be a positive int, got {count.value!r}")
        if count.value > MAX_DIM:
            self.fail(e.args[0].span, f"`repeat` count {count.value:,} is too large", MAX_DIM_HINT)
        if not isinstance(layer.value, (LayerValue, PatternValue)):
            self.fail(
                e.args[1].span,
                "the second argument of `repeat` must be a layer or a list of layers",
                "write `repeat(n, Block())` or `repeat(n, [LocalBlock(), GlobalBlock()])`",
            )
        return HValue(RepeatValue(count, layer.value, e.span))


def _expr(v: HValue) -> Expr:
    """The expression of an operand that is a number, bool, string or dtype (all have one)."""
    if v.expr is None:
        raise AssertionError(f"{v.value!r} has no expression")
    return v.expr


def _binary(op: str, left: HValue, right: HValue) -> Binary | None:
    """`left op right`, or None when an operand has no expression (layers compared in an `if`:
    only the build-time value matters)."""
    if left.expr is None or right.expr is None:
        return None
    return Binary(BinOp(op), left.expr, right.expr)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 24 else text[:21] + "..."


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if isinstance(v, DType):
        return "dtype"
    if isinstance(v, (LayerValue, RepeatValue, PatternValue)):
        return "Layer"
    return type(v).__name__


kind_of = _kind
