"""configure_target: resolve the schedule for one target from its profile and the spec's blocks.

    target "gpu-h100*" {            the first block whose pattern matches the target name wins
      mesh(fsdp = -1, model = 2)    (fnmatch, as AXLearn's mesh rules); its directives override
      rules(mlp = model)            the profile's defaults one by one, and every setting keeps
      remat(save = [context])       where it came from so `axdsl dump --target` can show it.
      quantize(fp8, layers = "blocks/*")
      kernels(attention = cudnn)
      unroll(16)                    repeats of up to 16 layers run unrolled (0: always scanned)
      steps_per_call(8)             train.py runs 8 steps per jitted call (the same results)
      context(strategy = "ring")    attention with the sequence split over the `seq` mesh axis
                                    (plan_context checks it against the model)
      pipeline(microbatches = 8)    the main repeat of layers in stages over the `stage` mesh
    }                               axis (plan_pipeline checks it against the model)

Every block is checked (a typo in a TPU block fails a CPU build too); what a chip supports
(quantization formats, kernels) is checked for the matched block only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from axdsl import primitives
from axdsl.errors import Diagnostics, Span, did_you_mean, filled
from axdsl.ir import nodes as ir
from axdsl.ir.printer import value_text
from axdsl.primitives.base import KernelRule
from axdsl.targets import MESH_AXES, QUANT_FORMATS, Target, get_target, resolve_mesh


class TargetDirective(StrEnum):
    """The directives a target block holds, in the order errors list them."""

    MESH = "mesh"
    RULES = "rules"
    REMAT = "remat"
    QUANTIZE = "quantize"
    KERNELS = "kernels"
    UNROLL = "unroll"
    STEPS_PER_CALL = "steps_per_call"
    CONTEXT = "context"
    PIPELINE = "pipeline"


DIRECTIVES = tuple(str(d) for d in TargetDirective)
# Primitives whose kernel a target chooses (their registry entries have a KernelRule).
KERNEL_OPS = tuple(sorted(name for name, prim in primitives.REGISTRY.items() if prim.has_kernels))
AUTO = "auto"  # kernels(op = auto): select_kernels picks (the schedule holds None)


def kernel_rule(op: str) -> KernelRule:
    """The kernels of primitive `op`, one of KERNEL_OPS (a caller that passes another is a bug)."""
    return filled(primitives.get(op).kernels, f"the kernels of `{op}`", "its registry entry")


def _pattern(block: ir.Section) -> str:
    """The pattern of a target block (the parser gives every `target "pattern" { }` one)."""
    return filled(block.pattern, "the pattern of a target block", "the parser")


def configure_target(module: ir.Module) -> ir.Module:
    t = get_target(module.target_name)
    diags = Diagnostics()
    parsed = [_parse_block(block, diags) for block in module.target_blocks]
    diags.raise_if_any()
    matched = next(
        (i for i, b in enumerate(module.target_blocks) if _matches(_pattern(b), t)), None
    )
    block = module.target_blocks[matched] if matched is not None else None
    overrides = parsed[matched] if matched is not None else {}
    schedule = _schedule(t, block, overrides, diags)
    diags.raise_if_any()
    return replace(module, schedule=schedule)


def _matches(pattern: str, t: Target) -> bool:
    """A pattern matches the name as written or its canonical form with the chip count."""
    return fnmatchcase(t.name, pattern) or fnmatchcase(t.canonical, pattern)


# ---------------------------------------------------------------------------- parsing one block
def _parse_block(block: ir.Section, diags: Diagnostics) -> dict[TargetDirective, tuple[Any, Span]]:
    """Check one target block's shape; return {directive: (parsed value, span)}."""
    out: dict[TargetDirective, tuple[Any, Span]] = {}
    for setting in block.settings:
        diags.error(
            setting.span,
            f"unknown target setting `{setting.name}`",
            "target blocks hold directives: " + ", ".join(f"{d}(...)" for d in DIRECTIVES),
        )
    for d in block.directives:
        if d.name not in DIRECTIVES:
            hint = did_you_mean(d.name, DIRECTIVES) or "directives: " + ", ".join(DIRECTIVES)
            diags.error(d.span, f"unknown target directive `{d.name}`", hint)
            continue
        directive = TargetDirective(d.name)
        if directive in out:
            diags.error(
                d.span,
                f"`{d.name}(...)` appears twice in this target block",
                "merge them into one directive",
            )
            continue
        value = PARSERS[directive](d, diags)
        if value is not None:
            out[directive] = (value, d.span)
    return out


