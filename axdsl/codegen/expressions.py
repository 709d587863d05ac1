"""Emit Python/JAX code for forward bodies: one statement per spec statement, shapes in comments.

Child calls are hoisted into their own statements under `jax.named_scope(child)`, so a profile
shows the spec's layer paths; a repeated child becomes a `jax.lax.scan` over stacked parameters.
"""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass, field

from axdsl import primitives
from axdsl.codegen.names import (
    EinsumLetters,
    dim_label,
    distinct_labels,
    py_comment,
    py_str,
    spec_text,
)
from axdsl.codegen.pyexpr import py, py_size, py_value
from axdsl.codegen.why import (
    kernel_why,
    pipeline_why,
    quant_why,
    remat_kind,
    remat_why,
    sharding_why,
    unroll_why,
)
from axdsl.errors import filled
from axdsl.ir import nodes as ir
from axdsl.ir.expr import ATOM, PRECEDENCE, UNARY_PRECEDENCE, BinOp, Expr, UnaryOp, precedence
from axdsl.ir.nodes import DType, RefKind, TensorType
from axdsl.primitives.einsum import dense_call, dense_matmuls, is_weight

# Operator precedence for minimal parentheses (higher binds tighter): the IR's table, shared with
# the printer of Config expressions, so `x * (cfg.dim // cfg.heads)` keeps its parentheses.
_ATOM = ATOM
_NEG = UNARY_PRECEDENCE[UnaryOp.NEG]


def dims_text(dims) -> str:
    """`[B, S, ffn]`: dims named as Config names them (see `dim_label`)."""
    return "[" + ", ".join(dim_label(d.name, d.expr) for d in dims) + "]"


def shape_comment(t) -> str:
    return dims_text(t.dims) if isinstance(t, TensorType) else ""


def rng_arg(index: str) -> str:
    """The `rng=` argument of a child call: a key folded for the `index`-th random site or layer."""
    return f", rng=_fold(rng, {index})"


@dataclass
class LayerFunction:
    """One generated layer function: its name, arguments, body lines, docstring and what it
    needs."""

    name: str
    layer: str
    args: str
    rng: bool
    body: list[str]
    doc: str
    paths: list[str]
    aux: bool = False  # returns (y, auxiliary loss)
    imports: set[str] = field(default_factory=set)  # what its body needs
    helpers: set[str] = field(default_factory=set)  # helpers its body calls
    chunks: list[list[str]] = field(default_factory=list)  # body: preamble, then per statement
    result: str = ""  # the code it returns
    decodes: bool = False  # also the decode path's layer: takes `cache`, `pos` (codegen/decode.py)


