"""Activations of one micro-batch: what the backward keeps (saved) and its largest transient
(working).

The scanned block keeps, per layer, what its remat policy keeps (none: every residual; full: the
layer input; save_dots: the layer input and the matmul outputs the backward needs directly or to
recompute a residual; save/offload names: the layer input and those points, offloaded ones on the
host), plus the residuals outside the scan and of the loss (float32 softmax over the vocabulary).
The working set is the larger of the loss's and one layer's backward transients (both, without
remat). See `memory.py` for the whole model.

Under pipeline(...) the pipelined repeat runs inside the loop of kernels/pipeline.py: a scan of
microbatches x repeats + stages - 1 iterations, each running one stage's layers (layers / (stages
x repeats)) on one micro-batch (batch / microbatches sequences over the batch's mesh axes less
`stage`, which the vmap over stages takes). Autodiff keeps what each iteration's layers keep, the
bubble's iterations included, so the repeat keeps iterations x layers per stage x one layer's
kept bytes of a micro-batch (the plain figure / (1 - bubble)); beside it the loop's input and
output buffer holds every micro-batch's activation at the repeat's boundary. With repeats > 1 each
iteration selects its repeat's weights (kernels/pipeline.py `_stage_weights`), and the loop keeps
that selection, a stage's layers' weights in the compute dtype, for every iteration: a deviceless
v5e 2x4 compile (16 layers of dim 1024, stage 4 x fsdp 2, microbatches 8, repeats 2) holds
bf16[19, 2, 1, 4096, 512] and like buffers, 608 MiB. One layer's backward transient is a
micro-batch's on one stage.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from axdsl.analysis.flops import param_of
from axdsl.analysis.layout import DTYPE_BYTES, Layout
from axdsl.analysis.platforms import CPU, PlatformFacts
from axdsl.analysis.trace import Tracer
from axdsl.analysis.values import Scope, Val, ValKind
from axdsl.errors import filled
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import LOSS_CHUNK, HeadSplit
from axdsl.ir.rewrite import prims_of


@dataclass(frozen=True)
class Activations:
    """Bytes per chip of one micro-batch's activations."""

    saved: int  # kept for the backward (all layers)
    working: int  # the largest backward transient
    offloaded: int  # on host memory
    saved_per_layer: int
    layers: int
    working_kind: str  # "loss" or "layer"
    detail: dict[str, int] = field(default_factory=dict)  # saved per layer, by value
    reused: int = 0  # unrolled blocks: gradient bytes written where freed residuals were
    loss_working: int = 0  # the loss's transient (at the end of the forward pass)
    layer_working: int = 0  # one layer's backward transient (the largest layer's)
    in_flight: int = 0  # of `saved`: the pipelined repeat's, all micro-batches and iterations


@dataclass
class _Blocks:
    """The scanned blocks' totals, summed layer by layer."""

    saved: float = 0.0  # starts with what the layers outside the scan keep
    offloaded: float = 0.0
    per_layer: float = 0.0
    layers: int = 0
    working: float = 0.0
    reused: float = 0.0
    in_flight: float = 0.0  # what the pipelined repeat keeps (pipeline(...))
    detail: dict[str, int] = field(default_factory=dict)


