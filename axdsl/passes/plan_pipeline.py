"""plan_pipeline: check a target's pipeline(...) against the model and record how it runs.

    target "tpu-v5p-*" { mesh(stage = 4, fsdp = -1)  pipeline(microbatches = 8, repeats = 2) }

Pipeline parallelism splits the model's main repeat of layers (the root's repeated child with
the most layers: DecoderLM's `blocks`) into `stages` consecutive pieces over the `stage` mesh
axis. The batch is cut into `microbatches` pieces that flow through the stages; codegen prints a
`pipeline(...)` call (kernels/pipeline.py): a vmap of one stage's layers over the stages, one
jax.lax.scan over the iterations, each stage's output rolled to the next stage. With `repeats` R
> 1 the schedule is circular (MaxText's): stage s runs layers (r * stages + s) * per_stage ... for
every repeat r, and a micro-batch passes through the stages R times. The layers outside the repeat
(embedding, head, DeepSeek's dense blocks) run as before, with `stage` splitting the batch.

The bubble is the fraction of the loop each stage idles, (stages - 1) / (microbatches * repeats +
stages - 1): MaxText's formula for its circular pipeline (docs/guides/optimization/sharding.md),
GPipe's when repeats = 1. It is a schedule: the loss is a mean over the micro-batches, the same up
to float rounding.

    before:  pipeline(microbatches = 4, repeats = 2)  # target "cpu-8"
             /blocks : Block x8 carry((stage, data), _, _)
    after:   pipeline(microbatches = 4, repeats = 2) over 2 stages of `stage`: /blocks
               (lm 8 = 2 x 2 x 2 layers), 9 iterations, bubble 11.1%
             /blocks : Block x8 carry(data, _, _)      its weights' `layers` dim on `stage`

The repeat's stacked weights live on their stage (`layers` dim over `stage`: each chip keeps
its stage's layers; with repeats > 1 the loop regroups them once per step), and its carry inside
the pipeline drops `stage` (the stage dim the vmap adds takes it).

Layers that add an auxiliary loss (MoE) run in the stages: plan_functions marks them staged,
and their router returns the loss's statistics, means over one micro-batch (moe_aux_stats). The
pipeline averages each layer's over the micro-batches it ran, leaving out the bubble, and
computes the loss from the means: the whole batch's. A mean of the micro-batches' losses would
differ, the balancing loss being a product of two batch means. DeepSeek's bias balancing
(balance_rate) goes the same way (moe_balance_stats): a term of loss 0 whose gradient for the
bias is the micro-batch's load surplus times the micro-batches, averaged by the pipeline: the
whole batch's surplus, the bubble's left out (moe_balance's custom_vjp would count it).

What cannot run is a located error at the directive:
- the `stage` mesh axis has one shard;
- no repeated child of the root, or one whose call passes an input without the batch dim (T5's
  relative bias), or whose layers draw random numbers (dropout), or add an auxiliary loss in a
  repeat nested in a layer (its scan sums losses);
- layers that do not split into stages x repeats equal pieces;
- a step batch that microbatches do not divide, fewer microbatches than stages (the circular
  schedule feeds a micro-batch back to the first stage only after it left the last one; without
  repeats most of the loop would be bubble, as MaxText also requires), a micro-batch that does not
  split over the batch's mesh axes.

With context(...) in the same block, attention inside the stages splits the sequence too: its
shard_map leaves the `stage` axis to the pipeline's vmap (plan_functions marks those layers).

The decode path (KV cache) runs the layers unpipelined, as before.
"""

from __future__ import annotations

import math
from dataclasses import replace

from axdsl import primitives
from axdsl.errors import Diagnostics, Span
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import forward_exprs, prims_of
from axdsl.passes.configure_target import TargetDirective, axis_shards


def plan_pipeline(module: ir.Module) -> ir.Module:
    sched = module.schedule
    if sched is None or sched.pipeline.value is None:
        return module
    policy: ir.PipelinePolicy = sched.pipeline.value
    at = module.report_at(sched.pipeline.span)
    diags = Diagnostics()
    stages = _stages(sched, at, diags)
    child = _main_repeat(module, at, diags)
    diags.raise_if_any()
    assert child is not None  # _main_repeat reported an error otherwise
    planned = replace(policy, stages=stages, child=child)
    layers = tuple((m.name, _layers(m, child)) for m in module.models)
    planned = replace(planned, layers=layers)
    for model in module.models:
        _check_model(model, planned, at, diags)
    _check_batch(module, planned, at, diags)
    diags.raise_if_any()
    models = tuple(replace(m, root=_place(m.root, child)) for m in module.models)
    resolved = replace(sched.pipeline, value=planned)
    return replace(module, models=models, schedule=replace(sched, pipeline=resolved))