def _name(v: Any) -> str | None:
    return v.id if isinstance(v, ir.NameValue) else None


def _ids(items: tuple[Any, ...]) -> tuple[str, ...] | None:
    """The names of `items` when every one is a bare name, else None."""
    ids = tuple(i.id for i in items if isinstance(i, ir.NameValue))
    return ids if len(ids) == len(items) else None


def _names(
    v: Any, span: Span, what: str, allowed: tuple[str, ...], diags: Diagnostics
) -> tuple[str, ...] | None:
    """A bare name or a list of bare names, each one of `allowed`."""
    items = (v,) if _name(v) is not None else v if isinstance(v, tuple) else None
    names = _ids(items) if items is not None else None
    if names is None:
        diags.error(span, f"{what} takes a name or a list of names, as in [data, fsdp]")
        return None
    for n in names:
        if n not in allowed:
            diags.error(
                span,
                f"unknown {what} `{n}`",
                did_you_mean(n, allowed) or f"known: {', '.join(allowed)}",
            )
            return None
    return names


def _no_positional(d: ir.Directive, diags: Diagnostics) -> bool:
    if d.args:
        diags.error(d.args[0].span, f"`{d.name}(...)` takes only `name = value` arguments")
        return False
    return True


def _parse_mesh(d: ir.Directive, diags: Diagnostics):
    if not _no_positional(d, diags):
        return None
    sizes = {}
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key not in MESH_AXES:
            diags.error(
                span,
                f"unknown mesh axis `{key}`",
                did_you_mean(key, MESH_AXES) or f"mesh axes: {', '.join(MESH_AXES)}",
            )
        elif not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
            diags.error(
                span,
                f"mesh axis `{key}` must be a positive integer or -1",
                "-1 means: whatever is left of the chip count",
            )
        else:
            sizes[key] = value
    if sum(1 for v in sizes.values() if v == -1) > 1:
        diags.error(d.span, "only one mesh axis may be -1", "give every other axis a size")
    return tuple(sizes.items())


def _parse_rules(d: ir.Directive, diags: Diagnostics):
    if not _no_positional(d, diags):
        return None
    rules = []
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key not in ir.LOGICAL_AXES:
            diags.error(
                span,
                f"unknown logical axis `{key}`",
                did_you_mean(key, ir.LOGICAL_AXES) or f"logical axes: {', '.join(ir.LOGICAL_AXES)}",
            )
            continue
        axes = () if value == () else _names(value, span, "mesh axis", MESH_AXES, diags)
        if axes is not None:
            if len(set(axes)) != len(axes):
                diags.error(span, f"rule for `{key}` names a mesh axis twice")
                continue
            rules.append((key, axes, span))
    return tuple(rules)


def _parse_remat(d: ir.Directive, diags: Diagnostics):
    simple = ("none", "full", "save_dots", "fit")
    if d.args:
        policy = _name(d.args[0].value)
        if len(d.args) != 1 or d.kwargs or policy is None or policy not in simple:
            diags.error(
                d.span,
                "remat takes one of none, full, save_dots, fit, or save = [...] and/or "
                "offload = [...]",
                "for example remat(full) or remat(save = [query_proj, out_proj])",
            )
            return None
        return ir.RematPolicy(ir.RematKind(policy))
    if not d.kwargs:
        diags.error(d.span, "remat(...) needs a policy", "for example remat(full)")
        return None
    lists: dict[str, tuple[str, ...]] = {}
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key not in ("save", "offload"):
            diags.error(
                span, f"unknown remat option `{key}`", did_you_mean(key, ("save", "offload"))
            )
            continue
        items = (value,) if _name(value) else value if isinstance(value, tuple) else None
        points = _ids(items) if items is not None else None
        if points is None:
            diags.error(span, f"`{key}` takes a list of named points, as in [query_proj, context]")
            continue
        lists[key] = points
    kind = ir.RematKind.OFFLOAD if "offload" in lists else ir.RematKind.SAVE
    return ir.RematPolicy(kind, lists.get("save", ()), lists.get("offload", ()))


