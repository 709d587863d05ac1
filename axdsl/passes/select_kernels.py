"""select_kernels: choose the attention kernel for each `attention(...)` on this target.

The profile lists kernels in order of preference (gpu: cudnn, xla; tpu: splash, xla; cpu: xla).
Each kernel states its constraints below; the first whose constraints hold for *every* model of
the spec wins (they share one generated function), and the reasons the others were rejected are
kept on the primitive so codegen writes them as a comment. `kernels(attention = K)` in a target
block forces K, and a forced kernel whose constraints fail is an error, not a silent fallback.
Generated code holds only the chosen call; nothing branches on the backend at run time.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.errors import Diagnostics
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import map_forward, walk_expr
from axdsl.targets import profiles

SPLASH_BLOCK = 128  # TPU lane width: splash tiles head_dim and the sequence by 128


def select_kernels(module: ir.Module, target=None) -> ir.Module:
    sched = module.schedule
    choice = dict(sched.kernels)["attention"]
    preference = profiles()[sched.profile].attention
    diags = Diagnostics()
    decisions: dict[str, tuple[str, str]] = {}
    for inst in module.models[0].root.walk():
        if inst.forward is None or not any(
                isinstance(e, ir.Prim) and e.name == "attention"
                for s in inst.forward.body for e in walk_expr(s.value)):
            continue
        per_model = [_find(m.root, inst.path) for m in module.models]
        candidates = preference if choice.value == "auto" else (choice.value,)
        notes = []
        for kernel in candidates:
            reasons = [r for m, i in zip(module.models, per_model) for r in _violations(kernel, m, i)]
            if not reasons:
                break
            notes.append(f"{kernel} not used: {reasons[0]}")
            if choice.value != "auto":
                diags.error(choice.span, f"{inst.path}: the `{kernel}` attention kernel cannot run this "
                                         f"attention: {reasons[0]}", "use kernels(attention = auto) to fall back")
        else:
            kernel = "xla"
        decisions[inst.path] = (kernel, "; ".join(notes))
    diags.raise_if_any()
    models = tuple(replace(m, root=_apply(m.root, decisions)) for m in module.models)
    return replace(module, models=models)


def _find(root: ir.Instance, path: str) -> ir.Instance:
    return next(i for i in root.walk() if i.path == path)


def _attention_prims(inst: ir.Instance) -> list[ir.Prim]:
    return [e for s in inst.forward.body for e in walk_expr(s.value)
            if isinstance(e, ir.Prim) and e.name == "attention"]


def _compute_dtype(model: ir.Model) -> str:
    h = model.root.hparam("dtype")
    return h.value.value.name if h is not None and isinstance(h.value.value, ir.DType) else "f32"


def _violations(kernel: str, model: ir.Model, inst: ir.Instance) -> list[str]:
    """Why `kernel` cannot run this instance's attention for `model`; empty when it can."""
    out = []
    dtype = _compute_dtype(model)
    max_seq = model.root.hparam("max_seq")
    for prim in _attention_prims(inst):
        head_dim = prim.args[0].type.dims[-1].size
        has_mask = "mask" in (prim.attr("optional") or ())
        if kernel == "cudnn":
            if dtype not in ("bf16", "f16"):
                out.append(f"{model.name} computes in {dtype}; cuDNN flash attention needs bf16 or f16")
            if head_dim is None or head_dim > 128 or head_dim % 8:
                out.append(f"{model.name} has head_dim {head_dim}; cuDNN needs a multiple of 8 up to 128")
            if has_mask:
                out.append("an explicit mask; cuDNN runs causal and sliding-window masks only")
        elif kernel == "splash":
            if dtype not in ("bf16", "f32"):
                out.append(f"{model.name} computes in {dtype}; splash attention takes bf16 or f32")
            if head_dim is None or head_dim % SPLASH_BLOCK:
                out.append(f"{model.name} has head_dim {head_dim}; splash needs a multiple of {SPLASH_BLOCK}")
            if max_seq is not None and max_seq.value.value % SPLASH_BLOCK:
                out.append(f"{model.name} has max_seq {max_seq.value.value}; splash needs a multiple of {SPLASH_BLOCK}")
            if has_mask:
                out.append("an explicit mask; splash runs causal and sliding-window masks only")
    return out


def _apply(inst: ir.Instance, decisions: dict[str, tuple[str, str]]) -> ir.Instance:
    children = tuple(_apply(c, decisions) for c in inst.children)
    forward = inst.forward
    if inst.path in decisions:
        kernel, note = decisions[inst.path]

        def mark(e: ir.TExpr) -> ir.TExpr:
            if isinstance(e, ir.Prim) and e.name == "attention":
                return replace(e, attrs=e.attrs + (("kernel", kernel), ("kernel_note", note)))
            return e

        forward = map_forward(forward, mark)
    return replace(inst, children=children, forward=forward)
