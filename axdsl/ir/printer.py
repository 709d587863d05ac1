"""The canonical text form of the IR (`axdsl dump`), stable enough for golden tests.

Every resolved hyperparameter is shown with where its value came from, in the spirit of
AXLearn's golden configs; forward bodies are shown with their inferred types.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.ir.expr import Const, Field, spec_text
from axdsl.ir.nodes import DType, LayerValue, PatternValue, RepeatValue


def print_module(module: ir.Module) -> str:
    lines = [
        f"# spec {module.spec} sha256={module.sha256[:16]} target={module.target_name}",
        f"# passes: {', '.join(module.passes_run) or '(none)'}",
    ]
    for model in module.models:
        lines.append(f"model {model.name}")
        _instance(model.root, 1, lines)
        lines.extend(plan_lines(model))
    if module.train_block is not None:
        lines.append("train")
        lines.extend(_section(module.train_block))
    for t in module.target_blocks:
        lines.append(f'target "{t.pattern}"')
        lines.extend(_section(t))
    if module.schedule is not None:
        lines.extend(schedule_lines(module.schedule))
    if module.config is not None:
        lines.append(f"config {', '.join(module.config.fields)}")
        if module.config.fixed:
            lines.append(f"  fixed {', '.join(module.config.fixed)}")
    if module.helpers:
        lines.append(f"helpers {', '.join(module.helpers)}")
    if module.train_settings is not None:
        lines.append("training")
        for name, c in module.train_settings.settings:
            lines.append(f"  {name} = {_train_value(c.value)}  # {c.origin}")
    return "\n".join(lines) + "\n"


def schedule_lines(s: ir.Schedule) -> list[str]:
    """The resolved target schedule: every setting with where it came from."""
    matched = (
        f'target "{s.matched}" at {s.matched_span}' if s.matched else "no target block matched"
    )
    sizes = ", ".join(f"{a}={n}" for a, n in s.mesh_sizes)
    written = ", ".join(f"{a} = {n}" for a, n in s.mesh.value)
    lines = [
        f"schedule {s.name}: profile {s.profile}, {s.chips} chips; {matched}",
        f"  mesh({written}) -> {sizes}  # {s.mesh.origin}",
    ]
    for logical, c in s.rules:
        axes = "[" + ", ".join(c.value) + "]"
        lines.append(f"  rule {logical} -> {axes}  # {c.origin}")
    lines.append(f"  remat({remat_text(s.remat.value)})  # {s.remat.origin}")
    if s.remat_fit is not None:
        lines.extend(f"  # {line}" for line in fit_lines(s.remat_fit))
    q = s.quantize.value
    layers = ", ".join(f'"{p}"' for p in q.layers)
    lines.append(f"  quantize({q.format}, layers = [{layers}])  # {s.quantize.origin}")
    for op, c in s.kernels:
        lines.append(f"  kernels({op} = {c.value or 'auto'})  # {c.origin}")
    lines.append(f"  unroll({s.unroll.value})  # {s.unroll.origin}")
    lines.append(f"  steps_per_call({s.steps_per_call.value})  # {s.steps_per_call.origin}")
    if s.context.value is not None:
        lines.append(f"  {context_text(s.context.value)}  # {s.context.origin}")
    if s.pipeline.value is not None:
        lines.append(f"  {pipeline_text(s.pipeline.value)}  # {s.pipeline.origin}")
    for model, why in s.left_out:
        lines.append(f"  # {model} is left out of this target's build: {why}")
    if s.gpu_runtime is not None:
        lines.extend(runtime_lines(s.gpu_runtime))
    if s.update_skip is not ir.UpdateSkip.COND:
        lines.append(
            f"  update_skip({s.update_skip})  # choose_update_skip: the platform's cheaper form"
        )
    return lines


def runtime_lines(r: ir.GpuRuntime) -> list[str]:
    """What a GPU schedule sets before jax starts: each XLA flag, then the memory fraction."""
    lines = [f"  {f.text}  # choose_xla_flags: {f.reason}" for f in r.flags]
    lines.append(
        f"  XLA_PYTHON_CLIENT_MEM_FRACTION={r.mem_fraction}  # choose_xla_flags: "
        f"{r.mem_fraction_reason}"
    )
    return lines


def pipeline_text(p: ir.PipelinePolicy) -> str:
    """`pipeline(microbatches = 8, repeats = 2)`, then what plan_pipeline resolved: the repeat
    it splits, each model's layers per stage and the bubble."""
    text = f"pipeline(microbatches = {p.microbatches}, repeats = {p.repeats})"
    if not p.stages:
        return text
    split = ", ".join(
        f"{name} {n} = {p.stages} x {p.repeats} x {p.layers_per_stage(n)}" for name, n in p.layers
    )
    return (
        f"{text} over {p.stages} stages of `stage`: {p.child} ({split} layers), "
        f"{p.iterations} iterations, bubble {p.bubble:.1%}"
    )


