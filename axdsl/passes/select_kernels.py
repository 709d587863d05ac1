"""select_kernels: choose the kernel of every primitive call that has kernels (attention).

The profile lists each primitive's kernels in order of preference (profiles.toml `kernels`; for
attention, gpu: cudnn, xla; tpu: splash, xla; cpu: xla). Each primitive names its kernels and
states their constraints in its registry entry (`KernelRule`; for attention:
axdsl/primitives/attention.py, from jax's sources); the first kernel whose constraints hold for
*every* model of the spec wins (they share one generated function), and the reasons the others
were rejected are kept on the call (`ir.KernelChoice`) so codegen writes them as a comment.
`kernels(attention = K)` in a target block forces K, and a forced kernel whose constraints fail
is an error, not a silent fallback. Generated code holds only the chosen call; nothing branches
on the backend at run time.

    attention(q, k, v, causal = true)
      ->  attention(q, k, v, causal = true, kernel = "xla",
                    kernel_note = "cudnn not used: ... computes in f32; ...")
"""

from __future__ import annotations

from dataclasses import replace

from axdsl import primitives
from axdsl.errors import Diagnostics
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import map_forward, prims_of
from axdsl.passes.configure_target import kernel_rule
from axdsl.targets import profiles


def select_kernels(module: ir.Module) -> ir.Module:
    diags = Diagnostics()
    decisions: dict[tuple[str, str], ir.KernelChoice] = {}
    for inst in module.models[0].root.walk():
        for name in sorted({p.name for p in prims_of(inst) if primitives.get(p.name).has_kernels}):
            decisions[(inst.path, name)] = _decide(module, inst.path, name, diags)
    diags.raise_if_any()
    models = tuple(replace(m, root=_apply(m.root, decisions)) for m in module.models)
    return replace(module, models=models)


def _decide(module: ir.Module, path: str, name: str, diags: Diagnostics) -> ir.KernelChoice:
    """The first kernel that runs every call of `name` at `path` in every model."""
    sched = module.target
    rule = kernel_rule(name)
    choice = dict(sched.kernels)[name]
    forced = choice.value is not None  # kernels(op = K) in the matched target block
    candidates = (choice.value,) if forced else rule.preference(profiles()[sched.profile], name)
    calls = [
        (m, p)
        for m in module.models
        if (inst := _find(m.root, path)) is not None
        for p in prims_of(inst, name)
    ]
    notes: list[str] = []
    for kernel in candidates:
        reasons = [r for m, p in calls for r in rule.violations(kernel, p, m, sched)]
        if not reasons:
            return ir.KernelChoice(kernel, tuple(notes), choice.origin)
        notes.append(f"{kernel} not used: {reasons[0]}")
        if forced:
            diags.error(
                module.report_at(choice.span),
                f"{path}: the `{kernel}` {name} kernel cannot run this {name}: " f"{reasons[0]}",
                f"use kernels({name} = auto) to fall back",
            )
    return ir.KernelChoice(rule.fallback, tuple(notes), choice.origin)


def _find(root: ir.Instance, path: str) -> ir.Instance | None:
    """The instance at `path`; None in a model of another structure (codegen reports that)."""
    return next((i for i in root.walk() if i.path == path), None)


def _apply(inst: ir.Instance, decisions: dict[tuple[str, str], ir.KernelChoice]) -> ir.Instance:
    children = tuple(_apply(c, decisions) for c in inst.children)

    def mark(e: ir.TExpr) -> ir.TExpr:
        if isinstance(e, ir.Prim) and (inst.path, e.name) in decisions:
            return replace(e, kernel=decisions[(inst.path, e.name)])
        return e

    forward = map_forward(inst.forward, mark) if inst.forward is not None else None
    return replace(inst, children=children, forward=forward)