def trace_activations(
    root: ir.Instance,
    layout: Layout,
    batch: int,
    seq: int,
    remat: ir.RematPolicy | None,
    split: HeadSplit | None = None,
    loss_chunk: int = LOSS_CHUNK,
    platform: PlatformFacts = CPU,
    context: ir.ContextPolicy | None = None,
    pipeline: ir.PipelinePolicy | None = None,
) -> Activations:
    """Trace the model and its loss; `remat` replaces every scanned block's policy. `split`: the
    loss is the fused cross-entropy over the model cut at its head (ir/head.py loss_split),
    `loss_chunk` positions at a time. `platform`: how many transients XLA keeps at once there.
    `context`: the schedule's context parallelism (attention's memory rule reads it).
    `pipeline`: the schedule's pipeline parallelism, as plan_pipeline resolved it (its repeat
    keeps the micro-batches in flight, module docstring)."""
    t = Tracer(root, layout, batch, seq)
    t.platform = platform
    t.context = context
    args = [Val(a.dims, "i32", ValKind.INPUT, f"/{a.name}") for a in root.fwd.args]
    if split is None:
        loss_working, kept = loss(t, t.call(root, args)), 0.0
    else:
        loss_working, kept = fused_loss(t, split, t.call(split.body, args), loss_chunk)
    blocks = _Blocks(saved=kept + sum(t.nbytes(v) for v in t.outer.residuals.values()))
    policies = []
    for inst, layer, x in t.blocks:
        policy = remat or inst.remat or ir.RematPolicy(ir.RematKind.NONE)
        if inst.unrolled and not platform.unrolled_remat:  # XLA:CPU keeps it all (platforms.py)
            policy = ir.RematPolicy(ir.RematKind.NONE)
        policies.append(policy)
        if pipeline is not None and pipeline.stages > 1 and inst.path == pipeline.child:
            _add_pipelined(t, blocks, inst, layer, x, policy, pipeline)
        else:
            _add_block(t, blocks, inst, layer, x, policy)
    if split is None and all(p.kind is ir.RematKind.NONE for p in policies):
        working = loss_working + blocks.working  # measured: XLA reuses neither for the other
    # (the fused loss's transient ends with the forward pass, before any layer's backward)
    else:
        working = max(loss_working, blocks.working)
    return Activations(
        saved=int(blocks.saved),
        working=int(working),
        offloaded=int(blocks.offloaded),
        saved_per_layer=int(blocks.per_layer),
        layers=blocks.layers,
        detail=blocks.detail,
        working_kind="loss" if loss_working >= blocks.working else "layer",
        reused=int(blocks.reused),
        loss_working=int(loss_working),
        layer_working=int(blocks.working),
        in_flight=int(blocks.in_flight),
    )


def _add_block(
    t: Tracer,
    blocks: _Blocks,
    inst: ir.Instance,
    layer: Scope,
    x: Val,
    policy: ir.RematPolicy,
    kept_layers: int | None = None,
) -> None:
    """One scanned block: `repeat` layers that each keep what `policy` keeps (a pattern's step
    runs k layers: its n / k steps count as n layers, each keeping a k-th of a step).
    `kept_layers`: how many layers' residuals are kept, when not n (a pipeline's iterations)."""
    n = int(filled(inst.repeat, f"the repeat of {inst.path}", "resolve").value)
    k = len(inst.children) if inst.pattern else 1
    kept, host = kept_values(layer, x, policy)
    kept_bytes = sum(t.nbytes(v) for v in kept)
    times = n if kept_layers is None else kept_layers
    blocks.per_layer += kept_bytes / k
    blocks.layers += n * k
    blocks.saved += times * kept_bytes
    blocks.offloaded += times * sum(t.nbytes(v) for v in host)
    for v in kept:
        key = f"{inst.path}: {v.label}"
        blocks.detail[key] = blocks.detail.get(key, 0) + int(t.nbytes(v))
    if inst.unrolled and kept_layers is None:
        blocks.reused += unrolled_reuse(t, inst, n, kept_bytes)
    # Backward of one layer: its residuals again, recomputed where remat dropped them
    # (XLA frees each as the backward consumes it, and cotangents reuse the space).
    all_res = sum(t.nbytes(v) for v in layer.residuals.values())
    recompute = max(all_res - sum(t.nbytes(v) for v in kept if id(v) in layer.residuals), 0.0)
    # Cotangents need space of their own (measured against XLA's memory_analysis with
    # benchmarks/aot_report.py): next to what remat recomputes, the largest one (the attention
    # probabilities' at long sequences); with remat none nothing is recomputed, but the stacked
    # residuals stay allocated until the scan's backward ends, and the two largest are live at once.
    dense = [v for v in layer.values if v.whole]  # XLA:GPU's ragged_dot
    sizes = sorted((t.nbytes(v) for v in layer.values if v.dims and v not in dense), reverse=True)
    cotangents = sum(sizes[:1] if policy.kind is not ir.RematKind.NONE else sizes[:2])
    transient = recompute + cotangents
    if policy.kind is ir.RematKind.NONE:
        transient = cotangents
    else:  # XLA:TPU fuses the elementwise recomputation into its consumers (platforms.py)
        transient *= t.platform.layer_recompute
    transient += sum(t.nbytes(v) for v in dense)
    blocks.working = max(blocks.working, transient + gathered_weights(t, inst))


