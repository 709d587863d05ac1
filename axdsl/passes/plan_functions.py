"""plan_functions: which instances share one generated layer function, and its name; and which
generated helpers the model needs.

    model lm > / : DecoderLM                  ->    function rms_norm: /blocks/attn_norm,
      /blocks : Block x2                                /blocks/ffn_norm, /final_norm
        /blocks/attn_norm : RMSNorm                   function attention: /blocks/attn
        /blocks/ffn_norm : RMSNorm                    ...

Each layer type becomes one function. Two instances share it when they have one structure:
the same layer; the same forward, with each dim reduced to its label (`sizeless`) and a weight's
own dims left out where it is read; the same parameters per layer (a stack's leading dims aside:
a scan step reads one layer); children calling the same functions the same way; and the same
roles (random keys, auxiliary loss, master weights, positions from the decode path). Instances
of a layer whose structure differs (say two RMSNorms with different eps literals) get numbered
variants, `rms_norm_2`, in the order the tree is visited (leaves first). Codegen prints one
function per entry and raises an InternalError if its instances' bodies print differently.

The helpers (`helpers dense, rotation_tables, ...` at the module's end) are what each call's
registry entry says it needs (`Primitive.needs`: the chosen kernel, the call's attributes, and
whether it runs on the decode path), never read from emitted text; codegen copies those, and
raises an InternalError if its emitters call any other set.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import fields, is_dataclass, replace
from typing import Any

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.expr import BinOp, field_of
from axdsl.ir.names import snake
from axdsl.ir.rewrite import prims_of


def plan_functions(module: ir.Module) -> ir.Module:
    models = tuple(_plan(m, module.schedule) for m in module.models)
    return replace(module, models=models, helpers=needed_helpers(models, module.schedule))


def needed_helpers(models: tuple[ir.Model, ...], schedule: ir.Schedule | None) -> tuple[str, ...]:
    """The generated helpers the models' code calls, from each primitive's registry entry
    (`Primitive.needs`: its kernel choice and attributes decide) and the weight matmuls on the
    dense kernel; the layers the decode path shares call them again in their decode form."""
    out: set[str] = set()
    for model in models:
        decoding = decode_shared(model)
        staged = staged_attention(model.root, schedule)
        for inst in model.root.walk():
            # a primitive sees a pipeline only inside its stages (the layers marked staged)
            seen = schedule if inst.path in staged else _unpiped(schedule)
            for on_decode_path in (False, True) if inst.path in decoding else (False,):
                for e in _emitted_exprs(inst):
                    out.update(_needs(e, seen, on_decode_path))
    if models and models[0].head is not None:  # loss_fn's chunked loss (split_head)
        out.add(primitives.FUSED_CROSS_ENTROPY.name)
    context = schedule.context.value if schedule is not None else None
    if context is not None and context.balance:  # the root's zig-zag reorder (plan_context)
        out.add(primitives.CONTEXT_ORDER_HELPER.name)
    if schedule is not None and schedule.pipeline.value is not None:  # plan_pipeline
        out.add(primitives.PIPELINE_HELPER.name)
    return tuple(sorted(out))


def _unpiped(schedule: ir.Schedule | None) -> ir.Schedule | None:
    """The schedule without its pipeline: what a layer outside the pipeline's stages runs."""
    if schedule is None or schedule.pipeline.value is None:
        return schedule
    return replace(schedule, pipeline=replace(schedule.pipeline, value=None))


def _needs(e: ir.TExpr, schedule: ir.Schedule | None, decoding: bool) -> tuple[str, ...]:
    if isinstance(e, ir.Prim):
        entry = primitives.get(e.name)
        if entry.needs is None:  # no rule: every call calls all the helpers it lists
            return tuple(h.name for h in entry.helpers)
        return entry.needs(e, schedule, decoding)
    if isinstance(e, ir.Bin) and e.op is BinOp.MATMUL:
        return primitives.matmul_needs(e, schedule)
    return ()


def _emitted_exprs(inst: ir.Instance) -> Iterator[ir.TExpr]:
    """The expressions of `inst`'s forward that codegen emits one by one: a primitive that emits
    its own operands (a quantized matmul) is one call, not its operands' calls."""

    def walk(e: ir.TExpr) -> Iterator[ir.TExpr]:
        yield e
        if isinstance(e, ir.Bin):
            yield from walk(e.left)
            yield from walk(e.right)
        elif isinstance(e, ir.Neg):
            yield from walk(e.operand)
        elif isinstance(e, ir.CallChild) or (
            isinstance(e, ir.Prim) and primitives.get(e.name).emits_operands
        ):
            for a in e.args:
                yield from walk(a)

    for s in inst.fwd.body:
        yield from walk(s.value)


