"""shard_activations: pin each scanned layer's carry to the mesh, by the same rules as parameters.

    /blocks : Block x32                rules: batch -> stage, data, fsdp     mesh: fsdp = 8
                                        ->    /blocks : Block x32 carry(fsdp, _, _)

The activation a repeated layer's scan carries from one layer to the next ([B, S, dim]) is
constrained at the top of every step (`h = shard(h, P("fsdp"))` in the generated step). Its dims
get their logical axes from the parameters that name them (`dim` -> embed) and from the
convention for the free dims (B -> batch, S -> seq); `activation_spec` maps them to mesh axes in
dim order, each mesh axis used once (batch takes `fsdp` before embed can), as MaxText's fallback
rules do. A module without a schedule has no mesh, and nothing changes.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.ir import nodes as ir
from axdsl.ir.nodes import ActivationSharding
from axdsl.ir.rewrite import forward_exprs
from axdsl.ir.axes import dim_axes
from axdsl.passes.annotate_sharding import activation_spec


def shard_activations(module: ir.Module) -> ir.Module:
    sched = module.schedule
    if sched is None:
        return module
    models = []
    for model in module.models:
        axes = dim_axes(model.root)
        models.append(replace(model, root=_annotate(model.root, sched, axes)))
    return replace(module, models=tuple(models))


def placement(
    sched: ir.Schedule, dims: tuple[ir.Dim, ...], axes: dict[str, str], leading: int = 0
) -> ActivationSharding:
    """Where a tensor with `dims` lives, after `leading` unsharded dims (a stack's layers)."""
    logical = (None,) * leading + tuple(axes.get(d.name) for d in dims)
    return ActivationSharding(logical, activation_spec(sched, logical))


def _annotate(inst: ir.Instance, sched: ir.Schedule, axes: dict[str, str]) -> ir.Instance:
    carried: dict[str, ActivationSharding] = {}
    for e in forward_exprs(inst):
        if isinstance(e, ir.CallChild) and e.args and isinstance(e.args[0].type, ir.TensorType):
            child = inst.child(e.child)
            if child is not None and child.repeat is not None:
                carried.setdefault(e.child, placement(sched, e.args[0].type.dims, axes))
    children = tuple(
        replace(_annotate(c, sched, axes), carry_sharding=carried.get(c.name))
        for c in inst.children
    )
    return replace(inst, children=children)
