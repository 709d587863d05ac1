"""Per-chip memory of one training step, read off the IR (no jax: the build path may import this).

All figures are bytes on one chip, for a global batch of `batch` sequences of `seq` tokens split
into `microbatches`, on the target's mesh (or a mesh given to try another layout).

State (lives across steps)
    parameters      each parameter's bytes / (product of the mesh sizes its sharding uses)
    optimizer       adamw: two moments in the parameter dtype (lion, sgd with momentum: one;
                    adafactor: factored second moments), plus replicated scalars; with
                    `mu_dtype` (adamw, lion) the first moment in that dtype
    batch           the int32 [batch, seq + 1] input, split over the mesh axes of `batch`

Step temporaries
    gradients       one per parameter, in the parameter dtype, sharded like it; with
                    microbatches > 1 also the float32 accumulator of the micro-batch scan
    weight copies   mixed precision (`dtype` != `param_dtype` on the model): the forward casts
                    the parameters outside the stacked layers to the compute dtype once (a
                    sharded copy kept for the backward) and the backward produces their
                    gradients in that dtype before they are cast back (one more copy); a
                    stacked layer is cast in its scan step, so one layer's copy and gradient
                    exist at a time (with remat none the scan keeps every layer's copy)
    activations     saved + working, for one micro-batch:
      saved         what the backward needs from the forward, for every layer. The scanned block
                    keeps, per layer, what its remat policy keeps:
                      none       every residual of the block's backward (below)
                      full       only the layer input (the scan carry)
                      save_dots  the layer input and the outputs of matmuls with a parameter
                                 (dots without batch dims) that the backward needs directly or
                                 to recompute a residual
                      save/offload names  the layer input and those named points; offloaded
                                 points go to host memory (reported, not counted on the chip)
                    plus the residuals of the layers outside the scan (final norm, output head)
                    and of the loss: the float32 softmax over the vocabulary, or for the fused
                    cross-entropy of a next-token LM (axdsl/ir/head.py) the gradients of the
                    hidden state and of the head's parameters that its forward pass takes.
      working       the largest transient of the backward: at the loss, the float32 logits and
                    their gradient (in float32 and the compute dtype), of one chunk of
                    positions for the fused cross-entropy; in the scanned block, one
                    layer's residuals recomputed where remat dropped them (XLA frees each as the
                    backward consumes it and the cotangents reuse that space), or, without remat,
                    the layer's two largest cotangents. With FSDP, one layer's gathered weights
                    in the compute dtype come on top. Without remat both transients add up.
    update          the optimizer update runs after the activations are freed. The step skips
                    a non-finite update in the form the schedule records (`update_skip`, chosen
                    per platform by choose_update_skip): with `jnp.where(ok, new, old)` the
                    platform's `select_update` fraction of (parameters + moments) is
                    materialized before the select (XLA:CPU 0.57; XLA:GPU fuses it in place);
                    with jax.lax.cond, its `cond_update` fraction (XLA:CPU and TPU write it in
                    place; XLA:GPU makes new parameters and moments beside the old)

    in flight       under pipeline(...), the pipelined repeat keeps, for each of the loop's
                    microbatches x repeats + stages - 1 iterations, what one stage's layers keep
                    for one micro-batch (batch / microbatches over the batch's axes less
                    `stage`), the bubble's iterations included: the unpipelined figure / (1 -
                    bubble); plus the loop's buffer of every micro-batch at the repeat's input.
                    Its layer backward is one micro-batch's (activations.py)

    unrolled      a block the target unrolls (unroll_repeats) frees each step's residuals as its
                    backward makes that step's gradients, which reuse the space: (steps - 1) x
                    min(one step's saved bytes, one step's gradient bytes) less in the backward

    temporaries = gradients + max(weight copies + activations - unrolled reuse, update)

The package splits by concern: `layout.py` (per-chip sizes on the mesh), `values.py` and
`trace.py` (the traced forward; each primitive's memory rule sits in its registry entry,
axdsl/primitives/), `residuals.py` (what each binary operator saves), `activations.py` (remat
policies, saved and working bytes), `platforms.py` (what XLA keeps at once on each platform: the
loss's chunk buffers, the layer backward's share of its recomputation, TPU's 128-lane padding,
the usable memory; each fact with its measurement), this module (state, gradients, the update
and the total).

This is an analytic model: XLA's buffer assignment fuses, reorders and reuses buffers, so
expect agreement within about 10% of `compiled.memory_analysis()` (argument + temp), not exact
figures; `axdsl aot` prints both when it can compile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from axdsl import optim
from axdsl.analysis.activations import trace_activations
from axdsl.analysis.layout import DTYPE_BYTES, Layout
from axdsl.analysis.platforms import CPU, PlatformFacts, facts
from axdsl.analysis.trace import compute_dtype
from axdsl.ir import nodes as ir
from axdsl.ir.axes import dim_axes
from axdsl.analysis.head import loss_chunk, loss_split
from axdsl.lora import resolve as resolve_lora
from axdsl.objectives import batch_fields, batches_of, inputs as forward_inputs, objective_name
from axdsl.targets import profiles

__all__ = [
    "DTYPE_BYTES",
    "Layout",
    "MemoryEstimate",
    "UPDATE_SELECT_FRACTION",
    "UpdateSkip",
    "estimate_memory",
]


# How a train step skips an update whose loss or gradient is not finite: the schedule records the
# generated step's form (choose_update_skip, `Schedule.update_skip`), and the memory model reads
# it there, not from train.py's text.
UpdateSkip = ir.UpdateSkip
# XLA:CPU's measured cost of the select form (platforms.py `select_update`).
UPDATE_SELECT_FRACTION = CPU.select_update
# A jnp dtype name (what the train block resolves dtypes to) -> its spec name.
SPEC_DTYPES = {jnp_name: name for name, jnp_name in ir.DTYPES.items()}


# ---------------------------------------------------------------------------- the result
@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip of one training step; `total` is what must fit in the chip's memory."""

    model: str
    chips: int
    mesh: dict[str, int]
    batch: int
    seq: int
    microbatches: int
    remat: str
    optimizer: ir.OptimizerKind
    params: int
    grads: int
    opt_state: int
    weight_copies: int
    inputs: int  # the token batch
    saved: int  # activations kept for the backward (all layers, one micro-batch)
    working: int  # the largest backward transient
    offloaded: int = 0  # activations on host memory (not in total)
    saved_per_layer: int = 0
    layers: int = 0
    working_kind: str = ""  # "loss" or "layer"
    detail: dict[str, int] = field(default_factory=dict)  # saved per layer, by value
    update: int = 0  # transient of the optimizer update (after the backward has freed activations)
    reused: int = 0  # gradients of unrolled blocks written where freed residuals were
    mu_dtype: str | None = None  # the first moment's dtype (spec name), when not the parameter's
    # XLA's figure is a peak over the step's phases (platforms.py `phased`): then these apply
    phased: bool = False
    layer_grads: int = 0  # gradients of the scanned layers' parameters (made by their backward)
    loss_working: int = 0
    layer_working: int = 0
    # of `saved`: what the pipelined repeat keeps for every micro-batch in flight (pipeline(...))
    in_flight: int = 0
    pipeline: ir.PipelinePolicy | None = None  # the schedule's, on this estimate's mesh
    # XLA:GPU's transposed copy of the stacked layers' weights, kept through the backward
    # (platforms.py `transposed_layers_fp8`, `transposed_layers_fsdp`)
    transposed: int = 0

    @property
    def activations(self) -> int:
        return self.saved + self.working

    @property
    def peak_phase(self) -> str:
        """When the step peaks: "update" (the optimizer update), "backward"; on a phased
        platform the backward is "loss" (before any layer's gradient) or "layer"."""
        if self.phased:
            if self.grads + self.update > self._backward():
                return "update"
            at_loss = self.loss_working >= self.layer_grads + self.layer_working
            return "loss" if at_loss else "layer"
        backward = self.weight_copies + self.transposed + self.activations
        return "update" if self.update > backward else "backward"

    def _backward(self) -> int:
        """A phased platform's backward peak: what the forward saved and the weight copies, then
        the larger of the loss's transient (at the end of the forward, before any layer's
        gradient exists) and one layer's backward beside the layers' gradients."""
        phases = max(self.loss_working, self.layer_grads + self.layer_working)
        return self.weight_copies + self.transposed + self.saved - self.reused + phases

    @property
    def state(self) -> int:
        """What the step reads as arguments: parameters, optimizer state and the batch."""
        return self.params + self.opt_state + self.inputs

    @property
    def temporaries(self) -> int:
        """Gradients, plus the larger of the backward's and the optimizer update's transients
        (in the backward, less what gradients of unrolled blocks reuse of freed residuals). On a
        phased platform, the larger of the backward's peak and every gradient with the update."""
        if self.phased:
            return max(self._backward(), self.grads + self.update)
        backward = self.weight_copies + self.transposed + self.activations - self.reused
        return self.grads + max(backward, self.update)

    @property
    def total(self) -> int:
        return self.state + self.temporaries


