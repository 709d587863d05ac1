"""annotate_sharding: give every parameter a PartitionSpec from the target's logical-axis rules.

    param wq: [layers, dim, heads, head_dim] axes(layers, embed, heads, head_dim)
    rules: embed -> fsdp, heads -> model            mesh: fsdp = 4, model = 2
                                              ->    sharding (None, fsdp, model, None)

Data, FSDP, tensor, sequence and expert parallelism are all just rules. A mesh axis of size 1
is dropped from specs (it shards nothing); the -1 axis is always kept, since its size follows the
chip count. A parameter that would use one mesh axis twice, or a dim its mesh axes do not divide,
is a compile-time error located at the rule (or at the parameter when the rule is a default).
Divisibility is required of the spec's first model, the one a target block is written for; a
later model the mesh does not divide (a test-sized variant on a 1024-chip mesh) is left out of
that target's build, and the schedule says so (`Schedule.left_out`, shown by dump and aot).

Activations: `activation_spec` maps the dims of a layer-boundary activation to mesh axes with the
same rules, skipping a mesh axis already used by an earlier dim (batch takes `fsdp` before embed
can), as MaxText's fallback rules do; FSDP keeps parameters sharded at rest and activations
sharded over the batch.
"""

from __future__ import annotations

import math
from dataclasses import replace

from axdsl.errors import Diagnostics
from axdsl.ir import nodes as ir


def annotate_sharding(module: ir.Module) -> ir.Module:
    sched = module.target
    diags = Diagnostics()
    models, left_out = [], []
    for i, model in enumerate(module.models):
        undivided: dict[tuple[str, int], list[str]] = {}
        root = _annotate(model.root, sched, diags, undivided)
        if undivided and i > 0:  # a variant (a test-sized model) that this mesh cannot shard
            left_out.append((model.name, _left_out_reason(sched, undivided)))
            continue
        _report_undivided(model, sched, undivided, diags)
        models.append(replace(model, root=root))
    diags.raise_if_any()
    sched = replace(sched, left_out=tuple(left_out))
    return replace(module, models=tuple(models), schedule=sched)


def _left_out_reason(sched: ir.Schedule, undivided: dict) -> str:
    """Why a model is left out of the target's build: its first undivided logical axis."""
    (logical, size), paths = next(iter(undivided.items()))
    how = " x ".join(f"{a}={sched.size(a)}" for a in sched.kept_axes(logical))
    return f"its `{logical}` of {size} ({paths[0]}) does not split over {how}"


def _report_undivided(
    model: ir.Model, sched: ir.Schedule, undivided: dict, diags: Diagnostics
) -> None:
    """One error per logical axis and size, at the rule when the spec wrote it, else at the
    model."""
    for (logical, size), paths in undivided.items():
        axes = sched.kept_axes(logical)
        ways = math.prod(sched.size(a) for a in axes)
        how = " x ".join(f"{a}={sched.size(a)}" for a in axes)
        rule = sched.rule_choice(logical)
        where = rule.span if rule is not None and rule.span is not None else model.span
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        diags.error(
            where,
            f"{model.name}: logical axis `{logical}` has size {size}, which {how} "
            f"({ways} shards on {sched.name}) does not divide (parameters {shown})",
            f"change the mesh, map `{logical}` to other mesh axes in rules(...), or pick a size "
            f"that is a multiple of {ways}",
        )


def _annotate(
    inst: ir.Instance, sched: ir.Schedule, diags: Diagnostics, undivided: dict
) -> ir.Instance:
    params = tuple(_shard_param(inst, p, sched, diags, undivided) for p in inst.params)
    children = tuple(_annotate(c, sched, diags, undivided) for c in inst.children)
    return replace(inst, params=params, children=children)


def _shard_param(
    inst: ir.Instance, p: ir.Param, sched: ir.Schedule, diags: Diagnostics, undivided: dict
) -> ir.Param:
    spec: list[tuple[str, ...]] = []
    seen: dict[str, str] = {}
    path = f"{inst.path.rstrip('/')}/{p.name}"
    for dim, logical in zip(p.full_dims, p.full_axes, strict=True):
        axes = sched.kept_axes(logical)
        for a in axes:
            if a in seen:
                diags.error(
                    _rule_span(sched, (logical, seen[a])) or p.span,
                    f"mesh axis `{a}` is used twice by parameter {path}: by its "
                    f"`{seen[a]}` and `{logical}` dims ({sched.name})",
                    f"map `{seen[a]}` and `{logical}` to different mesh axes in rules(...)",
                )
            seen[a] = logical
        ways = math.prod(sched.size(a) for a in axes)
        if dim.size is not None and ways > 1 and dim.size % ways:
            undivided.setdefault((logical, dim.size), []).append(path)
        spec.append(axes)
    return replace(p, sharding=tuple(spec))


def _rule_span(sched: ir.Schedule, logicals: tuple[str, ...]):
    """Where the user wrote a rule for one of `logicals` (None when both come from the profile)."""
    for logical in logicals:
        rule = sched.rule_choice(logical)
        if rule is not None and rule.span is not None:
            return rule.span
    return None


def activation_spec(
    sched: ir.Schedule, logical_axes: tuple[str | None, ...]
) -> tuple[tuple[str, ...], ...]:
    """Mesh axes for an activation's dims: rules in dim order, each mesh axis used once."""
    used: set[str] = set()
    out = []
    for logical in logical_axes:
        axes = tuple(a for a in sched.kept_axes(logical) if a not in used) if logical else ()
        used.update(axes)
        out.append(axes)
    return tuple(out)