def _add_pipelined(
    t: Tracer,
    blocks: _Blocks,
    inst: ir.Instance,
    layer: Scope,
    x: Val,
    policy: ir.RematPolicy,
    p: ir.PipelinePolicy,
) -> None:
    """The pipelined repeat (kernels/pipeline.py): every iteration of the loop keeps what one
    stage's layers keep for one micro-batch, and the loop's buffer holds every micro-batch at
    the repeat's boundary (the module docstring)."""
    n = int(filled(inst.repeat, f"the repeat of {inst.path}", "resolve").value)
    stage = staged_tracer(t, p)
    before = blocks.saved
    _add_block(stage, blocks, inst, layer, x, policy, p.iterations * p.layers_per_stage(n))
    blocks.saved += p.microbatches * stage.nbytes(x)  # the loop's input and output buffer
    if p.repeats > 1:  # each iteration picks its repeat's weights: kept per iteration
        blocks.saved += p.iterations * p.layers_per_stage(n) * layer_weights(t, inst)
    blocks.in_flight += blocks.saved - before


def layer_weights(t: Tracer, inst: ir.Instance) -> float:
    """One layer's weights on a chip (sharded as at rest, without their `layers` dim), in the
    compute dtype."""
    return sum(
        t.layout.param_elements(replace(p, stack=())) * DTYPE_BYTES[t.compute or p.dtype.name]
        for i in inst.walk()
        for p in i.params
    )