@dataclass(frozen=True)
class _State:
    """Per-chip bytes of the parameters, their optimizer moments and compute-dtype copies."""

    params: int
    moments: int
    weight_copies: int
    param_f32: int  # the parameters' elements x 4 (a float32 accumulator of the gradients)
    trained: int | None = None  # bytes of what the optimizer updates; None: every parameter
    layer_params: int = 0  # bytes of the parameters of scanned layers (stacked)


def _example_bytes(module: ir.Module, root: ir.Instance, seq: int) -> int:
    """One example of the batch as train.py feeds it (int32 ids and labels, float32 images): a
    next-token row of seq + 1 ids, an image and its label, or seq positions of each field."""
    kind = batches_of(module) if module.train_settings is not None else "next_token"
    if kind == "next_token":
        return (seq + 1) * 4
    if kind == "classify":
        images = next((a for a in root.fwd.args if a.name == "images"), None)
        return (math.prod(d.size or 1 for d in images.dims[1:]) + 1) * 4 if images else 4
    return len(batch_fields(kind, forward_inputs(root))) * seq * 4


def estimate_memory(
    module: ir.Module,
    model: str | None = None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    microbatches: int | None = None,
    optimizer: str | None = None,
    mesh: dict[str, int] | None = None,
    remat: ir.RematPolicy | None = None,
    update_select: bool | None = None,
    mu_dtype: str | None = None,
) -> MemoryEstimate:
    """Per-chip bytes of a training step of `model` (default: the spec's first model).

    Unset arguments come from the spec's train block (`module.train_settings`) and the target's
    schedule; `mesh` (axis -> size) and `remat` replace the target's to try another layout.
    `update_select`: whether the step keeps the old state when the loss is not finite with an
    elementwise select (`jnp.where(ok, new, old)`) rather than jax.lax.cond; by default the
    schedule's form (`update_skip`), cpu's cond without a target.
    `mu_dtype` (a spec dtype name, "bf16"): the optimizer's first moment in that dtype (optax's
    mu_dtype); by default the train block's optimizer argument, else the parameter dtype.
    """
    m = _model(module, model)
    platform = platform_of(module)
    if update_select is None:
        skip = module.schedule.update_skip if module.schedule is not None else UpdateSkip.COND
        update_select = skip is UpdateSkip.SELECT
    train = module.train_settings
    batch = batch or (train.get("batch") if train else 8)
    seq = seq or (train.get("seq") if train else 128)
    microbatches = microbatches or (train.get("microbatches") if train else 1)
    if optimizer is None:
        optimizer = train.get("optimizer").name if train else optim.DEFAULT_OPTIMIZER
    optimizer = ir.OptimizerKind(optimizer)
    if mu_dtype is None and train is not None and train.get("optimizer").name == optimizer:
        mu_dtype = SPEC_DTYPES.get(train.get("optimizer").arg("mu_dtype", ""))
    if not optim.OPTIMIZERS[optimizer].has_mu_dtype:
        mu_dtype = None
    sizes = dict(mesh) if mesh is not None else dict(module.target.mesh_sizes)
    rules = {k: c.value for k, c in module.target.rules}
    layout = Layout(sizes, rules, dim_axes(m.root))
    policy = remat or _block_remat(m.root)
    kept = policy.kind  # what the blocks keep: every residual where the platform ignores remat
    if _unrolled(m.root) and not platform_of(module).unrolled_remat:
        kept = ir.RematKind.NONE
    pipeline = module.schedule.pipeline.value if module.schedule is not None else None
    if pipeline is not None:  # the stages of the mesh estimated (a suggestion may try others)
        pipeline = replace(pipeline, stages=sizes.get("stage", 1))
    staged = (pipeline.child, pipeline.stages) if pipeline is not None else None
    st = _state(m.root, layout, optimizer, kept, mu_dtype, staged)
    grads = st.params + (
        st.param_f32 if microbatches > 1 else 0
    )  # + the micro-batch scan's accumulator
    if train is not None and "lora" in dict(train.settings):
        st, grads = _lora_state(
            m.root, layout, optimizer, train.get("lora"), st, microbatches, mu_dtype
        )
    inputs = math.ceil(batch / layout.shards(rules.get("batch", ()))) * _example_bytes(
        module, m.root, seq
    )
    split = loss_split(m.root, objective_name(module))
    act = trace_activations(
        m.root,
        layout,
        batch // microbatches,
        seq,
        remat,
        split,
        loss_chunk(module.schedule),
        platform_of(module),
        module.schedule.context.value if module.schedule is not None else None,
        pipeline,
    )
    # XLA:GPU's transposed copy of the stacked layers' weights (platforms.py `transposed_layers_*`)
    fsdp = any(sizes.get(a, 1) > 1 for a in layout.batch_axes())
    quant = module.schedule.quantize.value.format if module.schedule is not None else None
    transposed = (
        platform.transposed_layers_fsdp
        if fsdp
        else (platform.transposed_layers_fp8 if quant is ir.QuantFormat.FP8 else 0.0)
    )
    return MemoryEstimate(
        model=m.name,
        chips=math.prod(sizes.values()),
        mesh=sizes,
        batch=batch,
        seq=seq,
        microbatches=microbatches,
        remat=policy.kind,
        optimizer=optimizer,
        params=st.params,
        grads=grads,
        opt_state=st.moments + 3 * 4,  # + step, step count, bad_steps
        weight_copies=st.weight_copies,
        transposed=int(transposed * st.layer_params),
        inputs=inputs,
        saved=act.saved,
        working=act.working,
        offloaded=act.offloaded,
        saved_per_layer=act.saved_per_layer,
        layers=act.layers,
        working_kind=act.working_kind,
        detail=act.detail,
        update=int(
            (platform.select_update if update_select else platform.cond_update)
            * (_trained(st) + st.moments)
        ),
        reused=act.reused,
        mu_dtype=mu_dtype,
        phased=platform_of(module).phased,
        layer_grads=st.layer_params if microbatches == 1 else grads,
        loss_working=act.loss_working,
        layer_working=act.layer_working,
        in_flight=act.in_flight,
        pipeline=pipeline,
    )


