"""What a primitive is: everything the compiler knows about one builtin, in one record.

A `Primitive` holds its signature (tensor operands and static attributes, checked when the
forward is built), its shape rule (infer_shapes), its emitter (codegen), its FLOPs (analysis) and
the activations it keeps for the backward pass (memory analysis). Nothing else in the compiler
special-cases a primitive by name; passes and analyses read the flags below instead.

The contexts each rule receives are small protocols implemented by the stage that calls it:

    ShapeContext   fail(span, message, hint=None); axis_of(prim, dims, over) -> int
    EmitContext    see axdsl/codegen/expressions.py FunctionEmitter (fresh names, extra lines,
                   helpers, dim sizes, einsum letters, the dropout key)
    FlopContext    inst (the instance), seq, cap_window, param_at(expr) -> ir.Param | None
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from axdsl.ir import nodes as ir

REQUIRED = object()  # a static attribute without a default must be given


class StaticKind(Enum):
    """The kind of a static attribute, checked at build time."""

    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STRING = "string"
    DTYPE = "dtype"
    DIM = "dim"  # a named dim: a hyperparameter size or a free dim of the forward


@dataclass(frozen=True)
class Static:
    name: str
    kind: StaticKind
    default: Any = REQUIRED  # REQUIRED, None (absent) or a Python value


@dataclass(frozen=True)
class Signature:
    tensors: tuple[str, ...]  # positional tensor operands
    statics: tuple[Static, ...] = ()  # static attributes, positional after the tensors or by keyword
    optional_tensors: tuple[str, ...] = ()  # keyword-only tensor operands
    doc: str = ""


@dataclass(frozen=True)
class Flops:
    """Forward model FLOPs per token of one primitive call (see axdsl/analysis/flops.py)."""

    matmul: int = 0
    attention: int = 0


@dataclass(frozen=True)
class KernelRule:
    """Kernels for a primitive: the profile's preference order and why one cannot run a call.

    `violations(kernel, prim, model, schedule)` lists the reasons; empty means it can run.
    """

    preference: Callable[[Any], tuple[str, ...]]
    violations: Callable[..., list[str]]


ShapeRule = Callable[[Any, ir.Prim, tuple[ir.TExpr, ...]], tuple[ir.Dim, ...]]  # typed operands
Emitter = Callable[[Any, ir.Prim, list[str], list[int]], str]
FlopRule = Callable[[Any, ir.Prim], Flops]
MemoryRule = Callable[..., Any]


def same_shape(ctx, prim: ir.Prim, args: tuple[ir.TExpr, ...]) -> tuple[ir.Dim, ...]:
    """The default shape rule: the result has the first operand's shape (elementwise ops)."""
    return args[0].type.dims


@dataclass(frozen=True)
class Primitive:
    """One builtin: its signature and a rule for every stage that needs one."""

    name: str
    signature: Signature
    emit: Emitter
    shape: ShapeRule = same_shape
    flops: FlopRule | None = None  # None: no model FLOPs (norms, activations, gathers)
    memory: MemoryRule | None = None  # None: elementwise (the result is like its first operand)
    lower: Callable | None = None  # a custom AST -> IR lowering (einsum's spec string)
    check: Callable | None = None  # an extra build-time check of the static attributes
    helpers: tuple[str, ...] = ()  # helper functions the generated model needs for it
    aux_loss: bool = False  # adds to the auxiliary training loss (threaded through the scan)
    uses_rng: bool = False  # needs a PRNG key (dropout)
    gathers: bool = False  # indexes its first operand (an embedding table) instead of multiplying
    see_through: bool = False  # keeps which parameter its first operand is (transpose, cast)
    scalar_operands: bool = False  # operands may be scalars (einsum checks its own)
    kernels: KernelRule | None = None  # select_kernels chooses a kernel for it
    internal: bool = False  # made by a pass, not callable from a spec (quantized)
    emits_operands: bool = True  # codegen emits the operands first (quantized emits its own)

    @property
    def has_kernels(self) -> bool:
        return self.kernels is not None
