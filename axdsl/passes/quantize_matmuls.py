"""quantize_matmuls: run matmuls that have a parameter operand in fp8 or int8, by layer path.

    quantize(fp8, layers = "blocks/*")      /blocks/attn: q = x @ wq   ->   q = fp8(x @ wq)

The matmul is wrapped in a `quantized` primitive carrying the format; codegen emits it through a
small helper in the generated model (`fp8_einsum` or `int8_einsum`) whose numerics are documented
there. Matmuls between two activations (attention scores), MoE router projections (a parameter
with an `experts` axis: routing decisions are sensitive to rounding) and layers outside the
patterns (by default the embedding and the output head) stay in the compute dtype.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import RefKind
from axdsl.ir.rewrite import map_forward
from axdsl.primitives.quantized import wrap


def quantize_matmuls(module: ir.Module) -> ir.Module:
    policy: ir.QuantPolicy = module.target.quantize.value
    if policy.format is ir.QuantFormat.NONE:
        return module
    models = tuple(replace(m, root=_visit(m.root, policy)) for m in module.models)
    return replace(module, models=models)


def selected(path: str, policy: ir.QuantPolicy) -> bool:
    rel = path.strip("/")
    return any(fnmatchcase(rel, pat) for pat in policy.layers)


def _visit(inst: ir.Instance, policy: ir.QuantPolicy) -> ir.Instance:
    children = tuple(_visit(c, policy) for c in inst.children)
    forward = inst.forward
    if forward is not None and selected(inst.path, policy):
        routers = {p.name for p in inst.params if "experts" in p.axes}
        forward = map_forward(forward, lambda e: _wrap(e, policy.format, routers))
    return replace(inst, children=children, forward=forward)


def _param_name(e: ir.TExpr) -> str | None:
    return (
        e.name if isinstance(e, ir.Ref) and e.kind in (RefKind.PARAM, RefKind.CHILD_PARAM) else None
    )


def _wrap(e: ir.TExpr, fmt: ir.QuantFormat, routers: set[str]) -> ir.TExpr:
    if isinstance(e, ir.Bin) and e.op == "@":
        operands = (e.left, e.right)
    elif isinstance(e, ir.Prim) and primitives.get(e.name).contraction and len(e.args) == 2:
        operands = e.args
    else:
        return e
    names = [_param_name(o) for o in operands]
    if any(names) and not any(n in routers for n in names if n):
        return wrap(e, fmt)
    return e