def staged_tracer(t: Tracer, p: ir.PipelinePolicy) -> Tracer:
    """`t` as one pipeline stage sees its work: a micro-batch (batch / microbatches sequences)
    split over the batch's mesh axes other than `stage` (the vmap over stages takes that)."""
    rules = dict(t.layout.rules)
    rules["batch"] = tuple(a for a in rules.get("batch", ()) if a != ir.STAGE_AXIS)
    view = copy.copy(t)
    view.layout = Layout(t.layout.sizes, rules, t.layout.axes_of_dim)
    view.batch = max(t.batch // p.microbatches, 1)
    return view


def unrolled_reuse(t: Tracer, inst: ir.Instance, n: int, kept: float) -> float:
    """Bytes of an unrolled block's gradients that reuse the space of residuals already freed.

    A rolled scan keeps its residual stacks until its backward ends and accumulates the stacked
    gradients beside them: saved + gradients. Unrolled, the backward frees a step's residuals
    (`kept`) as it makes that step's gradients (`grad`), so the peak is the larger end of that
    trade, saved + grad or kept + all the gradients: (n - 1) x min(kept, grad) less (measured
    against XLA's memory_analysis on a 4-layer llama: 64.4 MB of temporaries, 64.0 modelled).
    """
    grad = (
        sum(
            t.layout.param_elements(p) * DTYPE_BYTES[p.dtype.name]
            for i in inst.walk()
            for p in i.params
        )
        / n
    )
    return (n - 1) * min(kept, grad)


def kept_values(layer: Scope, x: Val, policy: ir.RematPolicy) -> tuple[list[Val], list[Val]]:
    """(on device, on host): what one layer keeps for the backward under `policy`."""
    residuals = list(layer.residuals.values())
    if policy.kind is ir.RematKind.NONE:
        return residuals, []
    if policy.kind is ir.RematKind.FULL:
        return [x], []
    if policy.kind is ir.RematKind.SAVE_DOTS:
        saveable = {id(v) for v in layer.values if v.dot}
    else:
        saveable = {id(v) for v in layer.values if v.point in policy.save + policy.offload}
    chosen: dict[int, Val] = {id(x): x}
    seen: set[int] = set()

    def visit(v: Val) -> None:  # walk back from a residual to the values it is recomputed from
        v = v.base
        if id(v) in seen:
            return
        seen.add(id(v))
        if v is x or v.kind in (ValKind.PARAM, ValKind.LIT):
            return
        if id(v) in saveable:
            chosen[id(v)] = v
            return
        for u in v.inputs:
            visit(u)

    for r in residuals:
        visit(r)
    host = [v for v in chosen.values() if v.point in policy.offload]
    device = [v for v in chosen.values() if v.point not in policy.offload]
    return device, host


def gathered_weights(t: Tracer, inst: ir.Instance) -> float:
    """One layer's weights gathered over the batch (FSDP) axes, in the compute dtype.

    A dropless MoE's expert weights enter its shard_map whole (kernels/moe.py `moe_dropless`,
    in_specs P() over the batch axes), and XLA gathers their `expert` axis too for the grouped
    matmuls (ragged_dot): a deviceless v5e 2x4 compile of a 64-expert MoE with mesh(expert = 4,
    fsdp = 2) holds bf16[64, 1024, 512] expert matrices, not [16, ...] (benchmarks/RESULTS.md).
    Their gradient is made whole on each chip before it is summed over the shards (the
    transpose of a replicated shard_map input), so it is counted beside them."""
    fsdp = set(t.layout.batch_axes())
    experts = set(t.layout.rules.get("experts", ())) | fsdp
    whole = _dropless_expert_weights(inst)
    total = 0.0
    for i in inst.walk():
        for p in i.params:
            moe = (i.path, p.name) in whole
            exclude = experts if moe else fsdp
            if not exclude:
                continue
            full = t.layout.param_elements(replace(p, stack=()), exclude=tuple(exclude))
            sharded = t.layout.param_elements(replace(p, stack=()))
            if full != sharded:
                total += (2 if moe else 1) * full * DTYPE_BYTES[t.compute or p.dtype.name]
    return total


def _dropless_expert_weights(inst: ir.Instance) -> set[tuple[str, str]]:
    """(instance path, parameter name) of the expert matrices of every MoE under `inst` that may
    run its dropless path (capacity_factor <= 0, or one read from Config)."""
    out = set()
    for i in inst.walk():
        for prim in prims_of(i, "moe"):
            cf = prim.attr("capacity_factor")
            if isinstance(cf.value, (int, float)) and cf.value > 0:
                continue
            for w in prim.args[2:5]:
                where = param_of(i, w)
                if where is not None:
                    out.add(where)
    return out


def fused_loss(t: Tracer, split: HeadSplit, hidden: Val, loss_chunk: int) -> tuple[float, float]:
    """The generated loss_fn's fused cross-entropy (axdsl/ir/head.py): (working bytes, bytes kept
    for the backward). It keeps the gradients its forward pass took: of the hidden state (in its
    dtype) and of the head's parameters (in theirs); its working set is one chunk of loss_chunk
    positions: the logits in float32, their softmax and gradient, and in the head's matmul dtype
    the logits and their gradient."""
    outer, t.scope = t.scope, Scope()  # the head's own residuals are never kept
    logits = t.call(split.head, [hidden])
    t.scope = outer
    chunk, facts = min(loss_chunk, t.seq) / t.seq, t.platform
    f32 = t.nbytes(Val(logits.dims, "f32", ValKind.OP, "logits"))
    grads = sum(t.layout.param_elements(p) * DTYPE_BYTES[p.dtype.name] for p in _head_params(split))
    kept = t.nbytes(hidden) + grads
    if chunk < 1:  # a scan over the chunks: the hidden gradients stacked by chunk, then unchunked,
        # and the head's gradient carried from chunk to chunk besides the one returned (CPU)
        kept = 2 * t.nbytes(hidden) + facts.loss_head_grads * grads
    working = chunk * (facts.loss_f32 * f32 + facts.loss_low * _low_precision_bytes(t, logits))
    return working + facts.loss_gathered_head * gathered_head(t, split), kept


def gathered_head(t: Tracer, split: HeadSplit) -> float:
    """The head's parameters gathered whole over the batch (FSDP) axes, in the compute dtype
    (0 when no batch axis shards them)."""
    fsdp = tuple(t.layout.batch_axes())
    total = 0.0
    for p in _head_params(split):
        full = t.layout.param_elements(p, exclude=fsdp) if fsdp else 0
        if full != t.layout.param_elements(p):
            total += full * DTYPE_BYTES[t.compute or p.dtype.name]
    return total


def _head_params(split: HeadSplit) -> list[ir.Param]:
    """The parameters the head reads: the root's own, or all of a child's (a tied embedding)."""
    root = split.body
    return [
        p
        for key in split.params
        for p in ((root.expect_param(key),) if root.param(key) else root.expect_child(key).params)
    ]


def _low_precision_bytes(t: Tracer, logits: Val) -> float:
    """Bytes of the head matmul's output before the cast to float32 (0 when it is float32)."""
    head = logits.inputs[0] if logits.label.endswith(": cast") and logits.inputs else logits
    return t.nbytes(head) if head.dtype != "f32" else 0.0


def loss(t: Tracer, logits: Val) -> float:
    """Cross-entropy over float32 logits (in train.py): saves exp(logits) in float32 (in the
    outer scope) and returns the working bytes at the loss: the logits in f32, their gradient in
    f32 and in the compute dtype of the head matmul."""
    f32 = (
        logits
        if logits.dtype == "f32"
        else Val(logits.dims, "f32", ValKind.OP, "logits (f32)", (logits,))
    )
    soft = Val(f32.dims, "f32", ValKind.INTERNAL, "softmax(logits)", (f32,))
    t.outer.values += [f32, soft]
    t.outer.save(soft)
    one = t.nbytes(f32)
    return one + one + _low_precision_bytes(t, logits)