def context_text(c: ir.ContextPolicy) -> str:
    """`context(strategy = "ring", balance = true)`, then what plan_context resolved."""
    balance = "" if c.balance is None else f", balance = {str(c.balance).lower()}"
    shards = f" over {c.shards} shards of `seq`" if c.shards else ""
    return f'context(strategy = "{c.strategy}"{balance}){shards}'


def remat_text(r: ir.RematPolicy) -> str:
    """A policy as a target block writes it: `save_dots`, `save = [context]`."""
    if r.kind in (ir.RematKind.SAVE, ir.RematKind.OFFLOAD):
        parts = [f"save = [{', '.join(r.save)}]", f"offload = [{', '.join(r.offload)}]"]
        return ", ".join(parts[: 2 if r.offload else 1])
    return str(r.kind)


def fit_lines(fit: ir.RematFit) -> list[str]:
    """What fit_remat weighed, in two lines (for `axdsl dump` and the generated comment)."""
    tried = (
        ", ".join(
            f"{_short_policy(t.policy)}{_pieces(t.microbatches)} {t.bytes / 2**30:.2f}"
            for t in fit.tried
        )
        + " GiB"
    )
    chosen = fit.tried[-1]
    verdict = (
        f"{_short_policy(chosen.policy)}{_pieces(chosen.microbatches)} fits"
        if fit.fits
        else "nothing fits, so full"
    )
    return [
        f"fit_remat, for {fit.model} at batch {fit.batch} x seq {fit.seq}, "
        f"{fit.usable / 2**30:.2f} GiB usable per chip (analytic):",
        f"{tried}: {verdict}",
    ]


def _pieces(microbatches: int) -> str:
    return f" in {microbatches} micro-batches" if microbatches > 1 else ""


def _short_policy(r: ir.RematPolicy) -> str:
    return "save(points)" if r.kind is ir.RematKind.SAVE else str(r.kind)


