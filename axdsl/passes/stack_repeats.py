"""stack_repeats: give every parameter under a `repeat(n, ...)` child a leading `layers` dim.

The generated code scans over the stacked parameters with `jax.lax.scan`, so compile time does
not grow with depth.

    child blocks = repeat(layers, Block())
        /blocks/attn wq : [dim, heads, head_dim]  ->  [layers=32] + [dim, heads, head_dim]

A pattern of k layers stacks each of its layers n / k deep, in a dim named `groups` (its logical
axis is still `layers`):

    child blocks = repeat(layers, [Local(), Global()])   /blocks/0/attn wq : [groups=16] + [...]
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.ir import nodes as ir


def stack_repeats(module: ir.Module) -> ir.Module:
    models = tuple(replace(m, root=_stack(m.root, ())) for m in module.models)
    return replace(module, models=models)


def _stack(inst: ir.Instance, stack: tuple[ir.Dim, ...]) -> ir.Instance:
    if inst.repeat is not None:
        name = "groups" if inst.pattern else "layers"
        stack = stack + (ir.Dim(name, inst.repeat.value, inst.repeat.expr),)
    params = tuple(replace(p, stack=stack) for p in inst.params)
    children = tuple(_stack(c, stack) for c in inst.children)
    return replace(inst, params=params, children=children)
