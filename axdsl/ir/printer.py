"""The canonical text form of the IR (`axdsl dump`), stable enough for golden tests.

Every resolved hyperparameter is shown with where its value came from, in the spirit of
AXLearn's golden configs; forward bodies are shown with their inferred types.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.ir.nodes import DType, LayerValue, RepeatValue


def print_module(module: ir.Module) -> str:
    lines = [f"# spec {module.spec} sha256={module.sha256[:16]} target={module.target}",
             f"# passes: {', '.join(module.passes_run) or '(none)'}"]
    for model in module.models:
        lines.append(f"model {model.name}")
        _instance(model.root, 1, lines)
    if module.train is not None:
        lines.append("train")
        lines.extend(_section(module.train))
    for t in module.targets:
        lines.append(f'target "{t.pattern}"')
        lines.extend(_section(t))
    if module.schedule is not None:
        lines.extend(schedule_lines(module.schedule))
    if module.training is not None:
        lines.append("training")
        for name, c in module.training.settings:
            lines.append(f"  {name} = {_train_value(c.value)}  # {c.origin}")
    return "\n".join(lines) + "\n"


def schedule_lines(s: ir.TargetConfig) -> list[str]:
    """The resolved target schedule: every setting with where it came from."""
    matched = f'target "{s.matched}" at {s.matched_span}' if s.matched else "no target block matched"
    sizes = ", ".join(f"{a}={n}" for a, n in s.mesh_sizes)
    written = ", ".join(f"{a} = {n}" for a, n in s.mesh.value)
    lines = [f"schedule {s.name}: profile {s.profile}, {s.chips} chips; {matched}",
             f"  mesh({written}) -> {sizes}  # {s.mesh.origin}"]
    for logical, c in s.rules:
        axes = "[" + ", ".join(c.value) + "]"
        lines.append(f"  rule {logical} -> {axes}  # {c.origin}")
    r = s.remat.value
    parts = [r.kind] if r.kind in ("none", "full", "save_dots") else \
        [f"save = [{', '.join(r.save)}]", f"offload = [{', '.join(r.offload)}]"][: 2 if r.offload else 1]
    lines.append(f"  remat({', '.join(parts)})  # {s.remat.origin}")
    q = s.quantize.value
    layers = ", ".join(f'"{p}"' for p in q.layers)
    lines.append(f"  quantize({q.format}, layers = [{layers}])  # {s.quantize.origin}")
    for op, c in s.kernels:
        lines.append(f"  kernels({op} = {c.value})  # {c.origin}")
    return lines


def value_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, DType):
        return v.name
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, LayerValue):
        args = ", ".join(f"{k} = {value_text(a.value)}" for k, a in v.args)
        return f"{v.layer}({args})"
    if isinstance(v, RepeatValue):
        return f"repeat({value_text(v.count.value)}, {value_text(v.layer)})"
    if isinstance(v, tuple):
        return "[" + ", ".join(value_text(x) for x in v) + "]"
    return repr(v)


def _dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _instance(inst: ir.Instance, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    rep = f" x{inst.repeat.value}" if inst.repeat is not None else ""
    if inst.remat is not None:
        rep += f" remat({inst.remat.kind})"
    lines.append(f"{pad}{inst.path} : {inst.layer}{rep}")
    for h in inst.hparams:
        lines.append(f"{pad}  {h.name}: {h.type} = {value_text(h.value.value)}  # {h.origin}")
    for p in inst.params:
        stack = _dims(p.stack) + " + " if p.stack else ""
        init = f"{p.init.kind}({', '.join(value_text(a.value) for a in p.init.args)})"
        shard = ""
        if p.sharding is not None:
            shard = " shard(" + ", ".join("+".join(a) if a else "_" for a in p.sharding) + ")"
        lines.append(f"{pad}  param {p.name}: {stack}{_dims(p.dims)} axes({', '.join(p.full_axes)}) "
                     f"init {init} {p.dtype.name}{shard}")
    if inst.forward is not None:
        f = inst.forward
        args = ", ".join(f"{a.name}: {_dims(a.dims)}" for a in f.args)
        lines.append(f"{pad}  forward({args}) -> {_dims(f.result)}")
        for s in f.body:
            text = expr_text(s.value)
            ty = f"  : {s.value.type}" if s.value.type is not None else ""
            if isinstance(s, ir.Let):
                point = f" as {s.point}" if s.point else ""
                lines.append(f"{pad}    {s.name} = {text}{point}{ty}")
            else:
                lines.append(f"{pad}    return {text}{ty}")
    for c in inst.children:
        _instance(c, depth + 1, lines)


def expr_text(e: ir.TExpr) -> str:
    if isinstance(e, ir.Ref):
        if e.kind == "child_param":
            return f"{e.owner}.{e.name}"
        if e.kind == "hparam":
            return value_text(e.value.value)
        return e.name
    if isinstance(e, ir.Lit):
        return value_text(e.value)
    if isinstance(e, ir.Bin):
        return f"({expr_text(e.left)} {e.op} {expr_text(e.right)})"
    if isinstance(e, ir.Neg):
        return f"-{expr_text(e.operand)}"
    if isinstance(e, ir.CallChild):
        return f"{e.child}({', '.join(expr_text(a) for a in e.args)})"
    if e.name == "quantized":
        return f"{e.attr('format')}({expr_text(e.args[0])})"
    attrs = []
    for k, v in e.attrs:
        if k in ("optional", "operands", "dims", "out") or v is None or v == "":
            continue
        if isinstance(v, ir.Dim):
            attrs.append(f"{k} = {v}")
        elif isinstance(v, str):
            attrs.append(f'{k} = "{v}"')
        else:
            attrs.append(f"{k} = {value_text(v.value)}")
    if e.name == "einsum":
        ops = ", ".join(" ".join(o) for o in e.attr("operands"))
        attrs = [f'"{ops} -> {" ".join(e.attr("out"))}"']
    args = [expr_text(a) for a in e.args] + attrs
    return f"{e.name}({', '.join(args)})"


def _section(s: ir.Section) -> list[str]:
    out = []
    for name, value, _ in s.settings:
        out.append(f"  {name} = {_section_value(value)}")
    for d in s.directives:
        parts = [_section_value(a) for a, _ in d.args] + [f"{k} = {_section_value(v)}" for k, v, _ in d.kwargs]
        out.append(f"  {d.name}({', '.join(parts)})")
    return out


def _section_value(v) -> str:
    if isinstance(v, tuple) and v and v[0] == "name":
        return v[1]
    if isinstance(v, tuple) and v and v[0] == "call":
        parts = [_section_value(a) for a in v[2]] + [f"{k} = {_section_value(x)}" for k, x in v[3]]
        return f"{v[1]}({', '.join(parts)})"
    if isinstance(v, tuple):
        return "[" + ", ".join(_section_value(x) for x in v) + "]"
    return value_text(v)


def _train_value(v) -> str:
    """A resolved train setting: `adamw(lr = 0.0003, ...)`, `tokens(path = "x.bin")`, a number."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], tuple):
        return f"{v[0]}({', '.join(f'{k} = {value_text(x)}' for k, x in v[1])})"
    if isinstance(v, tuple):
        return "(" + ", ".join(f"{k} = {value_text(x)}" for k, x in v) + ")"
    return value_text(v)