def value_text(v: object) -> str:
    """A value as the spec language writes it: `true`, `bf16`, "text", `RMSNorm(eps = 1e-05)`.

    The one printer of values: `axdsl dump`, error messages and generated comments use it.
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, DType):
        return v.name
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, ir.NameValue):
        return v.id
    if isinstance(v, ir.CallValue):
        parts = [value_text(a) for a in v.args] + [f"{k} = {value_text(x)}" for k, x in v.kwargs]
        return f"{v.fn}({', '.join(parts)})"
    if isinstance(v, ir.NamedCall):
        return f"{v.name}({', '.join(f'{k} = {value_text(x)}' for k, x in v.args)})"
    if isinstance(v, ir.DataSource):
        named = (
            ("path", v.path),
            ("path2", v.path2),
            ("dtype", v.dtype),
            *v.options,
            ("tokenizer", v.tokenizer),
            ("train_on", v.train_on),
        )
        args = [f"{k} = {value_text(x)}" for k, x in named if x is not None]
        return f"{v.kind}({', '.join(args)})"
    if isinstance(v, ir.Tokenizer):
        return value_text(v.path) if v.path is not None else f"bpe(vocab = {v.bpe_vocab})"
    if isinstance(v, ir.CheckpointPolicy):
        return (
            f"(every = {v.every}, keep = {v.keep}, async = {value_text(v.async_save)}, "
            f"dir = {value_text(v.dir)})"
        )
    if isinstance(v, LayerValue):
        layer_args = ", ".join(f"{k} = {value_text(a.value)}" for k, a in v.args)
        return f"{v.layer}({layer_args})"
    if isinstance(v, PatternValue):
        return "[" + ", ".join(value_text(x) for x in v.layers) + "]"
    if isinstance(v, RepeatValue):
        return f"repeat({value_text(v.count.value)}, {value_text(v.layer)})"
    if isinstance(v, tuple):
        return "[" + ", ".join(value_text(x) for x in v) + "]"
    return repr(v)


def plan_lines(model: ir.Model) -> list[str]:
    """split_head's cut, plan_decode's decode path and plan_functions' shared functions, under
    the model they belong to."""
    lines = []
    if model.head is not None:
        h = model.head
        hidden = h.head.fwd.args[0]
        lines.append(
            f"  head: {h.hidden}: {_dims(hidden.dims)} -> {_dims(h.head.fwd.result)} reads "
            f"({', '.join(h.params)}), {h.chunk} positions a chunk"
        )
    d = model.decode
    if d is not None and d.problem is not None:
        lines.append(f"  decode: none, {d.problem}")
    elif d is not None:
        lines.append(f"  decode: cached {', '.join(d.cached)}")
        for e in d.cache:
            stack = "[" + ", ".join(f"layers={h.value}" for h in e.stack) + "] + "
            stack = stack if e.stack else ""
            shard = f" shard{_mesh_text(e.sharding.mesh)}" if e.sharding is not None else ""
            lines.append(f"  cache {e.path}: {stack}{_dims(e.dims)}{shard}")
    for f in model.functions:
        roles = f" ({', '.join(f.roles)})" if f.roles else ""
        lines.append(f"  function {f.name}{roles}: {', '.join(f.paths)}")
    return lines


def _mesh_text(spec: tuple[tuple[str, ...], ...]) -> str:
    """Mesh axes per dim: `(fsdp, _, data+fsdp)`, `_` for a dim on no mesh axis."""
    return "(" + ", ".join("+".join(a) if a else "_" for a in spec) + ")"


def _computed(h: ir.HParam) -> str:
    """`  (cfg.dim // cfg.heads)`: how a value is computed from the Config, when that says more
    than the value (not for a literal, nor for the Config field of its own name)."""
    e = h.value.expr
    if e is None or isinstance(e, Const) or e == Field(h.name):
        return ""
    return f"  ({spec_text(e)})"


def _dims(dims: tuple[ir.Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _instance(inst: ir.Instance, depth: int, lines: list[str]) -> None:
    pad = "  " * depth
    rep = f" x{inst.repeat.value}" if inst.repeat is not None else ""
    if inst.remat is not None:
        rep += f" remat({inst.remat.kind})"
    if inst.unrolled:
        rep += " unrolled"
    if inst.carry_sharding is not None:
        rep += f" carry{_mesh_text(inst.carry_sharding.mesh)}"
    lines.append(f"{pad}{inst.path} : {inst.layer}{rep}")
    for h in inst.hparams:
        value = value_text(h.value.value) + _computed(h)
        lines.append(f"{pad}  {h.name}: {h.type} = {value}  # {h.origin}")
    for p in inst.params:
        stack = _dims(p.stack) + " + " if p.stack else ""
        init = f"{p.init.kind}({', '.join(value_text(a.value) for a in p.init.args)})"
        shard = f" shard{_mesh_text(p.sharding)}" if p.sharding is not None else ""
        lines.append(
            f"{pad}  param {p.name}: {stack}{_dims(p.dims)} axes({', '.join(p.full_axes)}) "
            f"init {init} {p.dtype.name}{shard}"
        )
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
        if e.kind is ir.RefKind.CHILD_PARAM:
            return f"{e.owner}.{e.name}"
        if e.kind is ir.RefKind.HPARAM:
            return value_text(ir.filled(e.value, f"the value of {e.name}", "resolve").value)
        return e.name
    if isinstance(e, ir.Lit):
        return value_text(e.value)
    if isinstance(e, ir.Bin):
        return f"({expr_text(e.left)} {e.op} {expr_text(e.right)})"
    if isinstance(e, ir.Neg):
        return f"-{expr_text(e.operand)}"
    if isinstance(e, ir.CallChild) and e.over is not None:
        init = [f"init = {expr_text(e.args[0])}"] if e.scan_init else []
        xs = [expr_text(a) for a in e.args[len(init) :]]
        return f"scan({', '.join([e.child, *xs, f'over = {e.over}', *init])})"
    if isinstance(e, ir.CallChild):
        return f"{e.child}({', '.join(expr_text(a) for a in e.args)})"
    if e.name == "quantized":
        return f"{e.attr('format')}({expr_text(e.args[0])})"
    attrs = []
    for k, v in e.attrs:
        if v is None:
            continue
        if isinstance(v, ir.EinsumSpec):
            attrs.append(f'"{v.text()}"')
        elif isinstance(v, ir.Dim):
            attrs.append(f"{k} = {v}")
        elif isinstance(v, tuple) and all(isinstance(d, ir.Dim) for d in v):
            attrs.append(f"{k} = [{', '.join(str(d) for d in v)}]")
        else:
            attrs.append(f"{k} = {value_text(ir.plain(v))}")
    if e.kernel is not None:
        attrs.append(f'kernel = "{e.kernel.kernel}"')
        if e.kernel.rejected:
            attrs.append(f'kernel_note = "{"; ".join(e.kernel.rejected)}"')
    args = [expr_text(a) for a in e.args] + attrs
    return f"{e.name}({', '.join(args)})"


def _section(s: ir.Section) -> list[str]:
    out = [f"  {st.name} = {value_text(st.value)}" for st in s.settings]
    for d in s.directives:
        parts = [value_text(a.value) for a in d.args] + [
            f"{a.name} = {value_text(a.value)}" for a in d.kwargs
        ]
        out.append(f"  {d.name}({', '.join(parts)})")
    return out


def _train_value(v: object) -> str:
    """A resolved train setting: `adamw(lr = 0.0003, ...)`, `tokens(path = "x.bin")`, a number."""
    return value_text(v)