@dataclass
class FunctionEmitter:
    """Emits the body of one layer function. `child_fn` maps a child name to its function name."""

    inst: ir.Instance
    child_fn: dict[str, str]
    needs_rng: dict[str, bool]
    own_rng: bool
    schedule: ir.Schedule | None = None
    letters: EinsumLetters = field(default_factory=EinsumLetters)  # shared by the whole model
    child_aux: dict[str, bool] = field(default_factory=dict)  # children that return (y, aux loss)
    own_aux: bool = False  # this function returns (y, aux loss)
    master: bool = False  # receives master weights and casts them (ir.master_weight_paths)
    aux_terms: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    temps: set[str] = field(default_factory=set)
    rng_uses: int = 0
    imports: set[str] = field(default_factory=set)  # import lines the emitted body needs
    helpers: set[str] = field(default_factory=set)  # helper functions (primitives.HELPERS) it calls
    quant_noted: bool = False  # the quantize_matmuls comment is written once per function
    decoding = False  # the KV-cache decode path's emitter (axdsl/codegen/decode.py) says True
    decode_pos = "pos"  # the decode path's first position of the new tokens
    takes_pos: bool = False  # a layer the decode path shares: its positions start at `pos`
    staged: bool = False  # its context-parallel attention runs inside the pipeline's stages
    # a model's root under context(balance = true): it runs its [B, S] inputs in zig-zag order
    # and puts its [B, S, ...] result back in order (plan_context)
    reorders: bool = False
    starts: list[int] = field(default_factory=list)  # where each statement's lines begin
    result: str = ""  # the code the body returns

    def is_sequence(self, dim: ir.Dim) -> bool:
        """Whether `dim` is the sequence dim of a decoded tensor (only the decode emitter asks)."""
        return False

    def emit_body(self) -> list[str]:
        fwd = self.inst.fwd
        if self.casts_params():
            self._cast_params()
        self.imports.update(("import jax", "import jax.numpy as jnp"))
        for n, stmt in enumerate(fwd.body):
            self.starts.append(len(self.lines))
            if n == 0 and self.reorders and self.balanced:
                self._reorder_inputs()
            if isinstance(stmt, ir.Let):
                self._let(stmt)
            else:
                aux = ""
                if isinstance(stmt.value, ir.CallChild):
                    self._child_call(stmt.value, "out")
                    code, prec, comment = "out", _ATOM, ""
                else:
                    code, prec = self.expr(stmt.value)
                    comment = f"  # {shape_comment(stmt.value.type)}"
                if self.reorders and self.balanced:  # back in order (plan_context)
                    code = f"{self._paren(code, prec, _ATOM)}[:, np.argsort(order)]"
                if self.own_aux:
                    aux = ", " + (" + ".join(self.aux_terms) or "jnp.zeros((), jnp.float32)")
                    comment = f"  # {shape_comment(stmt.value.type)}, {self._aux_shape}"
                self.result = code + aux
                self.lines.append(f"return {code}{aux}{comment}")
        return self.lines

    @property
    def _aux_shape(self) -> str:
        """What a comment says an auxiliary loss is: [], or inside the pipeline's stages (a staged
        layer) the statistics the pipeline averages (plan_pipeline)."""
        return "statistics" if self.staged else "[]"

    @property
    def balanced(self) -> bool:
        """Whether this forward runs the sequence in context parallelism's zig-zag order (the
        decode path never does: it attends over a cache in order)."""
        context = self.schedule.context.value if self.schedule is not None else None
        return context is not None and bool(context.balance) and not self.decoding

    def _reorder_inputs(self) -> None:
        """The root's [B, S, ...] inputs in the order its layers run them (plan_context)."""
        args = [a.name for a in self.inst.fwd.args if len(a.dims) >= 2]
        self.use_helper(primitives.CONTEXT_ORDER_HELPER.name)
        self.imports.add("import numpy as np")
        self.lines.append(
            "# plan_context: the layers run the sequence in zig-zag order (context(balance)):"
        )
        self.lines.append("# every shard of the `seq` mesh axis gets the same causal work")
        self.lines.append(f"order = context_order({args[0]}.shape[1])  # [S], numpy")
        for name in args:
            self.lines.append(f"{name} = {name}[:, order]")

    def chunks(self) -> list[list[str]]:
        """The body's lines cut at each statement, after a preamble (the weights' cast)."""
        cuts = [0, *self.starts, len(self.lines)]
        return [self.lines[a:b] for a, b in itertools.pairwise(cuts)]

    def casts_params(self) -> bool:
        """Whether this layer of a mixed-precision model receives the master weights
        (cfg.param_dtype) and casts them to the compute dtype (cfg.dtype) as the forward reads them.
        """
        return self.master

    def _cast_params(self) -> None:
        """The cast of the weights outside stacked layers. A stacked child is cast one layer at a
        time in its scan step (`cast_layer`): casting the whole stack up front would keep a
        compute-dtype copy of every layer, and of every layer's gradient, for the step. A child
        that holds a stack (a repeated pattern's groups and tail) gets the master weights too."""
        stacked = [
            py_str(c.name) for c in self.inst.children if c.repeat is not None or c.holds_stack()
        ]
        self.lines.append("# master weights stay in cfg.param_dtype; compute runs in cfg.dtype")
        if not stacked:
            self.lines.append("params = jax.tree.map(lambda w: w.astype(cfg.dtype), params)")
            return
        keys = "(" + ", ".join(stacked) + ("," if len(stacked) == 1 else "") + ")"
        self.lines.append(
            "# (stacked layers: one layer at a time in the scan step, never the whole stack)"
        )
        self.lines.append(
            "params = {k: v if k in "
            + keys
            + " else jax.tree.map(lambda w: w.astype(cfg.dtype), v)"
            " for k, v in params.items()}"
        )

    def cast_layer(self) -> None:
        """In a stacked child's scan step of a mixed-precision root: this layer's weights to
        cfg.dtype."""
        if self.casts_params():
            self.lines.append("    # this layer's weights in cfg.dtype")
            self.lines.append(
                "    layer_params = jax.tree.map(lambda w: w.astype(cfg.dtype), layer_params)"
            )

    def _let(self, stmt: ir.Let) -> None:
        if isinstance(stmt.value, ir.CallChild) and stmt.point is None:
            self._child_call(stmt.value, stmt.name)
            return
        first = len(self.lines)  # a named point's scope also holds the statements its value hoists
        code, _ = self.expr(stmt.value)
        if stmt.point is None:
            self.lines.append(f"{stmt.name} = {code}  # {shape_comment(stmt.value.type)}")
            return
        # `jax.named_scope(point)`: the point's ops carry its name in profiles, as a layer's do
        self.imports.add("from jax.ad_checkpoint import checkpoint_name")
        name = py_str(stmt.point)
        body = [
            *self.lines[first:],
            f"{stmt.name} = checkpoint_name({code}, {name})  # {shape_comment(stmt.value.type)}",
        ]
        self.lines[first:] = [
            f"with jax.named_scope({name}):",
            *(textwrap.indent(line, "    ") for line in body),
        ]

    # ---------------------------------------------------------------- child calls
    def _child_call(self, call: ir.CallChild, target: str) -> None:
        args = [self.expr(a)[0] for a in call.args]
        child = self.inst.expect_child(call.child)
        fn = self.child_fn[call.child]
        rng = ""
        if self.needs_rng.get(call.child):
            self.rng_uses += 1
            rng = rng_arg(str(self.rng_uses))
        layer_rng = rng_arg("i") if rng else ""  # a scanned child folds in its layer index
        comment = shape_comment(call.type)
        if call.over is not None:
            self._scan_over_time(call, call.over, fn, args, target, comment, rng)
            return
        aux = self.child_aux.get(call.child, False)
        if child.repeat is not None:
            args = [args[0]] + [self._side_input(call.child, a) for a in args[1:]]
        if child.repeat is not None and aux and self._pipelined(child):
            self._pipeline_with_aux(call, child, fn, args, target, comment)
            return
        if child.repeat is not None and aux:
            self._scan_with_aux(call, child, fn, args, target, layer_rng, comment)
            return
        if aux:
            aux_name = self._fresh(f"{_stem(call.child)}_aux")
            self.aux_terms.append(aux_name)
            self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
            self.lines.append(
                f"    {target}, {aux_name} = {fn}(cfg, params[{py_str(call.child)}], "
                f"{', '.join(args)}{rng})  # {comment}, {self._aux_shape}"
            )
            return
        if child.repeat is not None:
            step = f"{_stem(call.child)}_step"
            self._step_header(child)
            if rng:
                self._step_def(step, "h, xs", child)
                self.lines.append("    layer_params, i = xs")
                self.cast_layer()
                self._shard_carry(child)
                self.lines.append(
                    f"    return {fn}(cfg, layer_params, {_carried(args)}{layer_rng}), None"
                )
                xs = f"(params[{py_str(call.child)}], jnp.arange({py_value(child.repeat)}))"
            else:
                # a pipeline cuts the side inputs into micro-batches too: the step takes them
                sides = args[1:] if self._pipelined(child) else []
                self._step_def(step, ", ".join(["h", "layer_params", *sides]), child)
                self.cast_layer()
                self._shard_carry(child)
                self.lines.append(f"    return {fn}(cfg, layer_params, {_carried(args)}), None")
                xs = f"params[{py_str(call.child)}]"
            self.lines.append("")
            if self._pipelined(child):
                self._pipeline_call(child, step, args, target, comment)
                return
            unroll = self._unroll(child)
            self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
            self.lines.append(
                f"    {target}, _ = jax.lax.scan({step}, {args[0]}, {xs}{unroll})  # {comment}"
            )
            return
        self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
        self.lines.append(
            f"    {target} = {fn}(cfg, params[{py_str(call.child)}], "
            f"{', '.join(args)}{rng})  # {comment}"
        )

    def _scan_over_time(
        self,
        call: ir.CallChild,
        over: ir.Dim,
        fn: str,
        args: list[str],
        target: str,
        comment: str,
        rng: str = "",
    ) -> None:
        """`scan(cell, x, over = S)`: jax.lax.scan over S (moved to the front and back), carrying
        the cell's first argument and stacking the carry of every step. Inputs without S are side
        inputs, closed over by the step; a cell with dropout folds its key with the step index.
        `over` is the call's `over` dim, which the caller checked is set."""
        n_init = 1 if call.scan_init else 0
        xs, xs_types = args[n_init:], [ir.tensor_type(a).dims for a in call.args[n_init:]]
        axes = [_axis_or_none(dims, over) for dims in xs_types]
        out_dims = ir.tensor_type(call).dims
        if call.scan_init:
            init = args[0]
        else:
            carry = [d for i, d in enumerate(out_dims) if i != _axis(out_dims, over)]
            shape = ", ".join(self.dim_code(d) if d.is_free else py_size(d) for d in carry)
            init = f"jnp.zeros(({shape}{',' if len(carry) == 1 else ''}), {xs[0]}.dtype)"
        step = self._fresh(f"{_stem(call.child)}_step")
        moved = [
            f"jnp.moveaxis({x}, {axis}, 0)" if axis else x
            for x, axis in zip(xs, axes, strict=True)
            if axis is not None
        ]
        if rng:  # the step index, for a key of its own per step
            moved.append(f"jnp.arange({moved[0]}.shape[0])")
        simple = len(moved) == len(xs) and not rng  # every input sliced, no key: today's form
        per_step = "x_t" if len(moved) == 1 else "xs_t"
        if simple:
            inputs = "x_t" if len(xs) == 1 else "*xs_t"
        else:
            sliced = iter(range(len(moved)))
            picks = [
                x if axis is None else ("x_t" if len(moved) == 1 else f"xs_t[{next(sliced)}]")
                for x, axis in zip(xs, axes, strict=True)
            ]
            inputs = ", ".join(picks)
        scanned = moved[0] if len(moved) == 1 else "(" + ", ".join(moved) + ")"
        out_axis = _axis(out_dims, over)
        step_rng = f", rng=_fold({rng.removeprefix(', rng=')}, xs_t[-1])" if rng else ""
        self.lines.append(
            f"def {step}(h, {per_step}):  " f"# one step along {dim_label(over.name, over.expr)}"
        )
        self.lines.append(f"    h = {fn}(cfg, params[{py_str(call.child)}], h, {inputs}{step_rng})")
        self.lines.append("    return h, h")
        self.lines.append("")
        self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
        if out_axis:
            self.lines.append(f"    _, {target} = jax.lax.scan({step}, {init}, {scanned})")
            self.lines.append(f"    {target} = jnp.moveaxis({target}, 0, {out_axis})  # {comment}")
        else:
            self.lines.append(
                f"    _, {target} = jax.lax.scan({step}, {init}, {scanned})  # {comment}"
            )

    def _pipelined(self, child: ir.Instance) -> bool:
        """Whether this call of a repeated child runs as plan_pipeline's pipeline (the decode
        path runs the layers unpipelined)."""
        policy = self.schedule.pipeline.value if self.schedule is not None else None
        return policy is not None and policy.child == child.path and not self.decoding

    def _pipeline_with_aux(
        self,
        call: ir.CallChild,
        child: ir.Instance,
        fn: str,
        args: list[str],
        target: str,
        comment: str,
    ) -> None:
        """A pipelined repeat whose layers add an auxiliary loss: its step returns (h, this
        micro-batch's statistics of the loss), and `pipeline(..., aux=True)` returns (x, the
        loss) from their means over the micro-batches (the layers are marked staged)."""
        step = f"{_stem(call.child)}_step"
        self._step_header(child)
        self._step_def(step, ", ".join(["h", "layer_params", *args[1:]]), child)
        self.cast_layer()
        self._shard_carry(child)
        self.lines.append(
            f"    return {fn}(cfg, layer_params, {_carried(args)})  # (h, its statistics)"
        )
        self.lines.append("")
        aux_name = self._fresh(f"{_stem(call.child)}_aux")
        self.aux_terms.append(aux_name)
        self._pipeline_call(child, step, args, f"{target}, {aux_name}", f"{comment}, []", True)

    def _pipeline_call(
        self,
        child: ir.Instance,
        step: str,
        args: list[str],
        target: str,
        comment: str,
        aux: bool = False,
    ) -> None:
        """`pipeline(step, x, params[child], ...)` instead of the scan: the same step on each
        stage's layers, a vmap over the stages, one scan over the iterations (kernels/pipeline.py);
        the call's other inputs (each [B, ...]) go in as `sides`, cut into the same micro-batches;
        `aux=True` when the step returns its auxiliary loss's statistics too.
        """
        x, sides = args[0], args[1:]
        schedule = filled(self.schedule, "the schedule of a pipeline", "plan_pipeline")
        policy: ir.PipelinePolicy = schedule.pipeline.value
        placed = filled(child.carry_sharding, f"the carry of {child.path}", "shard_activations")
        self.use_helper(primitives.PIPELINE_HELPER.name)
        self.imports.add("from jax.sharding import PartitionSpec as P")
        self.lines.extend(f"# {py_comment(line)}" for line in pipeline_why(schedule, child))
        unroll = self._unroll(child)
        name = py_str(child.name)
        self.lines.append(f"with jax.named_scope({name}):")
        self.lines.append(
            f"    {target} = pipeline({step}, {x}, params[{name}], stages={policy.stages}, "
            f"microbatches={policy.microbatches}, repeats={policy.repeats}, "
            f"carry_spec={spec_text(placed.mesh)}, specs=param_specs()[{name}]{unroll}"
            + (f", sides=({', '.join(sides)},)" if sides else "")
            + (", aux=True" if aux else "")
            + f")  # {comment}"
        )

    def _step_header(self, child: ir.Instance) -> None:
        """What comes before a scan step's `def`: what a pattern's step runs, the remat
        decorator."""
        if child.pattern:
            self.lines.append(
                f"# one step runs the {len(child.children)} layers of the pattern in turn, "
                f"{py_value(child.repeat)} steps"
            )
        self._remat_decorator(child)

    def _step_def(self, step: str, args: str, child: ir.Instance) -> None:
        """`def blocks_step(h, layer_params):`, saying what one step of a plain repeat runs."""
        note = "" if child.pattern else f"  # one of {py_value(child.repeat)} stacked layers"
        self.lines.append(f"def {step}({args}):{note}")

    def _side_input(self, child: str, code: str) -> str:
        """A repeated child's extra argument, the same for every layer: the scan's step closes over
        it. An expression is computed once, before the scan, into a local of its own."""
        if code.isidentifier() and code not in _STEP_LOCALS:
            return code
        name = self._fresh(f"{_stem(child)}_in")
        self.lines.append(f"{name} = {code}")
        return name

    def _scan_with_aux(
        self,
        call: ir.CallChild,
        child: ir.Instance,
        fn: str,
        args: list[str],
        target: str,
        layer_rng: str,
        comment: str,
    ) -> None:
        """A repeated child that returns an auxiliary loss: the scan carries (h, summed aux)."""
        x = args[0]
        step = f"{_stem(call.child)}_step"
        self._step_header(child)
        rng = layer_rng
        per_layer = "xs" if rng else "layer_params"
        self._step_def(step, f"carry, {per_layer}", child)
        self.lines.append("    h, aux = carry")
        if rng:
            self.lines.append("    layer_params, i = xs")
        self.cast_layer()
        self._shard_carry(child)
        self.lines.append(
            f"    h, layer_aux = {fn}(cfg, layer_params, {_carried(args)}{layer_rng})"
        )
        self.lines.append("    return (h, aux + layer_aux), None")
        xs = (
            f"(params[{py_str(call.child)}], jnp.arange({py_value(child.repeat)}))"
            if rng
            else f"params[{py_str(call.child)}]"
        )
        aux_name = self._fresh(f"{_stem(call.child)}_aux")
        self.aux_terms.append(aux_name)
        self.lines.append("")
        unroll = self._unroll(child)
        self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
        self.lines.append(
            f"    ({target}, {aux_name}), _ = jax.lax.scan({step}, "
            f"({x}, jnp.zeros((), jnp.float32)), {xs}{unroll})  # {comment}, []"
        )

    def _fresh(self, name: str) -> str:
        base, n = name, 1
        while name in self.temps:
            n += 1
            name = f"{base}{n}"
        self.temps.add(name)
        return name

    def _unroll(self, child: ir.Instance) -> str:
        """`, unroll=True` for a repeat the target unrolls (after a comment saying so), else ""."""
        if child.unrolled:
            schedule = filled(self.schedule, "the schedule of an unrolled repeat", "unroll_repeats")
            self.lines.append(f"# {py_comment(unroll_why(schedule, child))}")
        return ", unroll=True" if child.unrolled else ""

    def _remat_decorator(self, child: ir.Instance) -> None:
        """`@jax.checkpoint` on a scanned step when insert_remat chose a policy, with why."""
        if remat_kind(child) is None:
            return
        self.imports.add("import functools")
        self.lines.append(f"# {py_comment(remat_why(self.schedule, child))}")
        self.lines.append(
            "@functools.partial(jax.checkpoint, policy=REMAT_POLICY, prevent_cse=False)"
        )

    def _shard_carry(self, child: ir.Instance) -> None:
        """`h = shard(h, P(...))`: pin a scanned layer's carry where shard_activations placed it,
        with the rule that decided it."""
        placed = child.carry_sharding
        if self.schedule is None or placed is None:
            return
        why = sharding_why(self.schedule, placed.logical, placed.mesh)
        self.lines.append(f"    # {py_comment(why)}")
        self.lines.append(f"    h = shard(h, {spec_text(placed.mesh)})")

    def _hoist(self, call: ir.CallChild) -> str:
        name = self._fresh(f"{_stem(call.child)}_out")
        self._child_call(call, name)
        return name

    # ---------------------------------------------------------------- expressions
    def expr(self, e: ir.TExpr) -> tuple[str, int]:
        return getattr(self, "_" + type(e).__name__)(e)

    def _Ref(self, e: ir.Ref):
        if e.kind in (RefKind.LOCAL, RefKind.ARG):
            return e.name, _ATOM
        if e.kind is RefKind.PARAM:
            return f"params[{py_str(e.name)}]", _ATOM
        if e.kind is RefKind.CHILD_PARAM:
            return f"params[{py_str(e.owner)}][{py_str(e.name)}]", _ATOM
        if e.kind is RefKind.DIM:
            return self.dim_code(ir.Dim(e.name)), _ATOM
        if e.value is None or e.value.expr is None:
            raise AssertionError(f"hyperparameter `{e.name}` without its expression")
        return py(e.value.expr), precedence(e.value.expr)

    def _Lit(self, e: ir.Lit):
        if isinstance(e.value, DType):
            return f"jnp.{e.value.jnp}", _ATOM
        return repr(e.value), _ATOM

    def _Neg(self, e: ir.Neg):
        code, prec = self.expr(e.operand)
        return f"-{self._paren(code, prec, _NEG)}", _NEG

    def _Bin(self, e: ir.Bin):
        if e.op is BinOp.MATMUL:
            return self._matmul(e)
        p = PRECEDENCE[e.op]
        left, lp = self.expr(e.left)
        right, rp = self.expr(e.right)
        chained = (
            e.op in ir.COMPARE_OPS
        )  # Python chains `a < b < c`: a comparison operand is parenthesized
        return f"{self._paren(left, lp, p + chained)} {e.op} {self._paren(right, rp, p + 1)}", p

    def _matmul(self, e: ir.Bin):
        left, lp = self.expr(e.left)
        right, rp = self.expr(e.right)
        lt, rt = ir.tensor_type(e.left).dims, ir.tensor_type(e.right).dims
        if dense_matmuls(self.schedule) and is_weight(e.right) and not is_weight(e.left):
            return dense_call(self, left, right, 1), _ATOM  # the einsum `dense` kernel
        if len(rt) == 2 and len(lt) >= 2:
            p = PRECEDENCE[BinOp.MATMUL]
            return f"{self._paren(left, lp, p)} @ {self._paren(right, rp, p + 1)}", p
        return f"jnp.einsum({py_str(self._matmul_spec(lt, rt))}, {left}, {right})", _ATOM

    def _CallChild(self, e: ir.CallChild):
        return self._hoist(e), _ATOM

    def _Prim(self, e: ir.Prim):
        """A primitive's code comes from its registry entry (axdsl/primitives/)."""
        prim = primitives.get(e.name)
        emitted = [self.expr(a) for a in e.args] if prim.emits_operands else []  # once: may hoist
        code = prim.emit(self, e, [c for c, _ in emitted], [p for _, p in emitted])
        return code, _ATOM

    # ---------------------------------------------------------------- for primitive emitters
    ATOM = _ATOM
    py_str = staticmethod(py_str)
    shape_comment = staticmethod(shape_comment)

    def fresh(self, name: str) -> str:
        """A local name not yet used in this function."""
        return self._fresh(name)

    def line(self, text: str) -> None:
        """Emit a statement (or comment) before the one being built."""
        self.lines.append(text)

    def use_helper(self, name: str) -> None:
        """The generated model needs helper `name` (one of its primitive's `helpers`)."""
        self.helpers.add(name)

    def next_rng(self) -> str:
        """A distinct dropout key for the next random site of this function."""
        self.rng_uses += 1
        return f"_fold(rng, {self.rng_uses})"

    def add_aux(self, name: str) -> None:
        """Add a local to this function's auxiliary loss (returned as `(y, aux)`)."""
        self.aux_terms.append(name)

    def kernel_comment(self, e: ir.Prim) -> None:
        """`# select_kernels: ...`: which kernel the pass chose for `e`, and why."""
        self.lines.append(f"# {py_comment(kernel_why(self.schedule, e))}")

    def quant_comment(self, fmt: str) -> None:
        """`# quantize_matmuls: ...`, once per function."""
        if not self.quant_noted:
            self.lines.append(f"# {py_comment(quant_why(self.schedule, fmt))}")
            self.quant_noted = True

    def einsum_spec(self, e: ir.Prim) -> str:
        return self._einsum_spec(e)

    def matmul_spec(self, lt, rt) -> str:
        return self._matmul_spec(lt, rt)

    def paren(self, code: str, prec: int, need: int) -> str:
        return self._paren(code, prec, need)

    def code(self, x: ir.HValue | ir.Dim | Expr, need: int | None = None) -> str:
        """Python for a Config value, a sized dim's size or an expression (`cfg.dim // cfg.heads`),
        parenthesized when it binds less tightly than an operand at precedence `need` must."""
        e = x.size_expr if isinstance(x, ir.Dim) else x.expr if isinstance(x, ir.HValue) else x
        if e is None:
            raise ValueError(f"{x!r} is not a Config value")
        return py(e) if need is None else self._paren(py(e), precedence(e), need)

    # ---------------------------------------------------------------- einsum letters
    def _matmul_spec(self, lt, rt) -> str:
        """`left @ right` as an einsum: left's last dim contracts with right's first; `...` kept."""
        keys = distinct_labels(
            [_key(d) for d in lt if not d.is_ellipsis] + [_key(d) for d in rt[1:]]
        )
        n_left = len([d for d in lt if not d.is_ellipsis])
        left = "..." * any(d.is_ellipsis for d in lt) + "".join(
            self.letters[k] for k in keys[:n_left]
        )
        right = left[-1] + "".join(self.letters[k] for k in keys[n_left:])
        return f"{left},{right}->{left[:-1] + right[1:]}"

    def _einsum_spec(self, e: ir.Prim) -> str:
        """An einsum primitive's spec in the model's letters: its names mapped to dim labels."""
        spec: ir.EinsumSpec = e.attr("spec")
        operands, out = spec.operands, spec.out
        label: dict[str, str] = {}
        typed = [ir.tensor_type(a) for a in e.args]
        for names, t in [*zip(operands, typed, strict=True), (out, ir.tensor_type(e))]:
            for n, d in zip(names, t.dims, strict=True):
                label.setdefault(n, _key(d))
        keys = dict(zip(label, distinct_labels(list(label.values())), strict=True))
        term = lambda names: "".join(self.letters[keys[n]] for n in names)  # noqa: E731
        return ",".join(term(op) for op in operands) + "->" + term(out)

    # ---------------------------------------------------------------- helpers
    def dim_code(self, dim: ir.Dim) -> str:
        """Runtime size of a free dim: read from the first argument that carries it."""
        for a in self.inst.fwd.args:
            for i, d in enumerate(a.dims):
                if d.is_free and d.name == dim.name:
                    index = i - len(a.dims) if a.dims and a.dims[0].is_ellipsis else i
                    return f"{a.name}.shape[{index}]"
        return py_size(dim)

    @staticmethod
    def _paren(code: str, prec: int, need: int) -> str:
        return code if prec >= need else f"({code})"


