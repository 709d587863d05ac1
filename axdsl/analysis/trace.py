"""Trace a model's forward over the IR, recording every value and what the backward keeps.

The tracer walks each forward's statements; each primitive asks its own memory rule (its registry
entry in axdsl/primitives/) what it saves, each binary operator its rule in `residuals`. A repeated
(scanned) child is traced once, in a scope of its own, so that the remat policy can be applied per
layer (`activations`).
"""

from __future__ import annotations

from collections.abc import Sequence

from axdsl import primitives
from axdsl.analysis import residuals
from axdsl.analysis.layout import DTYPE_BYTES, Layout
from axdsl.analysis.platforms import CPU
from axdsl.analysis.values import Scope, Val, ValKind, attr_value, promote
from axdsl.primitives.base import elementwise_memory
from axdsl.ir import nodes as ir
from axdsl.ir.axes import FREE_DIM_AXES


def compute_dtype(root: ir.Instance) -> str | None:
    """The dtype every parameter is cast to at the model entry, when the model says so."""
    d, pd = root.hparam("dtype"), root.hparam("param_dtype")
    if d is None or pd is None:
        return None
    return d.value.value.name


class Tracer:
    """Evaluates forwards symbolically: values with dims and dtypes, residuals per scope."""

    def __init__(self, root: ir.Instance, layout: Layout, batch: int, seq: int) -> None:
        self.root, self.layout, self.batch, self.seq = root, layout, batch, seq
        self.platform = CPU  # what XLA keeps at once on the target (analysis/platforms.py)
        # context parallelism on the target (plan_context): attention's memory rule reads it
        self.context: ir.ContextPolicy | None = None
        self.compute = compute_dtype(root)
        self.outer = Scope()
        self.scope = self.outer
        self.blocks: list[tuple[ir.Instance, Scope, Val]] = (
            []
        )  # (scanned child, its layer, its input)

    def nbytes(self, v: Val) -> float:
        """Bytes of `v` on one chip."""
        n = self.layout.elements(v.dims, self.batch, self.seq, v.weight) * DTYPE_BYTES[v.dtype]
        return n * self.lane_padding(v)

    def lane_padding(self, v: Val) -> float:
        """How much larger `v` is in the platform's layout: a minor dimension of fixed size
        padded to a multiple of its lanes (TPU: 128), 1.0 elsewhere."""
        lanes = self.platform.lanes
        last = v.dims[-1] if v.dims else None
        if not lanes or last is None or last.size is None or last.size % lanes == 0:
            return 1.0
        return -(-last.size // lanes) * lanes / last.size

    def new(self, dims, dtype, label, inputs=(), kind=ValKind.OP, **kw) -> Val:
        """A value computed in the current scope."""
        v = Val(tuple(dims), dtype, kind, label, tuple(inputs), **kw)
        self.scope.values.append(v)
        return v

    def save(self, v: Val) -> None:
        """Keep `v` for the backward (in the current scope)."""
        self.scope.save(v)

    # What primitives' memory rules use besides `new` and `save`.
    def view(self, dims, x: Val, label: str) -> Val:
        """`x`'s buffer seen with other dims (a reshape or transpose)."""
        return self.new(dims, x.dtype, label, (x,), kind=ValKind.VIEW)

    def internal(self, dims, dtype: str, label: str, inputs=(), **kw) -> Val:
        """A temporary of the operation itself (a mask, a softmax, logits)."""
        return self.new(dims, dtype, label, inputs, kind=ValKind.INTERNAL, **kw)

    def param_like(self, dims, x: Val, label: str) -> Val:
        """A part of a parameter (a slice of a table), which is a parameter too."""
        return Val(tuple(dims), x.dtype, ValKind.PARAM, label)

    promote = staticmethod(promote)
    static = staticmethod(attr_value)

    # ------------------------------------------------------------- evaluation
    def call(self, inst: ir.Instance, args: list[Val]) -> Val:
        fwd = inst.fwd
        bind = bind_dims(fwd.args, args)
        env = {a.name: v for a, v in zip(fwd.args, args, strict=True)}
        for stmt in fwd.body:
            v = self.ev(stmt.value, inst, env, bind)
            if isinstance(stmt, ir.Ret):
                return v
            if stmt.point:
                v.point = stmt.point
                if v.kind is ValKind.VIEW:
                    v.base.point = stmt.point
            env[stmt.name] = v
        raise ValueError(f"{inst.path}: forward without return")

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
        return Val(p.dims, dtype, ValKind.PARAM, label)

    def ref(self, e: ir.Ref, inst: ir.Instance, env: dict) -> Val:
        if e.kind in (ir.RefKind.LOCAL, ir.RefKind.ARG):
            return env[e.name]
        if e.kind is ir.RefKind.PARAM:
            return self.param_val(inst.expect_param(e.name), f"{inst.path}/{e.name}")
        if e.kind is ir.RefKind.CHILD_PARAM:
            child = inst.expect_child(e.owner)
            return self.param_val(child.expect_param(e.name), f"{child.path}/{e.name}")
        return Val((), "f32", ValKind.LIT, e.name)

    def ev(self, e: ir.TExpr, inst: ir.Instance, env: dict, bind: dict) -> Val:
        if isinstance(e, ir.Ref):
            return self.ref(e, inst, env)
        if isinstance(e, ir.Lit):
            return Val((), "f32", ValKind.LIT, repr(e.value))
        if isinstance(e, ir.Neg):
            x = self.ev(e.operand, inst, env, bind)
            return self.new(x.dims, x.dtype, "neg", (x,))
        if isinstance(e, ir.Bin):
            a = self.ev(e.left, inst, env, bind)
            b = self.ev(e.right, inst, env, bind)
            return residuals.binary(self, e.op, a, b, self.dims(e, bind), inst.path)
        if isinstance(e, ir.CallChild):
            args = [self.ev(a, inst, env, bind) for a in e.args]
            child = inst.expect_child(e.child)
            if e.over is not None:
                return self.over_time(child, e, e.over, args, bind)
            if child.repeat is not None:
                return self.scanned(child, args[0], args[1:])
            return self.call(child, args)
        return self.prim(e, inst, env, bind)

    def scanned(self, child: ir.Instance, x: Val, side: Sequence[Val] = ()) -> Val:
        """A repeated child: trace one layer in its own scope; the scan output is a new value.
        Side inputs (the arguments after the carry) are the caller's values, closed over."""
        outer = self.scope
        layer = Scope()
        self.scope = layer
        x_in = Val(x.dims, x.dtype, ValKind.INPUT, f"{child.path} input")
        self.call(child, [x_in, *side])
        self.scope = outer
        self.blocks.append((child, layer, x_in))
        return self.new(x.dims, x.dtype, f"{child.path} output", (x,))

    def over_time(
        self, child: ir.Instance, e: ir.CallChild, over: ir.Dim, args: list[Val], bind: dict
    ) -> Val:
        """`scan(cell, x, over = S)`, approximately: one step is traced in a scope of its own (its
        values are per step, not counted), and the stacked carries are kept for the backward."""
        outer = self.scope
        self.scope = Scope()
        steps = [
            Val(
                tuple(d for d in a.dims if not d.same(over)),
                a.dtype,
                ValKind.INPUT,
                f"{child.path} step",
            )
            for a in args
        ]
        if not e.scan_init:
            carry = self.dims(e, bind)
            steps.insert(
                0,
                Val(
                    tuple(d for d in carry if not d.same(over)),
                    args[0].dtype,
                    ValKind.INPUT,
                    f"{child.path} carry",
                ),
            )
        self.call(child, steps)
        self.scope = outer
        out = self.new(self.dims(e, bind), args[-1].dtype, f"{child.path} scan", tuple(args))
        self.save(out)
        return out

    def prim(self, e: ir.Prim, inst: ir.Instance, env: dict, bind: dict) -> Val:
        """A primitive, by its registry entry's memory rule (none: it keeps its input)."""
        spec = primitives.get(e.name)
        operands = spec.operands(e) if spec.operands is not None else e.args
        args = [self.ev(a, inst, env, bind) for a in operands]
        dims, label = self.dims(e, bind), f"{inst.path}: {e.name}"
        if spec.memory is None:
            return elementwise_memory(self, args[0], dims, label, None)
        return spec.memory(self, e, args, dims, label)


def bind_dims(decl: tuple[ir.Arg, ...], actual: list[Val]) -> dict[str, tuple[ir.Dim, ...]]:
    """Free dims and `...` of a forward's arguments, bound to the caller's actual dims. B and S
    stay free (sized by the batch and sequence length, with their logical axes) unless the caller
    fixes them: a ViT's blocks see its patches + 1 positions, not the train block's `seq`."""
    out: dict[str, tuple[ir.Dim, ...]] = {}
    for a, v in zip(decl, actual, strict=True):
        dims = a.dims
        if any(d.is_ellipsis for d in dims):
            i = next(j for j, d in enumerate(dims) if d.is_ellipsis)
            tail = len(dims) - i - 1
            out["..."] = tuple(v.dims[i : len(v.dims) - tail])
            pairs = list(zip(dims[:i], v.dims[:i], strict=True)) + list(
                zip(dims[i + 1 :], v.dims[len(v.dims) - tail :], strict=True)
            )
        else:
            pairs = list(zip(dims, v.dims, strict=True))
        for d, got in pairs:
            if (
                d.size is None
                and not d.is_ellipsis
                and (d.name not in FREE_DIM_AXES or got.size is not None)
            ):
                out[d.name] = (got,)
    return out
