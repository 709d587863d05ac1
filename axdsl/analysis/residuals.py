"""What a binary operator saves for the backward (primitives keep their rules in axdsl/primitives/).

Residuals are modelled as jax 0.10 saves them (`jax.ad_checkpoint.print_saved_residuals`): a
matmul keeps both operands; `a * b` keeps each operand whose partner is differentiable; `a / b`
keeps the divisor and the quotient; adds and subtractions keep nothing. The rules record values
through `values.Recorder`, which the tracer (trace.py, the one caller) implements: this module
imports nothing of the tracer, even for annotations.
"""

from __future__ import annotations

from axdsl.analysis.values import Recorder, Val, promote
from axdsl.ir import nodes as ir


# ---------------------------------------------------------------------------- binary operators
def matmul(t: Recorder, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a @ b` keeps both operands; its output is a dot unless both operands are activations."""
    out = t.new(dims, dtype, f"{where}: matmul", (a, b), dot=not (a.activation and b.activation))
    t.save(a)
    t.save(b)
    return out


def multiply(t: Recorder, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a * b` keeps each operand whose partner is differentiable."""
    out = t.new(dims, dtype, f"{where}: *", (a, b))
    if b.differentiable:
        t.save(a)
    if a.differentiable:
        t.save(b)
    return out


def divide(t: Recorder, a: Val, b: Val, dims, dtype: str, where: str) -> Val:
    """`a / b` keeps the divisor and the quotient when the divisor is differentiable."""
    out = t.new(dims, dtype, f"{where}: /", (a, b))
    if b.differentiable:
        t.save(b)
        t.save(out)
    return out


BINARY_RESIDUALS = {"@": matmul, "*": multiply, "/": divide}


def binary(t: Recorder, op: str, a: Val, b: Val, dims, where: str) -> Val:
    """`a op b`; operators without a rule (+, -) keep nothing."""
    if op in ir.COMPARE_OPS:  # a bool tensor; no gradient flows through a comparison
        return t.new(dims, "bool", f"{where}: {op}", (a, b))
    dtype = promote(a, b)
    rule = BINARY_RESIDUALS.get(op)
    if rule is not None:
        return rule(t, a, b, dims, dtype, where)
    return t.new(dims, dtype, f"{where}: {op}", (a, b))