def _state(
    root: ir.Instance,
    layout: Layout,
    optimizer: ir.OptimizerKind,
    remat: ir.RematKind,
    mu: str | None = None,
    staged: tuple[str, int] | None = None,
) -> _State:
    """Parameters and optimizer moments, sharded; the cast copies when the model computes in
    another dtype. The root casts what is outside its stacked children once (a copy and its
    gradient); a stacked child one layer at a time in its scan step, so only one layer's copy and
    gradient exist at once, unless the scan keeps every layer's cast weights for the backward
    (remat none). `staged`: (the pipelined repeat's path, stages) under pipeline(...): each chip
    keeps only its stage's layers of that repeat (plan_pipeline puts their `layers` dim on
    `stage`)."""
    params = opt = copies = f32 = layered = 0
    compute = compute_dtype(root)
    per_layer: dict[str, int] = {}  # a stack's path -> one layer's cast bytes
    for inst in root.walk():
        top = root.stack_of(inst.path)  # the stack this layer is cast in, a layer at a time
        stages = staged[1] if staged and top is not None and top.path == staged[0] else 1
        for p in inst.params:
            full = layout.param_elements(p)
            n = -(-full // stages)  # this chip's stage holds 1 / stages of a pipelined stack
            params += n * DTYPE_BYTES[p.dtype.name]
            opt += _opt_bytes(optimizer, p, n, mu)
            f32 += n * 4
            if top is not None and top.repeat is not None:
                layered += n * DTYPE_BYTES[p.dtype.name]
            if compute is None or compute == p.dtype.name:
                continue
            if top is None or top.repeat is None:
                copies += 2 * n * DTYPE_BYTES[compute]  # the cast copy and its gradient
                continue
            layers = math.prod(ir.static_size(d) for d in p.stack)
            per_layer[top.path] = per_layer.get(top.path, 0) + full // layers * DTYPE_BYTES[compute]
            if remat is ir.RematKind.NONE:
                copies += n * DTYPE_BYTES[compute]  # every layer's cast weights, kept as residuals
    return _State(params, opt, copies + 2 * max(per_layer.values(), default=0), f32, None, layered)


def _lora_state(
    root: ir.Instance,
    layout: Layout,
    optimizer: ir.OptimizerKind,
    settings,
    base: _State,
    microbatches: int,
    mu: str | None = None,
) -> tuple[_State, int]:
    """LoRA (train.py's lora(...)): the base parameters are frozen, so they have no gradients and
    no optimizer moments; the adapters (replicated) have both. The loss reads merged copies
    W + scale * A @ B of the targets, and the cast copy of the base weights has no gradient."""
    targets, _ = resolve_lora(settings, root)
    adapters = moments = f32 = merged = 0
    for t in targets:
        n, b = t.adapter_elements(settings.rank), DTYPE_BYTES[t.param.dtype.name]
        adapters += n * b
        factored = optim.OPTIMIZERS[optimizer].factored
        moments += n * 4 if factored else _moment_bytes(optimizer, b, mu) * n
        f32 += n * 4
        merged += layout.param_elements(t.param) * b
    state = _State(base.params + adapters, moments, base.weight_copies // 2 + merged, f32, adapters)
    return state, adapters + (f32 if microbatches > 1 else 0)


def platform_of(module: ir.Module) -> PlatformFacts:
    """The facts of the platform the module's target compiles for (CPU's without a target)."""
    if module.schedule is None:
        return CPU
    return facts(profiles()[module.schedule.profile].kind)


def _trained(st: _State) -> int:
    return st.params if st.trained is None else st.trained


def _model(module: ir.Module, name: str | None) -> ir.Model:
    if name is None:
        return module.models[0]
    for m in module.models:
        if m.name == name:
            return m
    raise KeyError(
        f"no model `{name}` in {module.spec}; models: {', '.join(x.name for x in module.models)}"
    )


def _unrolled(root: ir.Instance) -> bool:
    """Whether the model's repeated block is unrolled (unroll_repeats)."""
    return any(inst.unrolled for inst in root.walk() if inst.repeat is not None)


def _block_remat(root: ir.Instance) -> ir.RematPolicy:
    for inst in root.walk():
        if inst.repeat is not None:
            return inst.remat or ir.RematPolicy(ir.RematKind.NONE)
    return ir.RematPolicy(ir.RematKind.NONE)


def _moment_bytes(optimizer: ir.OptimizerKind, b: int, mu: str | None) -> int:
    """Bytes of an element's moments for parameters of `b` bytes: the first moment in `mu` when
    given (optax's mu_dtype), the others in the parameter dtype."""
    moments = optim.OPTIMIZERS[optimizer].moments
    if mu is None or moments == 0:
        return moments * b
    return DTYPE_BYTES[mu] + (moments - 1) * b


def _opt_bytes(optimizer: ir.OptimizerKind, p: ir.Param, n: int, mu: str | None = None) -> int:
    """Optimizer moments of one parameter of `n` elements on a chip."""
    b = DTYPE_BYTES[p.dtype.name]
    if optim.OPTIMIZERS[optimizer].factored:
        dims = [ir.static_size(d) for d in p.full_dims]
        if len(dims) >= 2:  # factored second moment: rows and columns of the two largest dims
            r, c = sorted(range(len(dims)), key=lambda i: dims[i])[-2:]
            return (n // dims[r] + n // dims[c]) * 4
        return n * 4
    return _moment_bytes(optimizer, b, mu) * n