def _parse_quantize(d: ir.Directive, diags: Diagnostics):
    fmt = _name(d.args[0].value) if len(d.args) == 1 else None
    if fmt is None:
        diags.error(
            d.span,
            "quantize takes a format: quantize(fp8), quantize(int8) or quantize(none)",
            'optionally with layers = "blocks/*" to pick layer paths',
        )
        return None
    if fmt not in QUANT_FORMATS:
        diags.error(
            d.args[0].span,
            f"unknown quantization format `{fmt}`",
            did_you_mean(fmt, QUANT_FORMATS) or f"formats: {', '.join(QUANT_FORMATS)}",
        )
        return None
    layers: tuple[str, ...] = ("*",)
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key != "layers":
            diags.error(
                span, f"unknown quantize option `{key}`", 'the only option is layers = "pattern"'
            )
        elif isinstance(value, str):
            layers = (value,)
        elif isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            layers = value
        else:
            diags.error(
                span,
                "layers takes a path pattern string or a list of them",
                'as in layers = "blocks/*"',
            )
    return ir.QuantPolicy(ir.QuantFormat(fmt), layers)


def _parse_unroll(d: ir.Directive, diags: Diagnostics):
    value = d.args[0].value if len(d.args) == 1 and not d.kwargs else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        diags.error(
            d.span,
            "unroll takes the most layers a repeat may have and run unrolled",
            "for example unroll(16); unroll(0) keeps every repeat a rolled jax.lax.scan",
        )
        return None
    return value


def _parse_steps_per_call(d: ir.Directive, diags: Diagnostics):
    value = d.args[0].value if len(d.args) == 1 and not d.kwargs else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        diags.error(
            d.span,
            "steps_per_call takes how many train steps one jitted call runs (at least 1)",
            "for example steps_per_call(8); steps_per_call(1) calls the step once per step",
        )
        return None
    return value


def _parse_kernels(d: ir.Directive, diags: Diagnostics):
    if not _no_positional(d, diags):
        return None
    out = []
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key not in KERNEL_OPS:
            diags.error(
                span,
                f"no kernel choice for `{key}`",
                f"kernel choices exist for: {', '.join(KERNEL_OPS)}",
            )
            continue
        kernel, names = _name(value), kernel_rule(key).names
        if kernel is None or kernel not in names + (AUTO,):
            diags.error(
                span,
                f"unknown {key} kernel `{kernel or value_text(value)}`",
                did_you_mean(str(kernel), names) or f"kernels: {', '.join(names)}, {AUTO}",
            )
            continue
        out.append((key, None if kernel == AUTO else ir.Kernel(kernel), span))
    return tuple(out)


def _parse_context(d: ir.Directive, diags: Diagnostics):
    """context(strategy = "all_gather" | "ring", balance = true | false); both optional."""
    if not _no_positional(d, diags):
        return None
    strategies = tuple(str(s) for s in ir.ContextStrategy)
    policy = ir.ContextPolicy(ir.ContextStrategy.ALL_GATHER)
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key == "strategy":
            name = value if isinstance(value, str) else _name(value)
            if name not in strategies:
                diags.error(
                    span,
                    f"unknown context strategy {value_text(value)}",
                    did_you_mean(str(name), strategies)
                    or 'strategy = "all_gather" (keys and values gathered once per layer) or '
                    '"ring" (blocks passed around the shards: flat memory per chip)',
                )
                return None
            policy = replace(policy, strategy=ir.ContextStrategy(name))
        elif key == "balance":
            if not isinstance(value, bool):
                diags.error(
                    span,
                    "balance takes true or false",
                    "true runs the sequence in zig-zag order so every shard has equal causal work",
                )
                return None
            policy = replace(policy, balance=value)
        else:
            diags.error(
                span,
                f"unknown context option `{key}`",
                did_you_mean(key, ("strategy", "balance")) or "options: strategy, balance",
            )
            return None
    return policy


_PIPELINE_OPTIONS = ("microbatches", "repeats")


