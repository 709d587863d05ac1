"""Size and hyperparameter expressions: a small typed tree, and the one printer that renders it.

A resolved hyperparameter keeps how it is computed from the model's Config, so generated code
stays symbolic: Attention's `head_dim` is `Binary(FLOORDIV, Field("dim"), Field("heads"))`, which
codegen prints as `cfg.dim // cfg.heads`, not 128. The tree holds no source text; questions about
it (does it read Config? is it one field?) are asked of the tree, never of printed code.

`render` prints a tree with the fewest parentheses Python's precedence needs, spelling fields,
constants and functions as a `Spelling` says: `SPEC` for `axdsl dump` and messages here, and
codegen's own for Python (axdsl/codegen/pyexpr.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from axdsl.ir.dtypes import DType


class BinOp(StrEnum):
    """A binary operator: on hyperparameters (all but `@`) or on tensors (`TENSOR_OPS`)."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    MOD = "%"
    MATMUL = "@"
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    AND = "and"
    OR = "or"


class UnaryOp(StrEnum):
    NEG = "-"
    NOT = "not"


class MathFn(StrEnum):
    """The functions a hyperparameter expression may call."""

    SQRT = "sqrt"
    LOG = "log"
    MIN = "min"
    MAX = "max"


COMPARE_OPS = frozenset({BinOp.EQ, BinOp.NE, BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE})

# How tightly each operator binds (higher binds tighter), as in Python; codegen's tensor
# expressions use the same tables. Names, numbers and calls are atoms. (Two tables: `-` is both
# a BinOp and a UnaryOp, and str enums that print alike hash alike.)
PRECEDENCE: dict[BinOp, int] = {
    BinOp.OR: -3,
    BinOp.AND: -2,
    **{op: 0 for op in COMPARE_OPS},
    BinOp.ADD: 1,
    BinOp.SUB: 1,
    BinOp.MUL: 2,
    BinOp.DIV: 2,
    BinOp.FLOORDIV: 2,
    BinOp.MOD: 2,
    BinOp.MATMUL: 2,
}
UNARY_PRECEDENCE: dict[UnaryOp, int] = {UnaryOp.NOT: -1, UnaryOp.NEG: 4}
ATOM = 10

Scalar = bool | int | float | str | DType


@dataclass(frozen=True, eq=False)
class Const:
    """A number, bool, string or dtype written in the spec (or a default)."""

    value: Scalar

    def _key(self) -> tuple[type, Scalar]:
        return type(self.value), self.value  # 2 and 2.0 print differently: not equal

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True)
class Field:
    """A field of the model's Config: a root hyperparameter, `cfg.<name>` in generated code."""

    name: str


@dataclass(frozen=True)
class Binary:
    op: BinOp
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Unary:
    op: UnaryOp
    operand: Expr


@dataclass(frozen=True)
class Call:
    fn: MathFn
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Items:
    """A list of values (`[1, 2]`), a tuple in generated code."""

    items: tuple[Expr, ...]


Expr = Const | Field | Binary | Unary | Call | Items


def subexprs(e: Expr) -> Iterator[Expr]:
    """`e` and every expression inside it, parents first."""
    yield e
    if isinstance(e, Binary):
        yield from subexprs(e.left)
        yield from subexprs(e.right)
    elif isinstance(e, Unary):
        yield from subexprs(e.operand)
    elif isinstance(e, (Call, Items)):
        for a in e.args if isinstance(e, Call) else e.items:
            yield from subexprs(a)


def reads_config(e: Expr | None) -> bool:
    """Whether `e` reads a Config field (its value is decided when the model is configured);
    otherwise (or without an expression) it is a constant the build already knows."""
    return e is not None and any(isinstance(s, Field) for s in subexprs(e))


def field_of(e: Expr | None) -> str | None:
    """The Config field `e` is exactly (`cfg.ffn` -> "ffn"), or None."""
    return e.name if isinstance(e, Field) else None


def ops_of(e: Expr) -> set[BinOp]:
    """The binary operators anywhere in `e`."""
    return {s.op for s in subexprs(e) if isinstance(s, Binary)}


def precedence(e: Expr) -> int:
    """How tightly `e` binds as printed: ATOM for names, numbers and calls."""
    if isinstance(e, Binary):
        return PRECEDENCE[e.op]
    if isinstance(e, Unary):
        return UNARY_PRECEDENCE[e.op]
    if isinstance(e, Const) and _negative(e.value):
        return UNARY_PRECEDENCE[UnaryOp.NEG]
    return ATOM


def _negative(v: Scalar) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and str(v).startswith("-")


class Spelling(Protocol):
    """How one printer spells the leaves of a tree: Config fields, constants, functions."""

    def field(self, name: str) -> str: ...

    def const(self, value: Scalar) -> str: ...

    def fn(self, fn: MathFn) -> str: ...


def render(e: Expr, spell: Spelling) -> str:
    """`e` as text, with the parentheses precedence needs and no others: an operand binding less
    tightly than its operator is wrapped, as is a right operand binding equally (`a - (b - c)`)
    and a compared comparison (Python would chain `a < b < c`)."""
    if isinstance(e, Field):
        return spell.field(e.name)
    if isinstance(e, Const):
        return spell.const(e.value)
    if isinstance(e, Call):
        return f"{spell.fn(e.fn)}({', '.join(render(a, spell) for a in e.args)})"
    if isinstance(e, Items):
        return "(" + ", ".join(render(i, spell) for i in e.items) + ",)"
    if isinstance(e, Unary):
        p = UNARY_PRECEDENCE[e.op]
        sep = " " if e.op is UnaryOp.NOT else ""
        return f"{e.op}{sep}{wrap(render(e.operand, spell), precedence(e.operand), p)}"
    p = PRECEDENCE[e.op]
    left_need = p + 1 if e.op in COMPARE_OPS else p
    left = wrap(render(e.left, spell), precedence(e.left), left_need)
    right = wrap(render(e.right, spell), precedence(e.right), p + 1)
    return f"{left} {e.op} {right}"


def wrap(text: str, prec: int, need: int) -> str:
    """`text` parenthesized when it binds less tightly (`prec`) than its place needs."""
    return text if prec >= need else f"({text})"


class _Spec:
    """The spec language's spelling, for `axdsl dump` and messages: `cfg.dim // cfg.heads`,
    `bf16`, `sqrt(x)`."""

    def field(self, name: str) -> str:
        return f"cfg.{name}"

    def const(self, value: Scalar) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, DType):
            return value.name
        if isinstance(value, str):
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(value)

    def fn(self, fn: MathFn) -> str:
        return str(fn)


SPEC: Spelling = _Spec()


def spec_text(e: Expr) -> str:
    return render(e, SPEC)
