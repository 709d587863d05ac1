"""Walking and rewriting forward expressions: the one walker every pass, analysis and emitter
uses."""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable, Iterator

from axdsl.ir import nodes as ir

Rewrite = Callable[[ir.TExpr], ir.TExpr]


def map_expr(e: ir.TExpr, fn: Rewrite) -> ir.TExpr:
    """Rewrite children first, then `e` itself; untouched subtrees are returned as they are."""
    if isinstance(e, ir.Bin):
        e = replace(e, left=map_expr(e.left, fn), right=map_expr(e.right, fn))
    elif isinstance(e, ir.Neg):
        e = replace(e, operand=map_expr(e.operand, fn))
    elif isinstance(e, (ir.Prim, ir.CallChild)):
        e = replace(e, args=tuple(map_expr(a, fn) for a in e.args))
    return fn(e)


def map_forward(f: ir.Forward, fn: Rewrite) -> ir.Forward:
    return replace(f, body=tuple(replace(s, value=map_expr(s.value, fn)) for s in f.body))


def walk_expr(e: ir.TExpr) -> Iterator[ir.TExpr]:
    """Every expression node under `e`, `e` first."""
    yield e
    if isinstance(e, ir.Bin):
        yield from walk_expr(e.left)
        yield from walk_expr(e.right)
    elif isinstance(e, ir.Neg):
        yield from walk_expr(e.operand)
    elif isinstance(e, (ir.Prim, ir.CallChild)):
        for a in e.args:
            yield from walk_expr(a)


def forward_exprs(inst: ir.Instance) -> Iterator[ir.TExpr]:
    """Every expression node of `inst`'s own forward (children's forwards are not included)."""
    if inst.forward is None:
        return
    for s in inst.forward.body:
        yield from walk_expr(s.value)


def prims_of(inst: ir.Instance, *names: str) -> Iterator[ir.Prim]:
    """The primitive calls in `inst`'s own forward, optionally only those named `names`."""
    for e in forward_exprs(inst):
        if isinstance(e, ir.Prim) and (not names or e.name in names):
            yield e


def tree_has(root: ir.Instance, predicate: Callable[[ir.Prim], bool]) -> bool:
    """Whether any primitive call anywhere under `root` satisfies `predicate(prim)`."""
    return any(predicate(p) for inst in root.walk() for p in prims_of(inst))


def sequence_dims(inst: ir.Instance) -> list[ir.Dim]:
    """The sequence dims of a layer's inputs: the free dim after the batch of each [B, S, ...]."""
    return [
        a.dims[1]
        for a in inst.fwd.args
        if len(a.dims) >= 2 and a.dims[0].is_free and a.dims[1].is_free
    ]
