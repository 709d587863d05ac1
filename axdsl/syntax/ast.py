"""The AST: what the user wrote, as typed frozen dataclasses that keep their source spans.

The AST knows nothing about meaning; `passes/resolve.py` turns it into the IR.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    return []


@dataclass(frozen=True)
class EllipsisDim:
    """`...` in a shape: any number of leading dims."""

    span: Span


Expr = Num | Str | Bool | Name | ListExpr | BinOp | Unary | Call | Attr | EllipsisDim


# ------------------------------------------------------------------ layers
@dataclass(frozen=True)
class TypeRef:
    name: str  # int, float, bool, string, dtype, Layer, enum
    options: tuple[str, ...]
    span: Span


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
    name: str
    shape: tuple[Expr, ...]
    span: Span


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