def _parse_pipeline(d: ir.Directive, diags: Diagnostics):
    """pipeline(microbatches = M, repeats = R): M is required, R defaults to 1 (no circle)."""
    if not _no_positional(d, diags):
        return None
    values: dict[str, int] = {}
    for key, value, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if key not in _PIPELINE_OPTIONS:
            diags.error(
                span,
                f"unknown pipeline option `{key}`",
                did_you_mean(key, _PIPELINE_OPTIONS) or "options: microbatches, repeats",
            )
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            diags.error(
                span,
                f"{key} takes a positive integer",
                "microbatches: pieces of the batch in flight (at least the stages); repeats: "
                "times a micro-batch passes through the stages (1: GPipe, more: circular)",
            )
            return None
        values[key] = value
    if "microbatches" not in values:
        diags.error(
            d.span,
            "pipeline(...) needs microbatches = M, the pieces the batch is cut into",
            "for example pipeline(microbatches = 8): twice the stages keeps the bubble small",
        )
        return None
    return ir.PipelinePolicy(values["microbatches"], values.get("repeats", 1))


# Each directive's parser: (directive, diags) -> its value, or None after reporting an error.
PARSERS: dict[TargetDirective, Callable[[ir.Directive, Diagnostics], Any]] = {
    TargetDirective.MESH: _parse_mesh,
    TargetDirective.RULES: _parse_rules,
    TargetDirective.REMAT: _parse_remat,
    TargetDirective.QUANTIZE: _parse_quantize,
    TargetDirective.KERNELS: _parse_kernels,
    TargetDirective.UNROLL: _parse_unroll,
    TargetDirective.STEPS_PER_CALL: _parse_steps_per_call,
    TargetDirective.CONTEXT: _parse_context,
    TargetDirective.PIPELINE: _parse_pipeline,
}


# ---------------------------------------------------------------------------- the schedule
@dataclass(frozen=True)
class _Overrides:
    """The matched block's parsed directives, and how to say a setting came from it."""

    target: Target
    block: ir.Section | None
    parsed: dict[TargetDirective, tuple[Any, Span]]

    @property
    def default(self) -> ir.Origin:
        return ir.Origin(ir.OriginKind.PROFILE, where=self.target.profile.name)

    def origin(self, span: Span) -> ir.Origin:
        block = filled(self.block, "the matched target block", "configure_target")
        return ir.Origin(ir.OriginKind.TARGET_BLOCK, span, where=_pattern(block))


def _schedule(
    t: Target,
    block: ir.Section | None,
    o: dict[TargetDirective, tuple[Any, Span]],
    diags: Diagnostics,
) -> ir.Schedule:
    ov = _Overrides(t, block, o)
    mesh, sizes = _mesh(ov, diags)
    return ir.Schedule(
        name=t.name,
        profile=t.profile.name,
        kind=t.profile.kind,
        chips=t.chips,
        matched=block.pattern if block else None,
        matched_span=block.span if block else None,
        mesh=mesh,
        mesh_sizes=tuple(sizes.items()),
        rules=_rules(ov),
        remat=_remat(ov),
        quantize=_quantize(ov, diags),
        kernels=_kernels(ov, diags),
        unroll=_unroll(ov),
        steps_per_call=_steps_per_call(ov),
        context=_context(ov),
        pipeline=_pipeline(ov),
    )


def _mesh(ov: _Overrides, diags: Diagnostics) -> tuple[ir.Choice, dict[str, int]]:
    """A spec's mesh() replaces the profile's whole mesh (unnamed axes are 1)."""
    t, p = ov.target, ov.target.profile
    if TargetDirective.MESH in ov.parsed:
        value, span = ov.parsed[TargetDirective.MESH]
        mesh = ir.Choice(value, ov.origin(span))
    else:
        mesh = ir.Choice(tuple(p.mesh.items()), ov.default)
    sizes = resolve_mesh(dict(mesh.value), t.chips)
    if isinstance(sizes, str):
        diags.error(
            mesh.span or block_span(ov.block),
            f"mesh does not fit {t.name} ({t.chips} chips): {sizes}",
            f"use -1 for one axis to take the rest, or build for {p.name}-N",
        )
        sizes = {a: 1 for a in MESH_AXES}
    return mesh, sizes


def _rules(ov: _Overrides) -> tuple[tuple[str, ir.Choice], ...]:
    rules = {k: ir.Choice(v, ov.default) for k, v in ov.target.profile.rules.items()}
    for key, axes, span in ov.parsed.get(TargetDirective.RULES, ((), None))[0]:
        rules[key] = ir.Choice(axes, ov.origin(span))
    return tuple((k, rules[k]) for k in ir.LOGICAL_AXES if k in rules)


