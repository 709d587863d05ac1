"""The comments generated code carries about each target pass's decision: which kernel
select_kernels chose and why, what quantize_matmuls and insert_remat did, and which sharding rule
placed an activation. Every read of a pass's result by the emitters lives here, so an IR change
touches these few lines."""

from __future__ import annotations

from axdsl import primitives
from axdsl.codegen.pyexpr import py_value
from axdsl.errors import filled
from axdsl.primitives.base import KernelRule
from axdsl.ir import nodes as ir


def kernel_why(schedule: ir.Schedule | None, e: ir.Prim) -> str:
    """`select_kernels: cudnn, the first of gpu-h100's attention kernels that fits`."""
    choice = e.kernel or ir.KernelChoice(_kernel_rule(e.name).fallback)
    if schedule is None:
        return f"select_kernels: {choice.kernel} (no target schedule)"
    if choice.origin.from_spec:
        return (
            f"select_kernels: {choice.kernel}, "
            f"kernels({e.name} = {choice.kernel}) from {choice.origin}"
        )
    why = (
        f"select_kernels: {choice.kernel}, "
        f"the first of {schedule.profile}'s {e.name} kernels that fits"
    )
    return why + ("; the ones before it:" if choice.rejected else "")


def _kernel_rule(name: str) -> KernelRule:
    """The kernels of primitive `name`: a Prim without a chosen kernel is one that has them."""
    rule = primitives.get(name).kernels
    return filled(rule, f"the kernels of primitive {name}", "select_kernels")


def quant_why(schedule: ir.Schedule | None, fmt: str) -> str:
    """`quantize_matmuls: fp8 on blocks/* (profile gpu-h100)`."""
    if schedule is None:
        return f"quantize_matmuls: {fmt}"
    q = schedule.quantize
    return f"quantize_matmuls: {fmt} on {', '.join(q.value.layers)} ({q.origin})"


def remat_why(schedule: ir.Schedule | None, child: ir.Instance) -> str:
    """`insert_remat: save_dots (profile gpu-h100)`."""
    origin = f" ({schedule.remat.origin})" if schedule is not None else ""
    policy = filled(child.remat, f"the remat policy of {child.path}", "insert_remat")
    return f"insert_remat: {policy.kind}{origin}"


def unroll_why(schedule: ir.Schedule, child: ir.Instance) -> str:
    """`unroll(16) from profile cpu: the cfg.layers steps run unrolled, ...` (the count as code:
    the models of a spec share this line). unroll_repeats says why it pays."""
    steps = py_value(child.repeat)
    return (
        f"unroll({schedule.unroll.value}) from {schedule.unroll.origin}: the {steps} steps "
        f"run unrolled (no stacked residuals)"
    )


def remat_kind(child: ir.Instance) -> str | None:
    """The remat policy insert_remat set on a repeated child, or None when nothing is recomputed."""
    return (
        child.remat.kind
        if child.remat is not None and child.remat.kind is not ir.RematKind.NONE
        else None
    )


def sharding_why(
    schedule: ir.Schedule, logical: tuple[str | None, ...], spec: tuple[tuple[str, ...], ...]
) -> str:
    """`annotate_sharding: batch -> fsdp (rule batch -> stage, data, fsdp from profile cpu)`."""
    parts = []
    for axis, mesh in zip(logical, spec, strict=True):
        choice = schedule.rule_choice(axis) if axis else None
        if mesh and choice is not None:
            parts.append(
                f"{axis} -> {', '.join(mesh)} (rule {axis} -> {', '.join(choice.value)} "
                f"from {choice.origin})"
            )
    return "annotate_sharding: " + ("; ".join(parts) or "replicated")


def pipeline_why(schedule: ir.Schedule, child: ir.Instance) -> list[str]:
    """plan_pipeline's decision over a few comment lines: the directive, the split and the
    bubble (the layer count as code: the models of a spec share these lines)."""
    p: ir.PipelinePolicy = schedule.pipeline.value
    lines = [
        f"plan_pipeline: pipeline(microbatches = {p.microbatches}, repeats = {p.repeats}) from "
        f"{schedule.pipeline.origin}:",
        f"the {py_value(child.repeat)} layers in {p.stages} stages over the `stage` mesh axis, "
        f"{p.microbatches} micro-batches in flight",
    ]
    if p.repeats > 1:
        lines.append(f"(circular: each micro-batch passes through the stages {p.repeats} times);")
    lines.append(
        f"bubble (stages - 1) / (microbatches * repeats + stages - 1) = {p.stages - 1} / "
        f"{p.iterations} = {p.bubble:.1%}"
    )
    return lines
