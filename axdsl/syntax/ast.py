"""The AST: what the user wrote, as typed frozen dataclasses that keep their source spans.

The AST knows nothing about meaning; `passes/resolve.py` turns it into the IR.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import StrEnum

from axdsl.errors import Span

# ------------------------------------------------------------------ expressions

INT64_MAX = 2**63 - 1  # the largest integer a spec may write or compute: dims must fit int64


@dataclass(frozen=True)
class Num:
    value: int | float
    text: str
    span: Span


@dataclass(frozen=True)
class Str:
    value: str
    span: Span


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span


@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class ListExpr:
    items: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class BinOp:
    """Arithmetic, comparison and boolean operators; `@` is matmul."""

    op: str
    left: Expr
    right: Expr
    span: Span


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "not"
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Kwarg:
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    func: Expr
    args: tuple[Expr, ...]
    kwargs: tuple[Kwarg, ...]
    span: Span


@dataclass(frozen=True)
class Attr:
    obj: Expr
    name: str
    span: Span


def names_in(e: Expr) -> list[str]:
    """The names an expression reads, in source order (the hyperparameters a default uses)."""
    match e:
        case Name():
            return [e.id]
        case BinOp():
            return names_in(e.left) + names_in(e.right)
        case Unary():
            return names_in(e.operand)
        case ListExpr():
            return [n for item in e.items for n in names_in(item)]
        case Call():
            return [n for a in (*e.args, *(k.value for k in e.kwargs)) for n in names_in(a)]
        case Attr():
            return names_in(e.obj)
        case When():
            return names_in(e.value) + names_in(e.condition)
    return []


@dataclass(frozen=True)
class EllipsisDim:
    """`...` in a shape: any number of leading dims."""

    span: Span


@dataclass(frozen=True)
class When:
    """`value if condition` as an argument of a call in a forward: the argument is passed only when
    the static condition holds (`attn(x, segments if packed)`, `segment_ids = segments if packed`),
    as `param ... if` and `child ... if` declare members only when theirs does."""

    value: Expr
    condition: Expr
    span: Span


Expr = Num | Str | Bool | Name | ListExpr | BinOp | Unary | Call | Attr | EllipsisDim | When


# ------------------------------------------------------------------ layers
class BoundOp(StrEnum):
    """The comparison of a declared bound."""

    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="


_HOLDS = {
    BoundOp.GT: operator.gt,
    BoundOp.GE: operator.ge,
    BoundOp.LT: operator.lt,
    BoundOp.LE: operator.le,
}


@dataclass(frozen=True)
class Bound:
    """A declared bound on a numeric value, `> 0` in `eps: float(> 0)`: checked where the value
    is set, so `RMSNorm(eps = 0)` is an error at the user's line, not a NaN in training. A
    primitive's static attribute declares its bounds the same way (primitives/base.py Static)."""

    op: BoundOp
    limit: int | float

    def holds(self, value: int | float) -> bool:
        """Whether `value` is within the bound (a NaN never is)."""
        return bool(_HOLDS[self.op](value, self.limit))

    def __str__(self) -> str:
        return f"{self.op} {self.limit!r}"


BOUND_OPS = tuple(BoundOp)


def violated(bounds: tuple[Bound, ...], value: object) -> Bound | None:
    """The first of `bounds` that a number `value` breaks; None when it keeps them all (or is not
    a number: a type error is reported on its own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return next((b for b in bounds if not b.holds(value)), None)


def at_least(limit: int | float) -> tuple[Bound, ...]:
    """`>= limit`: a count or weight that may be zero (`window >= 0`)."""
    return (Bound(BoundOp.GE, limit),)


def above(limit: int | float) -> tuple[Bound, ...]:
    """`> limit`: a scale or base that must be positive (`eps > 0`, `theta > 0`)."""
    return (Bound(BoundOp.GT, limit),)


@dataclass(frozen=True)
class TypeRef:
    name: str  # int, float, bool, string, dtype, Layer, enum
    options: tuple[str, ...]
    span: Span
    bounds: tuple[Bound, ...] = ()  # `float(> 0, < 1)`: int and float only


@dataclass(frozen=True)
class HParamDecl:
    name: str
    type: TypeRef
    default: Expr | None
    span: Span


@dataclass(frozen=True)
class InitSpec:
    kind: str
    args: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class ParamDecl:
    name: str
    shape: tuple[Expr, ...]
    axes: tuple[str, ...] | None
    axes_span: Span | None
    init: InitSpec | None
    dtype: str | None
    condition: Expr | None
    span: Span
    dtype_span: Span | None = None  # the `dtype(...)` option, for error messages


@dataclass(frozen=True)
class ChildDecl:
    name: str
    value: Expr
    condition: Expr | None
    span: Span


@dataclass(frozen=True)
class TensorArg:
    """`name: [dims]` of a forward, or `name: [dims] if cond`: an input the layer takes only when
    the static condition holds (a packed decoder's `segments`)."""

    name: str
    shape: tuple[Expr, ...]
    span: Span
    condition: Expr | None = None


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr
    point: str | None
    span: Span


@dataclass(frozen=True)
class Return:
    value: Expr
    span: Span


@dataclass(frozen=True)
class If:
    """A static conditional: the condition is evaluated at build time; one branch survives."""

    condition: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]
    span: Span


Stmt = Assign | Return | If


@dataclass(frozen=True)
class ForwardDecl:
    args: tuple[TensorArg, ...]
    result: tuple[Expr, ...]
    result_span: Span
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class LayerDecl:
    name: str
    hparams: tuple[HParamDecl, ...]
    params: tuple[ParamDecl, ...]
    children: tuple[ChildDecl, ...]
    forward: ForwardDecl | None
    span: Span


# ------------------------------------------------------------------ models, train, target
@dataclass(frozen=True)
class Setting:
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Directive:
    """`name(args)` inside a train or target block, e.g. `mesh(data = -1, fsdp = 8)`."""

    name: str
    args: tuple[Expr, ...]
    kwargs: tuple[Kwarg, ...]
    span: Span


@dataclass(frozen=True)
class ModelDecl:
    name: str
    base: str  # the layer (for `=`) or the model (for `extends`)
    extends: bool
    settings: tuple[Setting, ...]
    span: Span
    base_span: Span


@dataclass(frozen=True)
class SectionDecl:
    """A `train { }` or `target "pattern" { }` block."""

    kind: str
    pattern: str | None
    items: tuple[Setting | Directive, ...]
    span: Span


@dataclass(frozen=True)
class Import:
    path: str
    span: Span


@dataclass(frozen=True)
class SpecFile:
    path: str
    imports: tuple[Import, ...]
    layers: tuple[LayerDecl, ...]
    models: tuple[ModelDecl, ...]
    sections: tuple[SectionDecl, ...]