def _remat(ov: _Overrides) -> ir.Choice:
    if TargetDirective.REMAT in ov.parsed:
        policy, span = ov.parsed[TargetDirective.REMAT]
        return ir.Choice(policy, ov.origin(span))
    return ir.Choice(ir.RematPolicy(ir.RematKind(ov.target.profile.remat)), ov.default)


def _unroll(ov: _Overrides) -> ir.Choice:
    if TargetDirective.UNROLL in ov.parsed:
        value, span = ov.parsed[TargetDirective.UNROLL]
        return ir.Choice(value, ov.origin(span))
    return ir.Choice(ov.target.profile.unroll, ov.default)


def _steps_per_call(ov: _Overrides) -> ir.Choice:
    if TargetDirective.STEPS_PER_CALL in ov.parsed:
        value, span = ov.parsed[TargetDirective.STEPS_PER_CALL]
        return ir.Choice(value, ov.origin(span))
    return ir.Choice(ov.target.profile.steps_per_call, ov.default)


def _context(ov: _Overrides) -> ir.Choice:
    """The block's context(...) policy; profiles have none (context parallelism is asked for)."""
    if TargetDirective.CONTEXT in ov.parsed:
        value, span = ov.parsed[TargetDirective.CONTEXT]
        return ir.Choice(value, ov.origin(span))
    return ir.Choice(None, ov.default)


def _pipeline(ov: _Overrides) -> ir.Choice:
    """The block's pipeline(...) policy; profiles have none (pipelines are asked for)."""
    if TargetDirective.PIPELINE in ov.parsed:
        value, span = ov.parsed[TargetDirective.PIPELINE]
        return ir.Choice(value, ov.origin(span))
    return ir.Choice(None, ov.default)


def _quantize(ov: _Overrides, diags: Diagnostics) -> ir.Choice:
    p = ov.target.profile
    if TargetDirective.QUANTIZE not in ov.parsed:
        return ir.Choice(
            ir.QuantPolicy(ir.QuantFormat(p.default_quantize), ("blocks/*",)), ov.default
        )
    q, span = ov.parsed[TargetDirective.QUANTIZE]
    if q.format is not ir.QuantFormat.NONE and q.format not in p.quantize:
        have = ", ".join(p.quantize) or "no low-precision formats"
        diags.error(
            span,
            f"{p.name} does not run {q.format} matmuls (it has {have})",
            f'use quantize(none) in the block matching "{ov.target.name}"',
        )
    return ir.Choice(q, ov.origin(span))


def _kernels(ov: _Overrides, diags: Diagnostics) -> tuple[tuple[str, ir.Choice], ...]:
    p = ov.target.profile
    kernels: dict[str, ir.Choice] = {op: ir.Choice(None, ov.default) for op in KERNEL_OPS}
    for key, kernel, span in ov.parsed.get(TargetDirective.KERNELS, ((), None))[0]:
        has = kernel_rule(key).preference(p, key)
        if kernel is not None and kernel not in has:
            diags.error(
                span,
                f"{p.name} has no `{kernel}` {key} kernel",
                f"its kernels: {', '.join(has)} (or auto)",
            )
        kernels[key] = ir.Choice(kernel, ov.origin(span))
    return tuple(kernels.items())


def block_span(block: ir.Section | None) -> Span:
    from axdsl.errors import UNKNOWN_SPAN

    return block.span if block is not None else UNKNOWN_SPAN


def axis_shards(
    sched: ir.Schedule,
    axis: str,
    directive: TargetDirective,
    splits: str,
    at: Span,
    diags: Diagnostics,
) -> int:
    """The size of mesh axis `axis`, which `directive(...)` (context, pipeline) splits `splits`
    over: below 2 there is nothing to split, a located error with the way out."""
    shards = sched.size(axis)
    if shards < 2:
        diags.error(
            at,
            f"{directive}(...) splits {splits} over the `{axis}` mesh axis, which has 1 shard on "
            f"{sched.name}",
            f"give it shards in this target block, e.g. mesh({axis} = 4, fsdp = -1)",
        )
    return shards
