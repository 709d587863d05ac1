"""Per-chip memory of one training step, read off the IR (no jax: the build path may import this).

All figures are bytes on one chip, for a global batch of `batch` sequences of `seq` tokens split
into `microbatches`, on the target's mesh (or a mesh given to try another layout).

State (lives across steps)
    parameters      each parameter's bytes / (product of the mesh sizes its sharding uses)
    optimizer       adamw: two moments in the parameter dtype (lion, sgd with momentum: one;
                    adafactor: factored second moments), plus replicated scalars
    batch           the int32 [batch, seq + 1] input, split over the mesh axes of `batch`

Step temporaries
    gradients       one per parameter, in the parameter dtype, sharded like it; with
                    microbatches > 1 also the float32 accumulator of the micro-batch scan
    weight copies   mixed precision (`dtype` != `param_dtype` on the model): the forward casts
                    every parameter to the compute dtype once (a sharded copy kept for the
                    backward) and the backward produces gradients in that dtype before they are
                    cast back (one more copy)
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
                    and of the loss (float32 softmax over the vocabulary).
      working       the largest transient of the backward: at the loss, the float32 logits and
                    their gradient (in float32 and the compute dtype); in the scanned block, one
                    layer's residuals recomputed where remat dropped them (XLA frees each as the
                    backward consumes it and the cotangents reuse that space), or, without remat,
                    the layer's two largest cotangents. With FSDP, one layer's gathered weights
                    in the compute dtype come on top. Without remat both transients add up.
    update          the optimizer update runs after the activations are freed; when the step
                    skips non-finite updates with `jnp.where(ok, new, old)` the new parameters
                    and moments are materialized before the select (`UPDATE_SELECT_FRACTION`)

    temporaries = gradients + max(weight copies + activations, update)

Residuals are modelled per operation as jax 0.10 saves them (`jax.ad_checkpoint.
print_saved_residuals`): a matmul or einsum keeps its activation operands; `a * b` keeps each
operand whose partner is differentiable; casts, sums, means, adds and rope keep nothing; each
elementwise function keeps what its derivative reads (table `UNARY`); XLA attention keeps q, k,
v, the mask, the masked logits and exp in float32 and the probabilities in the compute dtype
([B, heads, S, S] each), flash kernels (cudnn, splash) keep q, k, v, the output and the
log-sum-exp; fp8/int8 matmuls keep both operands in one byte each (the weight gathered).
Activation sizes are per chip: B over the `batch` mesh axes, S over `seq`, heads and mlp dims
over their rules, each mesh axis used once per tensor (as `annotate_sharding.activation_spec`).

This is an analytic model: XLA's buffer assignment fuses, reorders and reuses buffers, so
expect agreement within about 10% of `compiled.memory_analysis()` (argument + temp), not exact
figures; `axdsl aot` prints both when it can compile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from axdsl.ir import nodes as ir
from axdsl.passes.annotate_sharding import FREE_DIM_AXES, dim_axes

DTYPE_BYTES = {
    "f64": 8, "f32": 4, "bf16": 2, "f16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
    "i8": 1, "u8": 1, "u16": 2, "i32": 4, "u32": 4, "bool": 1,
}
_FLOAT_RANK = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "f16": 2, "f32": 3, "f64": 4}

# What each elementwise function's backward reads (jax 0.10.2, measured with
# print_saved_residuals): (keeps its input, extra same-dtype tensors, extra bool tensors,
# keeps its output).
UNARY = {
    "silu": (True, 2, 0, False),
    "gelu": (True, 4, 0, False),  # tanh approximation (jax.nn.gelu's default)
    "relu": (False, 1, 1, False),
    "sigmoid": (False, 1, 0, False),
    "tanh": (False, 1, 0, False),
    "exp": (False, 0, 0, True),
    "log": (True, 0, 0, False),
    "rsqrt": (False, 1, 0, False),
    "sqrt": (False, 1, 0, False),
    "abs": (False, 0, 1, False),
    "square": (False, 1, 0, False),
    "softmax": (False, 1, 0, True),
}
LINEAR = ("cast", "mean", "sum", "rope", "prefix", "transpose", "split_heads", "merge_heads", "embed")
VIEWS = ("transpose", "split_heads", "merge_heads")
FLASH_KERNELS = ("cudnn", "splash")
# The optimizer update with a skip-on-non-finite select computes new parameters and moments
# before selecting them, so they cannot be written in place: measured on XLA:CPU, about this
# fraction of (parameters + moments) is live at once (0.53-0.58 over three model shapes; the
# select overlaps with the next leaf's update). `jax.lax.cond` instead of the select avoids it.
UPDATE_SELECT_FRACTION = 0.57
# Moments per parameter element in the parameter dtype, by optimizer.
OPT_MOMENTS = {"adamw": 2, "adam": 2, "lion": 1, "sgd": 1, "adafactor": 0}


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
    optimizer: str
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

    @property
    def activations(self) -> int:
        return self.saved + self.working

    @property
    def peak_phase(self) -> str:
        """When the step peaks: in the backward (activations) or in the optimizer update."""
        return "update" if self.update > self.weight_copies + self.activations else "backward"

    @property
    def state(self) -> int:
        """What the step reads as arguments: parameters, optimizer state and the batch."""
        return self.params + self.opt_state + self.inputs

    @property
    def temporaries(self) -> int:
        """Gradients, plus the larger of the backward's and the optimizer update's transients."""
        return self.grads + max(self.weight_copies + self.activations, self.update)

    @property
    def total(self) -> int:
        return self.state + self.temporaries


def estimate_memory(module: ir.Module, model: str | None = None, *, batch: int | None = None,
                    seq: int | None = None, microbatches: int | None = None,
                    optimizer: str | None = None, mesh: dict[str, int] | None = None,
                    remat: ir.RematPolicy | None = None, update_select: bool = True) -> MemoryEstimate:
    """Per-chip bytes of a training step of `model` (default: the spec's first model).

    Unset arguments come from the spec's train block (`module.train_settings`) and the target's
    schedule; `mesh` (axis -> size) and `remat` replace the target's to try another layout.
    `update_select`: the step keeps the old state when the loss is not finite with an
    elementwise select (`jnp.where(ok, new, old)`), which materializes new values first.
    """
    m = _model(module, model)
    sched = module.schedule
    train = module.train_settings
    batch = batch or (train.get("batch") if train else 8)
    seq = seq or (train.get("seq") if train else 128)
    microbatches = microbatches or (train.get("microbatches") if train else 1)
    if optimizer is None:
        optimizer = train.get("optimizer").name if train else "adamw"
    sizes = dict(mesh) if mesh is not None else dict(sched.mesh_sizes)
    rules = {k: c.value for k, c in sched.rules}
    layout = Layout(sizes, rules, dim_axes(m.root))
    chips = math.prod(sizes.values())

    # State: parameters and optimizer moments, sharded.
    params = opt = copies = 0
    compute = _compute_dtype(m.root)
    for inst in m.root.walk():
        for p in inst.params:
            n = layout.param_elements(p)
            params += n * DTYPE_BYTES[p.dtype.name]
            opt += _opt_bytes(optimizer, p, n)
            if compute is not None and compute != p.dtype.name:
                copies += 2 * n * DTYPE_BYTES[compute]  # the cast copy and its gradient
    moments = opt
    opt += 3 * 4  # step count, step, bad_steps (int32 scalars, replicated)
    grads = params
    if microbatches > 1:  # the float32 accumulator of the micro-batch scan
        grads += sum(layout.param_elements(p) * 4 for i in m.root.walk() for p in i.params)
    inputs = math.ceil(batch / layout.shards(rules.get("batch", ()))) * (seq + 1) * 4

    # Activations of one micro-batch.
    tracer = _Tracer(m.root, layout, batch // microbatches, seq, remat)
    act = tracer.run()
    return MemoryEstimate(
        model=m.name, chips=chips, mesh=sizes, batch=batch, seq=seq, microbatches=microbatches,
        remat=(remat or _block_remat(m.root)).kind, optimizer=optimizer,
        params=params, grads=grads, opt_state=opt, weight_copies=copies, inputs=inputs,
        saved=act["saved"], working=act["working"], offloaded=act["offloaded"],
        saved_per_layer=act["saved_per_layer"], layers=act["layers"],
        working_kind=act["working_kind"], detail=act["detail"],
        update=int(UPDATE_SELECT_FRACTION * (params + moments)) if update_select else 0,
    )


def _model(module: ir.Module, name: str | None) -> ir.Model:
    if name is None:
        return module.models[0]
    for m in module.models:
        if m.name == name:
            return m
    raise KeyError(f"no model `{name}` in {module.spec}; models: {', '.join(x.name for x in module.models)}")


def _compute_dtype(root: ir.Instance) -> str | None:
    """The dtype every parameter is cast to at the model entry, when the model says so."""
    d, pd = root.hparam("dtype"), root.hparam("param_dtype")
    if d is None or pd is None:
        return None
    return d.value.value.name


def _block_remat(root: ir.Instance) -> ir.RematPolicy:
    for inst in root.walk():
        if inst.repeat is not None:
            return inst.remat or ir.RematPolicy("none")
    return ir.RematPolicy("none")


def _opt_bytes(optimizer: str, p: ir.Param, n: int) -> int:
    b = DTYPE_BYTES[p.dtype.name]
    if optimizer == "adafactor":
        dims = [d.size for d in p.full_dims]
        if len(dims) >= 2:  # factored second moment: rows and columns of the two largest dims
            r, c = sorted(range(len(dims)), key=lambda i: dims[i])[-2:]
            return (n // dims[r] + n // dims[c]) * 4
        return n * 4
    return OPT_MOMENTS.get(optimizer, 2) * n * b


# ---------------------------------------------------------------------------- sharding
@dataclass(frozen=True)
class Layout:
    """Mesh sizes and logical-axis rules: how many ways each tensor is split."""

    sizes: dict[str, int]
    rules: dict[str, tuple[str, ...]]
    axes_of_dim: dict[str, str]  # named dim -> logical axis (dim -> embed), plus B and S

    def shards(self, axes) -> int:
        return math.prod(self.sizes.get(a, 1) for a in axes)

    def _axes(self, logical: str | None, used: set[str]) -> tuple[str, ...]:
        if not logical:
            return ()
        return tuple(a for a in self.rules.get(logical, ()) if self.sizes.get(a, 1) > 1 and a not in used)

    def param_elements(self, p: ir.Param, exclude: tuple[str, ...] = ()) -> float:
        """Elements of `p` on one chip; `exclude` mesh axes are gathered (FSDP at compute time)."""
        used = set(exclude)
        n = 1.0
        for d, logical in zip(p.full_dims, p.full_axes):
            axes = self._axes(logical, used)
            used.update(axes)
            n *= d.size / self.shards(axes)
        return int(math.ceil(n))

    def batch_axes(self) -> tuple[str, ...]:
        return self._axes("batch", set())

    def elements(self, dims: tuple[ir.Dim, ...], batch: int, seq: int, weight: bool = False) -> float:
        """Elements of an activation on one chip; `weight`: a gathered weight (batch axes unused)."""
        used: set[str] = set(self.batch_axes()) if weight else set()
        n = 1.0
        for d in dims:
            if d.name == "B" and d.size is None:
                size, logical = batch, "batch"
            elif d.name == "S" and d.size is None:
                size, logical = seq, "seq"
            else:
                size, logical = (d.size or 1), self.axes_of_dim.get(d.name)
            axes = self._axes(logical, used)
            used.update(axes)
            n *= size / self.shards(axes)
        return n


# ---------------------------------------------------------------------------- residual tracing
@dataclass(eq=False)
class Val:
    """A tensor value of the traced forward (compared by identity)."""

    dims: tuple[ir.Dim, ...]
    dtype: str
    kind: str  # input, param, lit, op, internal, view
    label: str
    inputs: tuple["Val", ...] = ()
    point: str | None = None
    dot: bool = False  # a matmul output without batch dims (save_dots keeps these)
    weight: bool = False  # a gathered weight (sized without the batch mesh axes)

    @property
    def base(self) -> "Val":
        v = self
        while v.kind == "view":
            v = v.inputs[0]
        return v

    @property
    def differentiable(self) -> bool:
        return self.kind != "lit"

    @property
    def activation(self) -> bool:
        return self.base.kind not in ("param", "lit")


class _Trace:
    """Values and residuals of one scope (the whole model outside the scan, or one layer)."""

    def __init__(self) -> None:
        self.values: list[Val] = []
        self.residuals: dict[int, Val] = {}

    def save(self, v: Val) -> None:
        v = v.base
        if v.kind in ("param", "lit") or not v.dims:
            return
        self.residuals.setdefault(id(v), v)


class _Tracer:
    def __init__(self, root: ir.Instance, layout: Layout, batch: int, seq: int,
                 remat: ir.RematPolicy | None) -> None:
        self.root, self.layout, self.batch, self.seq = root, layout, batch, seq
        self.remat_override = remat
        self.compute = _compute_dtype(root)
        self.outer = _Trace()
        self.scope = self.outer
        self.blocks: list[tuple[ir.Instance, _Trace, Val]] = []

    # ------------------------------------------------------------- sizes
    def nbytes(self, v: Val) -> float:
        return self.layout.elements(v.dims, self.batch, self.seq, v.weight) * DTYPE_BYTES[v.dtype]

    # ------------------------------------------------------------- the result
    def run(self) -> dict:
        fwd = self.root.forward
        args = [Val(a.dims, "i32", "input", f"/{a.name}") for a in fwd.args]
        logits = self.call(self.root, args)
        self.loss(logits)
        saved = sum(self.nbytes(v) for v in self.outer.residuals.values())
        offloaded = 0.0
        per_layer = 0.0
        layers = 0
        detail: dict[str, int] = {}
        layer_working = 0.0
        for inst, trace, x in self.blocks:
            policy = self.remat_override or inst.remat or ir.RematPolicy("none")
            n = int(inst.repeat.value)
            kept, host = self.kept(trace, x, policy)
            kept_bytes = sum(self.nbytes(v) for v in kept)
            per_layer += kept_bytes
            layers += n
            saved += n * kept_bytes
            offloaded += n * sum(self.nbytes(v) for v in host)
            for v in kept:
                key = f"{inst.path}: {v.label}"
                detail[key] = detail.get(key, 0) + int(self.nbytes(v))
            # Backward of one layer: its residuals again, recomputed where remat dropped them
            # (XLA frees each as the backward consumes it, and cotangents reuse the space).
            all_res = sum(self.nbytes(v) for v in trace.residuals.values())
            recompute = max(all_res - sum(self.nbytes(v) for v in kept if id(v) in trace.residuals), 0.0)
            if policy.kind == "none":
                # Nothing to recompute, but the stacked residuals stay allocated until the scan's
                # backward ends: the layer's cotangents (its two largest) need space of their own.
                sizes = sorted((self.nbytes(v) for v in trace.values if v.dims), reverse=True)
                recompute = sum(sizes[:2])
            gathered = self.gathered_weights(inst)
            layer_working = max(layer_working, recompute + gathered)
        loss_working = self.loss_working
        policies = [self.remat_override or i.remat or ir.RematPolicy("none") for i, _, _ in self.blocks]
        if all(p.kind == "none" for p in policies):
            working = loss_working + layer_working  # measured: XLA reuses neither for the other
        else:
            working = max(loss_working, layer_working)
        return {
            "saved": int(saved), "working": int(working), "offloaded": int(offloaded),
            "saved_per_layer": int(per_layer), "layers": layers, "detail": detail,
            "working_kind": "loss" if loss_working >= layer_working else "layer",
        }

    def kept(self, trace: _Trace, x: Val, policy: ir.RematPolicy) -> tuple[list[Val], list[Val]]:
        """(on device, on host): what one layer keeps for the backward under `policy`."""
        residuals = list(trace.residuals.values())
        if policy.kind == "none":
            return residuals, []
        if policy.kind == "full":
            return [x], []
        if policy.kind == "save_dots":
            saveable = {id(v) for v in trace.values if v.dot}
        else:
            saveable = {id(v) for v in trace.values if v.point in policy.save + policy.offload}
        chosen: dict[int, Val] = {id(x): x}
        seen: set[int] = set()

        def visit(v: Val) -> None:  # walk back from a residual to the values it is recomputed from
            v = v.base
            if id(v) in seen:
                return
            seen.add(id(v))
            if v is x or v.kind in ("param", "lit"):
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

    def gathered_weights(self, inst: ir.Instance) -> float:
        """One layer's weights gathered over the batch (FSDP) axes, in the compute dtype."""
        fsdp = set(self.layout.batch_axes())
        if not fsdp:
            return 0.0
        total = 0.0
        for i in inst.walk():
            for p in i.params:
                full = self.layout.param_elements(replace(p, stack=()), exclude=tuple(fsdp))
                sharded = self.layout.param_elements(replace(p, stack=()))
                if full != sharded:
                    total += full * DTYPE_BYTES[self.compute or p.dtype.name]
        return total

    # ------------------------------------------------------------- the loss (in train.py)
    def loss(self, logits: Val) -> None:
        """Cross-entropy over float32 logits: keeps exp(logits) in float32 for the backward."""
        f32 = logits if logits.dtype == "f32" else Val(logits.dims, "f32", "op", "logits (f32)", (logits,))
        soft = Val(f32.dims, "f32", "internal", "softmax(logits)", (f32,))
        self.outer.values += [f32, soft]
        self.outer.save(soft)
        one = self.nbytes(f32)
        # at the loss: the logits in f32, their softmax (saved, counted above), the gradient in
        # f32 and in the compute dtype of the head matmul
        head = logits.inputs[0] if logits.label.endswith(": cast") and logits.inputs else logits
        low = self.nbytes(head) if head.dtype != "f32" else 0.0
        self.loss_working = one + one + low

    # ------------------------------------------------------------- evaluation
    def call(self, inst: ir.Instance, args: list[Val]) -> Val:
        fwd = inst.forward
        bind = _bind(fwd.args, args)
        env = {a.name: v for a, v in zip(fwd.args, args)}
        for stmt in fwd.body:
            v = self.ev(stmt.value, inst, env, bind)
            if isinstance(stmt, ir.Ret):
                return v
            if stmt.point:
                v.point = stmt.point
                if v.kind == "view":
                    v.base.point = stmt.point
            env[stmt.name] = v
        raise ValueError(f"{inst.path}: forward without return")

    def new(self, dims, dtype, label, inputs=(), kind="op", **kw) -> Val:
        v = Val(tuple(dims), dtype, kind, label, tuple(inputs), **kw)
        self.scope.values.append(v)
        return v

    def dims(self, e: ir.TExpr, bind: dict) -> tuple[ir.Dim, ...]:
        t = e.type
        if not isinstance(t, ir.TensorType):
            return ()
        out: list[ir.Dim] = []
        for d in t.dims:
            if d.is_ellipsis or (d.size is None and d.name in bind):
                out.extend(bind.get(d.name, ()))
            else:
                out.append(d)
        return tuple(out)

    def param_val(self, p: ir.Param, label: str) -> Val:
        dtype = self.compute or p.dtype.name
        return Val(p.dims, dtype, "param", label)

    def ev(self, e: ir.TExpr, inst: ir.Instance, env: dict, bind: dict) -> Val:
        if isinstance(e, ir.Ref):
            if e.kind in ("local", "arg"):
                return env[e.name]
            if e.kind == "param":
                return self.param_val(inst.param(e.name), f"{inst.path}/{e.name}")
            if e.kind == "child_param":
                child = inst.child(e.owner)
                return self.param_val(child.param(e.name), f"{child.path}/{e.name}")
            return Val((), "f32", "lit", e.name)
        if isinstance(e, ir.Lit):
            return Val((), "f32", "lit", repr(e.value))
        if isinstance(e, ir.Neg):
            x = self.ev(e.operand, inst, env, bind)
            return self.new(x.dims, x.dtype, "neg", (x,))
        if isinstance(e, ir.Bin):
            return self.binary(e, inst, env, bind)
        if isinstance(e, ir.CallChild):
            args = [self.ev(a, inst, env, bind) for a in e.args]
            child = inst.child(e.child)
            if child.repeat is not None:
                return self.scanned(child, args[0], e, bind)
            return self.call(child, args)
        return self.prim(e, inst, env, bind)

    def scanned(self, child: ir.Instance, x: Val, e: ir.CallChild, bind: dict) -> Val:
        """A repeated child: trace one layer in its own scope; the scan output is a new value."""
        outer = self.scope
        trace = _Trace()
        self.scope = trace
        x_in = Val(x.dims, x.dtype, "input", f"{child.path} input")
        self.call(child, [x_in])
        self.scope = outer
        self.blocks.append((child, trace, x_in))
        return self.new(x.dims, x.dtype, f"{child.path} output", (x,))

    def binary(self, e: ir.Bin, inst: ir.Instance, env: dict, bind: dict) -> Val:
        a = self.ev(e.left, inst, env, bind)
        b = self.ev(e.right, inst, env, bind)
        dims = self.dims(e, bind)
        dtype = _promote(a, b)
        if e.op == "@":
            out = self.new(dims, dtype, f"{inst.path}: matmul", (a, b),
                           dot=not (a.activation and b.activation))
            self.scope.save(a)
            self.scope.save(b)
            return out
        out = self.new(dims, dtype, f"{inst.path}: {e.op}", (a, b))
        if e.op == "*":
            if b.differentiable:
                self.scope.save(a)
            if a.differentiable:
                self.scope.save(b)
        elif e.op == "/":
            if b.differentiable:
                self.scope.save(b)
                self.scope.save(out)
        return out

    def prim(self, e: ir.Prim, inst: ir.Instance, env: dict, bind: dict) -> Val:
        name = e.name
        if name == "quantized":
            return self.quantized(e, inst, env, bind)
        args = [self.ev(a, inst, env, bind) for a in e.args]
        dims = self.dims(e, bind)
        label = f"{inst.path}: {name}"
        x = args[0] if args else None
        if name == "cast":
            target = e.attr("dtype")
            target = target.value if isinstance(target, ir.HValue) else target
            target = target.name if isinstance(target, ir.DType) else str(target)
            if target == x.dtype:
                return x
            return self.new(dims, target, label, (x,))
        if name in VIEWS:
            return self.new(dims, x.dtype, label, (x,), kind="view")
        if name == "prefix" and x.kind == "param":
            return Val(dims, x.dtype, "param", label)
        if name == "embed":
            return self.new(dims, x.dtype, label, (args[1],))
        if name == "einsum":
            operands = e.attr("spec").operands
            out_names = set(e.attr("spec").out)
            batch_dims = set()
            if len(operands) > 1:
                batch_dims = set.intersection(*(set(o) for o in operands)) & out_names
            out = self.new(dims, _promote(*args), label, args,
                           dot=not batch_dims and any(not a.activation for a in args))
            for a in args:
                self.scope.save(a)
            return out
        if name == "attention":
            return self.attention(e, args, dims, label)
        if name == "moe":
            return self.moe(e, args, dims, label)
        if name == "dropout":
            out = self.new(dims, x.dtype, label, (x,))
            mask = self.new(dims, "bool", f"{label} mask", (x,), kind="internal")
            self.scope.save(mask)
            return out
        if name in LINEAR:
            return self.new(dims, x.dtype, label, (x,))
        fn = name
        if name == "activate":
            fn = e.attr("kind")
            fn = fn.value if isinstance(fn, ir.HValue) else fn
        rule = UNARY.get(fn)
        out = self.new(dims, x.dtype, f"{label} {fn}" if fn != name else label, (x,))
        if rule is None:  # max and anything new: assume it keeps its input
            self.scope.save(x)
            return out
        keep_in, same, bools, keep_out = rule
        if keep_in:
            self.scope.save(x)
        for i in range(same):
            self.scope.save(self.new(dims, x.dtype, f"{label} {fn} residual", (x,), kind="internal"))
        for i in range(bools):
            self.scope.save(self.new(dims, "bool", f"{label} {fn} mask", (x,), kind="internal"))
        if keep_out:
            self.scope.save(out)
        return out

    def attention(self, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
        q, k, v = args[:3]
        heads = q.dims[-2]
        scores = (q.dims[0], heads, q.dims[1], ir.Dim("S_kv", self.seq_for(k)))
        out = self.new(dims, q.dtype, label, (q, k, v))
        for t in (q, k, v):
            self.scope.save(t)
        kernel = e.kernel.kernel if e.kernel is not None else "xla"
        if kernel in FLASH_KERNELS:
            self.scope.save(out)
            lse = self.new((q.dims[0], heads, q.dims[1]), "f32", f"{label} logsumexp", (q, k),
                           kind="internal")
            self.scope.save(lse)
            return out
        causal = e.attr("causal")
        causal = causal.value if isinstance(causal, ir.HValue) else causal
        window = e.attr("window")
        window = window.value if isinstance(window, ir.HValue) else window
        internals = [("f32", "masked logits"), ("f32", "exp")]
        if causal or window or len(args) > 3:
            internals.append(("bool", "mask"))
        if q.dtype != "f32":
            internals.append((q.dtype, "probabilities"))
        for dtype, what in internals:
            self.scope.save(self.new(scores, dtype, f"{label} {what}", (q, k), kind="internal"))
        return out

    def moe(self, e: ir.Prim, args: list[Val], dims, label: str) -> Val:
        """Mixture of SwiGLU experts (the generated `moe_swiglu`): router softmax, then either
        one-hot dispatch to [B, experts, capacity] slots (capacity_factor > 0) or tokens sorted
        by expert and grouped matmuls (dropless); each expert runs a SwiGLU on its tokens.
        Expert matmuls are batched over experts, so save_dots keeps none of them."""
        x, logits, w_gate = args[0], args[1], args[2]
        top_k = int(_value(e.attr("top_k"), 1))
        cf = float(_value(e.attr("capacity_factor"), 0.0))
        experts, hidden, model_dim = w_gate.dims[0], w_gate.dims[-1], x.dims[-1]
        b, s = x.dims[0], x.dims[1]
        out = self.new(dims, x.dtype, label, tuple(args))
        probs = self.new((b, s, experts), "f32", f"{label} router softmax", (logits,), kind="internal")
        self.scope.save(probs)
        k = ir.Dim("top_k", top_k)
        if cf > 0:
            cap = ir.Dim("capacity", max(1, math.ceil(top_k * self.seq * cf / experts.size)))
            slot = (b, experts, cap)
            for what, d in (("slots", (b, k, s, experts, cap)), ("dispatch", (b, s, experts, cap)),
                            ("combine", (b, s, experts, cap))):
                self.scope.save(self.new(d, x.dtype, f"{label} {what}", (logits,), kind="internal"))
        else:
            slot = (b, s, k)
        inner = [("expert inputs", model_dim), ("gate", hidden), ("silu residual", hidden),
                 ("silu residual", hidden), ("up", hidden), ("hidden", hidden), ("expert outputs", model_dim)]
        for what, d in inner:
            self.scope.save(self.new(slot + (d,), x.dtype, f"{label} {what}", (x, logits), kind="internal"))
        return out

    def seq_for(self, k: Val) -> int:
        return self.seq  # keys: the full sequence (never split over `seq` in this model)

    def quantized(self, e: ir.Prim, inst: ir.Instance, env: dict, bind: dict) -> Val:
        """fp8/int8 matmul (a custom VJP): keeps both operands in one byte each."""
        inner = e.args[0]
        operands = (inner.left, inner.right) if isinstance(inner, ir.Bin) else inner.args
        vals = [self.ev(o, inst, env, bind) for o in operands]
        out = self.new(self.dims(e, bind), _promote(*vals), f"{inst.path}: {e.attr('format')} matmul",
                       vals, dot=True)
        for v in vals:
            b = v.base
            if b.kind == "lit":
                continue
            q = self.new(b.dims, "i8", f"{inst.path}: {b.label} in {e.attr('format')}", (b,),
                         kind="internal", weight=b.kind == "param")
            self.scope.save(q)
        return out


def _value(v, default):
    if v is None:
        return default
    return v.value if isinstance(v, ir.HValue) else v


def _bind(decl: tuple[ir.Arg, ...], actual: list[Val]) -> dict[str, tuple[ir.Dim, ...]]:
    """Free dims and `...` of a forward's arguments, bound to the caller's actual dims."""
    out: dict[str, tuple[ir.Dim, ...]] = {}
    for a, v in zip(decl, actual):
        dims = a.dims
        if any(d.is_ellipsis for d in dims):
            i = next(j for j, d in enumerate(dims) if d.is_ellipsis)
            tail = len(dims) - i - 1
            out["..."] = tuple(v.dims[i:len(v.dims) - tail])
            pairs = list(zip(dims[:i], v.dims[:i])) + list(zip(dims[i + 1:], v.dims[len(v.dims) - tail:]))
        else:
            pairs = list(zip(dims, v.dims))
        for d, got in pairs:
            if d.size is None and not d.is_ellipsis and d.name not in FREE_DIM_AXES:
                out[d.name] = (got,)
    return out


def _promote(*vals: Val) -> str:
    """jnp type promotion for the dtypes here: scalars (literals) are weak."""
    tensors = [v.dtype for v in vals if v.kind != "lit" and v.dims]
    if not tensors:
        return vals[0].dtype if vals else "f32"
    floats = [d for d in tensors if d in _FLOAT_RANK]
    if not floats:
        return tensors[0]
    best = max(floats, key=lambda d: _FLOAT_RANK[d])
    if {"bf16", "f16"} <= set(floats) and _FLOAT_RANK[best] == 2:
        return "f32"
    return best
