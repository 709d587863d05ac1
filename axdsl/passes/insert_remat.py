"""insert_remat: attach the target's rematerialization policy to every scanned (repeated) child.

    remat(none)                 keep every activation of the block for the backward pass
    remat(full)                 keep only the block's input; recompute the rest
    remat(save_dots)            keep matmul outputs without batch dims (XLA's common choice)
    remat(save = [a, b])        keep the named points a, b; recompute the rest
    remat(offload = [a], save = [b])  keep b on device, move a to host memory, recompute the rest
    remat(fit)                  the least recomputation that fits the chip: fit_remat chooses

Names are the spec's named points (`q = x @ wq as query_proj`); an unknown name is an error that
lists the points the model has. Codegen emits the policy as `jax.checkpoint(step, policy=...)`.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.errors import Diagnostics, did_you_mean
from axdsl.ir import nodes as ir


def insert_remat(module: ir.Module) -> ir.Module:
    choice = module.target.remat
    policy: ir.RematPolicy = choice.value
    diags = Diagnostics()
    for model in module.models:
        points = named_points(model.root)
        for name in policy.save + policy.offload:
            if name not in points:
                hint = did_you_mean(name, points) or (
                    f"named points in {model.name}: {', '.join(sorted(points))}"
                    if points
                    else "name a value in a forward with `as`, e.g. `q = x @ wq as query_proj`"
                )
                diags.error(
                    module.report_at(choice.span),
                    f"remat names `{name}`, which is not a named point of {model.name}",
                    hint,
                )
        both = set(policy.save) & set(policy.offload)
        if both:
            diags.error(
                module.report_at(choice.span),
                f"`{sorted(both)[0]}` is both saved and offloaded",
                "list it once",
            )
    diags.raise_if_any()
    models = tuple(replace(m, root=attach_remat(m.root, policy)) for m in module.models)
    return replace(module, models=models)


def named_points(root: ir.Instance) -> set[str]:
    return {
        s.point
        for inst in root.walk()
        if inst.forward
        for s in inst.forward.body
        if isinstance(s, ir.Let) and s.point
    }


def attach_remat(inst: ir.Instance, policy: ir.RematPolicy) -> ir.Instance:
    """`inst` with `policy` on every repeated child below it (and nothing elsewhere)."""
    children = tuple(attach_remat(c, policy) for c in inst.children)
    return replace(inst, children=children, remat=policy if inst.repeat is not None else None)