def _axis(dims: tuple[ir.Dim, ...], over: ir.Dim) -> int:
    """The position of `over` in `dims` (infer_shapes checked there is exactly one), counted from
    the end when the dims start with `...`."""
    i = next(i for i, d in enumerate(dims) if not d.is_ellipsis and d.same(over))
    return i - len(dims) if dims and dims[0].is_ellipsis else i


def _axis_or_none(dims: tuple[ir.Dim, ...], over: ir.Dim) -> int | None:
    """`_axis`, or None for a scan's side input, which has no `over` dim."""
    return _axis(dims, over) if any(not d.is_ellipsis and d.same(over) for d in dims) else None


def _stem(child: str) -> str:
    """The start of a local named after a child: a pattern's element `1` gives `layer1_aux`."""
    return child if child.isidentifier() else f"layer{child}"


# Names a scan step binds itself: a side input of one of these names is copied to a fresh local.
_STEP_LOCALS = frozenset({"h", "xs", "i", "carry", "aux", "layer_aux", "layer_params"})


def _carried(args: list[str]) -> str:
    """A scan step's call arguments: the carry `h`, then the side inputs it closes over."""
    return ", ".join(["h", *args[1:]])


def _key(d: ir.Dim) -> str:
    return dim_label(d.name, d.expr)