def _stages(sched: ir.Schedule, at: Span, diags: Diagnostics) -> int:
    """The `stage` mesh axis's size, which must be above 1."""
    return axis_shards(sched, ir.STAGE_AXIS, TargetDirective.PIPELINE, "the layers", at, diags)


def _main_repeat(module: ir.Module, at: Span, diags: Diagnostics) -> str | None:
    """The path of the root's repeated child with the most layers in the first model (the models
    of a spec share one structure, so the others have the same child)."""
    root = module.models[0].root
    repeats = [c for c in root.children if c.repeat is not None]
    if not repeats:
        diags.error(
            at,
            f"pipeline(...) splits a repeat(...) of layers, but {root.layer} has none among its "
            "children",
            "remove pipeline(...) from this target block",
        )
        return None
    return max(repeats, key=_layer_count).path


def _layer_count(inst: ir.Instance) -> int:
    """Layers one repeated child runs: its steps, times the layers of a pattern's step."""
    steps = int(ir.plain(inst.repeat))
    return steps * (len(inst.children) if inst.pattern else 1)


def _layers(model: ir.Model, path: str) -> int:
    """The scan steps of the repeated child at `path` (a pattern's groups): what is split."""
    child = model.root.stack_of(path)
    assert child is not None and child.repeat is not None  # _main_repeat found it
    return int(ir.plain(child.repeat))


def _check_model(model: ir.Model, policy: ir.PipelinePolicy, at: Span, diags: Diagnostics) -> None:
    """The repeat splits evenly, and its call and layers can run as a pipeline."""
    root = model.root
    child = root.stack_of(policy.child)
    assert child is not None
    steps = dict(policy.layers)[model.name]
    pieces = policy.stages * policy.repeats
    if steps % pieces:
        fits = [r for r in range(1, steps + 1) if steps % (policy.stages * r) == 0]
        hint = (
            f"use repeats = {fits[0]}"
            + (f" (or {', '.join(map(str, fits[1:4]))})" if fits[1:] else "")
            if fits
            else f"use a `stage` mesh axis that divides {steps}"
        )
        diags.error(
            at,
            f"{model.name}: {child.name} has {steps} {'steps' if child.pattern else 'layers'}, "
            f"which do not split into {policy.stages} stages x {policy.repeats} repeats "
            f"({pieces} equal pieces)",
            hint,
        )
    _check_call(model, child, at, diags)


def _check_call(model: ir.Model, child: ir.Instance, at: Span, diags: Diagnostics) -> None:
    """The root passes the repeat its carried [B, ...] activation and other inputs that start
    with the batch (a packed row's segment ids: cut into the same micro-batches), its layers draw
    no random numbers (no keys are passed to the stages yet), and their auxiliary losses can be
    carried."""
    calls = [
        e
        for e in forward_exprs(model.root)
        if isinstance(e, ir.CallChild) and e.child == child.name
    ]
    for c in calls:
        batch = ir.tensor_type(c.args[0]).dims[0]
        for side in c.args[1:]:
            dims = ir.tensor_type(side).dims
            if not dims or not dims[0].same(batch):
                diags.error(
                    at,
                    f"pipeline(...) cuts {child.name}'s inputs into micro-batches, but "
                    f"{model.root.layer} passes it one without the batch dim "
                    f"[{', '.join(str(d) for d in dims)}]",
                    "remove pipeline(...) from this target block",
                )
                return
    placed = child.carry_sharding
    if placed is None or not placed.logical or placed.logical[0] != "batch":
        diags.error(
            at,
            f"pipeline(...) cuts the batch into micro-batches, but {child.name}'s carried "
            "activation does not start with the batch",
            "remove pipeline(...) from this target block",
        )
    rng = next((p for inst in child.walk() for p in prims_of(inst) if _flag(p, "uses_rng")), None)
    if rng is not None:
        diags.error(
            at,
            f"pipeline(...) cannot run {child.name}: its `{rng.name}` draws random numbers, and "
            "the pipeline passes no keys to its stages yet",
            "remove pipeline(...) from this target block",
        )
    _check_aux(child, at, diags)


