"""The values of a traced forward (for the memory model): tensors, scopes and dtype promotion."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from axdsl.ir import nodes as ir

_FLOAT_RANK = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "f16": 2, "f32": 3, "f64": 4}


class ValKind(StrEnum):
    """What a traced value is."""

    INPUT = "input"  # a forward's (or a scanned layer's) argument
    PARAM = "param"  # a parameter, or part of one
    LIT = "lit"  # a literal or hyperparameter: no memory
    OP = "op"  # an operation's result
    INTERNAL = "internal"  # a temporary inside one operation (a mask, softmax, logits)
    VIEW = "view"  # a reshape or transpose of another value: its buffer


@dataclass(eq=False)
class Val:
    """A tensor value of the traced forward (compared by identity)."""

    dims: tuple[ir.Dim, ...]
    dtype: str
    kind: ValKind
    label: str
    inputs: tuple[Val, ...] = ()
    point: str | None = None
    dot: bool = False  # a matmul output without batch dims (save_dots keeps these)
    weight: bool = False  # a gathered weight (sized without the batch mesh axes)
    # a transient the layer backward adds whole, beside its recompute and cotangents (XLA:GPU's
    # per-expert copies of a grouped matmul; activations.py)
    whole: bool = False

    @property
    def base(self) -> Val:
        v = self
        while v.kind is ValKind.VIEW:
            v = v.inputs[0]
        return v

    @property
    def is_param(self) -> bool:
        return self.kind is ValKind.PARAM

    @property
    def is_literal(self) -> bool:
        return self.kind is ValKind.LIT

    @property
    def differentiable(self) -> bool:
        return self.kind is not ValKind.LIT

    @property
    def activation(self) -> bool:
        return self.base.kind not in (ValKind.PARAM, ValKind.LIT)


class Scope:
    """Values and residuals of one scope (the whole model outside the scan, or one layer)."""

    def __init__(self) -> None:
        self.values: list[Val] = []
        self.residuals: dict[int, Val] = {}

    def save(self, v: Val) -> None:
        v = v.base
        if v.kind in (ValKind.PARAM, ValKind.LIT) or not v.dims:
            return
        self.residuals.setdefault(id(v), v)


class Recorder(Protocol):
    """What a residual rule needs of the memory tracer (analysis/trace.py's Tracer): make a value
    in the current scope and keep one for the backward. Rules see this, not the tracer, so that
    they do not import the module that calls them."""

    def new(self, dims: Any, dtype: str, label: str, inputs: Any = (), **kw: Any) -> Val: ...

    def save(self, v: Val) -> None: ...


def promote(*vals: Val) -> str:
    """jnp type promotion for the dtypes here: scalars (literals) are weak."""
    tensors = [v.dtype for v in vals if v.kind is not ValKind.LIT and v.dims]
    if not tensors:
        return vals[0].dtype if vals else "f32"
    floats = [d for d in tensors if d in _FLOAT_RANK]
    if not floats:
        return tensors[0]
    best = max(floats, key=lambda d: _FLOAT_RANK[d])
    if {"bf16", "f16"} <= set(floats) and _FLOAT_RANK[best] == 2:
        return "f32"
    return best


def attr_value(v, default=None):
    """A primitive attribute's plain value (an HValue unwrapped), or `default` when unset."""
    return default if v is None else ir.plain(v)
