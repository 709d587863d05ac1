"""The IR verifier: structural invariants every pass must keep. Tests run it after every pass.

A failure is a compiler bug, not a user mistake: it raises `InvalidIR` with the annotated IR.
It lives with the passes, not in axdsl/ir: it checks primitive calls against the registry, which
sits above the IR.
"""

from __future__ import annotations

import math

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.printer import print_module
from axdsl.ir.rewrite import prims_of, walk_expr
from axdsl.primitives.quantized import QUANTIZED


class InvalidIR(Exception):
    pass


def verify(module: ir.Module) -> None:
    problems: list[str] = []
    typed = "infer_shapes" in module.passes_run
    stacked = "stack_repeats" in module.passes_run
    for model in module.models:
        _verify_instance(model.root, "/", problems, typed, stacked, depth_in_repeat=0)
        _verify_schedule(module, model, problems)
    if problems:
        raise InvalidIR(
            "internal error: generated invalid IR\n"
            + "\n".join(problems)
            + "\n--- IR ---\n"
            + print_module(module)
        )


def _verify_instance(
    inst: ir.Instance,
    expected_path: str,
    problems: list[str],
    typed: bool,
    stacked: bool,
    depth_in_repeat: int,
) -> None:
    where = inst.path
    if inst.path != expected_path:
        problems.append(f"{where}: path should be {expected_path}")
    if inst.repeat is not None:
        depth_in_repeat += 1
    for kind, names in (
        ("param", [p.name for p in inst.params]),
        ("child", [c.name for c in inst.children]),
        ("hparam", [h.name for h in inst.hparams]),
    ):
        if len(set(names)) != len(names):
            problems.append(f"{where}: duplicate {kind} names {names}")
    for p in inst.params:
        if len(p.axes) != len(p.dims):
            problems.append(f"{where}: param {p.name} axes/dims rank mismatch")
        if any(d.size is None for d in p.dims):
            problems.append(f"{where}: param {p.name} has a free dim")
        if stacked and len(p.stack) != depth_in_repeat:
            problems.append(
                f"{where}: param {p.name} has {len(p.stack)} stack dims, expected {depth_in_repeat}"
            )
    if inst.forward is not None:
        _verify_forward(inst, problems, typed)
    for c in inst.children:
        base = inst.path if inst.path.endswith("/") else inst.path + "/"
        _verify_instance(c, base + c.name, problems, typed, stacked, depth_in_repeat)


def _verify_schedule(module: ir.Module, model: ir.Model, problems: list[str]) -> None:
    """Target passes: shardings name mesh axes once per param; remat sits on repeats only; a
    `quantized` primitive wraps one matmul; every attention has a kernel after select_kernels."""
    ran = set(module.passes_run)
    sched = module.schedule
    if "configure_target" in ran and sched is None:
        problems.append("configure_target ran but the module has no schedule")
    if sched is not None and math.prod(n for _, n in sched.mesh_sizes) != sched.chips:
        problems.append(f"mesh {sched.mesh_sizes} does not multiply to {sched.chips} chips")
    for inst in model.root.walk():
        for p in inst.params:
            if "annotate_sharding" in ran:
                if p.sharding is None or len(p.sharding) != len(p.full_dims):
                    problems.append(f"{inst.path}: param {p.name} sharding does not match its rank")
                else:
                    used = [a for axes in p.sharding for a in axes]
                    if len(set(used)) != len(used):
                        problems.append(f"{inst.path}: param {p.name} uses a mesh axis twice")
        if inst.remat is not None and inst.repeat is None:
            problems.append(f"{inst.path}: remat on a child that is not repeated")
        for e in prims_of(inst):
            if e.name == QUANTIZED:
                inner = e.args[0] if len(e.args) == 1 else None
                if not (
                    isinstance(inner, ir.Bin)
                    and inner.op is ir.BinOp.MATMUL
                    or isinstance(inner, ir.Prim)
                    and primitives.get(inner.name).contraction
                ):
                    problems.append(f"{inst.path}: quantized wraps something other than a matmul")
            if primitives.get(e.name).has_kernels and "select_kernels" in ran and e.kernel is None:
                problems.append(f"{inst.path}: {e.name} without a kernel after select_kernels")


def _verify_forward(inst: ir.Instance, problems: list[str], typed: bool) -> None:
    defined = {a.name for a in inst.fwd.args}
    body = inst.fwd.body
    if not body or not isinstance(body[-1], ir.Ret):
        problems.append(f"{inst.path}: forward does not end in a return")
    for s in body:
        for ref in walk_expr(s.value):
            if isinstance(ref, ir.Ref) and ref.kind is ir.RefKind.LOCAL and ref.name not in defined:
                problems.append(f"{inst.path}: `{ref.name}` used before definition")
            if (
                isinstance(ref, ir.Ref)
                and ref.kind is ir.RefKind.PARAM
                and inst.param(ref.name) is None
            ):
                problems.append(f"{inst.path}: unknown param `{ref.name}`")
            if isinstance(ref, ir.CallChild) and inst.child(ref.child) is None:
                problems.append(f"{inst.path}: unknown child `{ref.child}`")
            if isinstance(ref, ir.Prim):
                _verify_prim(inst, ref, problems)
            if typed and ref.type is None:
                problems.append(f"{inst.path}: untyped expression {type(ref).__name__}")
        if isinstance(s, ir.Let):
            defined.add(s.name)


def _verify_prim(inst: ir.Instance, e: ir.Prim, problems: list[str]) -> None:
    """A primitive call matches its registry entry: known name, its attributes, its operands."""
    if e.name not in primitives.REGISTRY:
        problems.append(f"{inst.path}: unknown primitive `{e.name}`")
        return
    sig = primitives.get(e.name).signature
    if tuple(k for k, _ in e.attrs) != tuple(s.name for s in sig.statics):
        problems.append(
            f"{inst.path}: `{e.name}` has attributes {[k for k, _ in e.attrs]}, its signature "
            f"{[s.name for s in sig.statics]}"
        )
    if not set(e.optional) <= set(sig.optional_tensors):
        problems.append(f"{inst.path}: `{e.name}` has unknown optional operands {e.optional}")
    if sig.tensors and len(e.args) != len(sig.tensors) + len(e.optional):
        problems.append(f"{inst.path}: `{e.name}` has {len(e.args)} operands")