def _plan(model: ir.Model, schedule: ir.Schedule | None) -> ir.Model:
    staged = staged_attention(model.root, schedule)
    return replace(model, functions=shared_functions(model.root, decode_shared(model), staged))


def staged_attention(root: ir.Instance, schedule: ir.Schedule | None) -> frozenset[str]:
    """The layers inside the pipeline's stages whose code differs there: those that call a
    primitive whose code may run in shard_map (attention: context parallelism, splash), where the
    pipeline's vmap holds the `stage` mesh axis, so the shard_map must leave it out of the
    batch's axes; and those that add an auxiliary loss (MoE) or hold one that does, which return
    its statistics for the pipeline to average over the micro-batches."""
    if schedule is None or schedule.pipeline.value is None:
        return frozenset()
    child = schedule.pipeline.value.child

    def flagged(inst: ir.Instance) -> bool:
        own = (primitives.get(p.name) for p in prims_of(inst))
        below = (primitives.get(p.name) for i in inst.walk() for p in prims_of(i))
        return any(e.shard_mapped for e in own) or any(e.aux_loss for e in below)

    return frozenset(
        inst.path
        for inst in root.walk()
        if (inst.path == child or inst.path.startswith(child + "/")) and flagged(inst)
    )


def decode_shared(model: ir.Model) -> frozenset[str]:
    """The layers whose function the decode path shares: those plan_decode caches. They read
    positions from `pos`."""
    plan = model.decode
    if plan is None or plan.problem is not None:
        return frozenset()
    return frozenset(plan.cached)


def shared_functions(
    root: ir.Instance,
    takes_pos: frozenset[str] = frozenset(),
    staged: frozenset[str] = frozenset(),
) -> tuple[ir.SharedFunction, ...]:
    """The layer functions of the tree at `root` in post-order, instances of one structure
    sharing one."""
    masters = ir.master_weight_paths(root)
    keys: list[Hashable] = []
    functions: list[ir.SharedFunction] = []

    def visit(inst: ir.Instance) -> tuple[str, bool, bool]:
        calls = [(c, *visit(c)) for c in inst.children]
        rng = uses(inst, "uses_rng") or any(r for _, _, r, _ in calls)
        aux = uses(inst, "aux_loss") or any(a for _, _, _, a in calls)
        key = (
            inst.layer,
            sizeless(inst.fwd),
            tuple((p.name, len(p.dims), p.axes, p.dtype) for p in inst.params),
            tuple(
                (c.name, name, c.repeat, c.pattern, c.remat, c.unrolled, c.carry_sharding)
                for c, name, _, _ in calls
            ),
            rng,
            aux,
            inst.path in masters,
            inst.path in takes_pos,
            inst.path in staged,
        )
        for i, k in enumerate(keys):
            if k == key:
                f = functions[i]
                functions[i] = replace(f, paths=f.paths + (inst.path,))
                return f.name, rng, aux
        taken = sum(1 for f in functions if f.layer == inst.layer)
        base = snake(inst.layer)
        name = base if taken == 0 else f"{base}_{taken + 1}"
        keys.append(key)
        functions.append(
            ir.SharedFunction(
                name,
                inst.layer,
                (inst.path,),
                rng=rng,
                aux=aux,
                master=inst.path in masters,
                takes_pos=inst.path in takes_pos,
                staged=inst.path in staged,
            )
        )
        return name, rng, aux

    visit(root)
    return tuple(functions)


_PARAMS = (ir.RefKind.PARAM, ir.RefKind.CHILD_PARAM)


def sizeless(x: Any) -> Any:
    """`x` with every dim reduced to its label: its Config field when its size is exactly
    `cfg.<field>`, else its name, as generated comments and einsum letters name it. Generated code
    reads sizes from `cfg` or the arrays' shapes, so an RMSNorm over `dim` and one over
    `head_dim` print one body; a size that is printed is a value elsewhere in the forward (an
    attribute, a literal), which stays."""
    if isinstance(x, ir.Dim):
        return ir.Dim(field_of(x.expr) or x.name)
    if isinstance(x, ir.Ref) and x.kind in _PARAMS and isinstance(x.type, ir.TensorType):
        # `params["table"]`: a weight's own dims are not printed where it is read (the
        # statement's result is), so a table of [vocab, dim] and one of [max_seq, dim] share
        return replace(x, type=replace(x.type, dims=tuple(ir.Dim("_") for _ in x.type.dims)))
    if isinstance(x, tuple):
        return tuple(sizeless(v) for v in x)
    if is_dataclass(x) and not isinstance(x, type):
        return replace(x, **{f.name: sizeless(getattr(x, f.name)) for f in fields(x) if f.init})
    return x


def uses(inst: ir.Instance, flag: str) -> bool:
    """Whether this instance's own forward calls a primitive with registry flag `flag` set."""
    return any(getattr(primitives.get(p.name), flag) for p in prims_of(inst))