def _check_aux(child: ir.Instance, at: Span, diags: Diagnostics) -> None:
    """The layers' auxiliary losses (MoE) can be carried: each is returned as statistics that
    the pipeline averages over the micro-batches (kernels/pipeline.py). Not so in a repeat
    nested in a layer, whose scan sums losses."""
    for inst in child.walk():
        nested = inst.path != child.path and any(
            a.repeat is not None
            for a in child.walk()
            if a.path != child.path and (inst.path + "/").startswith(a.path + "/")
        )
        found = next((p for p in prims_of(inst) if _flag(p, "aux_loss")), None)
        if nested and found is not None:
            diags.error(
                at,
                f"pipeline(...) cannot run {child.name}: its `{found.name}` at {inst.path} adds "
                "an auxiliary loss in a repeat inside the pipelined layers, whose scan sums "
                "losses, not the statistics the pipeline averages",
                "remove pipeline(...) from this target block",
            )
            return


def _flag(prim: ir.Prim, flag: str) -> bool:
    return bool(getattr(primitives.get(prim.name), flag))


def _check_batch(
    module: ir.Module, policy: ir.PipelinePolicy, at: Span, diags: Diagnostics
) -> None:
    """A train step's batch cuts into `microbatches` equal pieces, at least one per stage, each
    splitting over the mesh axes the batch takes inside a stage."""
    m = policy.microbatches
    if m < policy.stages:
        why = (
            "a micro-batch would be due back at the first stage before it left the last one"
            if policy.repeats > 1
            else f"the stages would idle {replace(policy, microbatches=m).bubble:.0%} of the loop"
        )
        diags.error(
            at,
            f"pipeline(microbatches = {m}) feeds fewer micro-batches than the {policy.stages} "
            f"stages: {why}",
            f"use microbatches = {2 * policy.stages} (twice the stages keeps the bubble small)",
        )
        return
    train = module.train
    accumulate = int(train.get("microbatches"))
    batch = int(train.get("batch")) // accumulate
    if batch % m:
        diags.error(
            at,
            f"a step's batch of {batch} does not cut into {m} micro-batches",
            f"use a microbatches that divides {batch}, or train with a batch that is a "
            f"multiple of {m * accumulate}",
        )
        return
    sched = module.target
    axes = [a for a in sched.kept_axes("batch") if a != ir.STAGE_AXIS]
    ways = math.prod(sched.size(a) for a in axes)
    if (batch // m) % ways:
        diags.error(
            at,
            f"a micro-batch of {batch // m} does not split over "
            f"{' x '.join(f'{a}={sched.size(a)}' for a in axes)} ({ways} shards in a stage)",
            f"train with a batch that is a multiple of {m * ways * accumulate}",
        )


def _place(root: ir.Instance, path: str) -> ir.Instance:
    """The pipelined repeat's weights with their `layers` dim on `stage`, and its carry without
    `stage` (inside the pipeline the stage dim holds it)."""

    def visit(inst: ir.Instance, below: bool) -> ir.Instance:
        inside = below or inst.path == path
        params = tuple(_on_stage(p) for p in inst.params) if inside else inst.params
        children = tuple(visit(c, inside) for c in inst.children)
        placed = inst.carry_sharding
        if inst.path == path and placed is not None:
            mesh = tuple(tuple(a for a in axes if a != ir.STAGE_AXIS) for axes in placed.mesh)
            placed = replace(placed, mesh=mesh)
        return replace(inst, params=params, children=children, carry_sharding=placed)

    return visit(root, False)


def _on_stage(p: ir.Param) -> ir.Param:
    """A stacked weight of the pipelined repeat: its outermost `layers` dim over `stage`."""
    assert p.stack and p.sharding is not None  # stack_repeats and annotate_sharding ran
    first = p.sharding[0]
    if ir.STAGE_AXIS in first:
        return p
    return replace(p, sharding=((ir.STAGE_AXIS, *first), *p.sharding[1:]))
