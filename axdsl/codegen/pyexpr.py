"""Config expressions as Python: the spelling codegen gives the IR's expression trees.

The tree and its precedence-aware printer are the IR's (axdsl/ir/expr.py `render`, which
`axdsl dump` uses too); this module says how Python writes the leaves: a Config field is
`cfg.<name>`, a dtype `jnp.<name>`, `sqrt` is `math.sqrt`. Every hyperparameter, size and
initializer argument in generated code is printed here.
"""

from __future__ import annotations

from axdsl.ir import expr as ex
from axdsl.ir.dtypes import DType
from axdsl.ir.nodes import Dim, HValue


class _Python:
    def field(self, name: str) -> str:
        return f"cfg.{name}"

    def const(self, value: ex.Scalar) -> str:
        return f"jnp.{value.jnp}" if isinstance(value, DType) else repr(value)

    def fn(self, fn: ex.MathFn) -> str:
        return f"math.{fn}" if fn in (ex.MathFn.SQRT, ex.MathFn.LOG) else str(fn)


PYTHON: ex.Spelling = _Python()


def py(e: ex.Expr) -> str:
    """`e` as a Python expression over `cfg`, with the parentheses precedence needs."""
    return ex.render(e, PYTHON)


def py_value(v: HValue | None) -> str:
    """A hyperparameter's Python expression (a layer-valued one has none)."""
    if v is None or v.expr is None:
        raise ValueError(f"{v!r} is not a Config value")
    return py(v.expr)


def py_size(d: Dim) -> str:
    """A sized dim's size as Python: `cfg.ffn`, `cfg.dim // cfg.heads`, or its number."""
    return py(d.size_expr)
