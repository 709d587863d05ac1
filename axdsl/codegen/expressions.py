"""Emit Python/JAX code for forward bodies: one statement per spec statement, shapes in comments.

Child calls are hoisted into their own statements under `jax.named_scope(child)`, so a profile
shows the spec's layer paths; a repeated child becomes a `jax.lax.scan` over stacked parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from axdsl import primitives
from axdsl.codegen.names import einsum_letters, py_str
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import DType, RefKind, TensorType
from axdsl.passes.annotate_sharding import activation_spec, spec_text

# Operator precedence for minimal parentheses (higher binds tighter).
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 2}  # Python: @ binds like *
_ATOM = 10


def code_precedence(code: str) -> int:
    """How tightly a hyperparameter's code binds: names and numbers are atoms."""
    try:
        float(code)
        return 4 if code.startswith("-") else _ATOM
    except ValueError:
        pass
    if code.replace(".", "").replace("_", "").isalnum():
        return _ATOM
    return 0


def shape_comment(t) -> str:
    if isinstance(t, TensorType):
        return "[" + ", ".join(d.name for d in t.dims) + "]"
    return ""


@dataclass
class FunctionEmitter:
    """Emits the body of one layer function. `child_fn` maps a child name to its function name."""

    inst: ir.Instance
    child_fn: dict[str, str]
    needs_rng: dict[str, bool]
    own_rng: bool
    schedule: ir.Schedule | None = None
    dim_axes: dict[str, str] = field(default_factory=dict)
    child_aux: dict[str, bool] = field(default_factory=dict)  # children that return (y, aux loss)
    own_aux: bool = False  # this function returns (y, aux loss)
    aux_terms: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    temps: set[str] = field(default_factory=set)
    rng_uses: int = 0

    def emit_body(self) -> list[str]:
        fwd = self.inst.forward
        if self.inst.path == "/" and self.inst.hparam("dtype") and self.inst.hparam("param_dtype"):
            self.lines.append("# master weights stay in cfg.param_dtype; compute runs in cfg.dtype")
            self.lines.append("params = jax.tree.map(lambda w: w.astype(cfg.dtype), params)")
        for stmt in fwd.body:
            if isinstance(stmt, ir.Let):
                self._let(stmt)
            else:
                aux = ""
                if isinstance(stmt.value, ir.CallChild):
                    self._child_call(stmt.value, "out")
                    code, comment = "out", ""
                else:
                    code, _ = self.expr(stmt.value)
                    comment = f"  # {shape_comment(stmt.value.type)}"
                if self.own_aux:
                    aux = ", " + (" + ".join(self.aux_terms) or "jnp.zeros((), jnp.float32)")
                self.lines.append(f"return {code}{aux}{comment}")
        return self.lines

    def _let(self, stmt: ir.Let) -> None:
        if isinstance(stmt.value, ir.CallChild) and stmt.point is None:
            self._child_call(stmt.value, stmt.name)
            return
        code, _ = self.expr(stmt.value)
        if stmt.point is not None:
            code = f"checkpoint_name({code}, {py_str(stmt.point)})"
        self.lines.append(f"{stmt.name} = {code}  # {shape_comment(stmt.value.type)}")

    # ---------------------------------------------------------------- child calls
    def _child_call(self, call: ir.CallChild, target: str) -> None:
        args = [self.expr(a)[0] for a in call.args]
        child = self.inst.child(call.child)
        fn = self.child_fn[call.child]
        rng = ""
        if self.needs_rng.get(call.child):
            self.rng_uses += 1
            rng = f", rng=_fold(rng, {self.rng_uses})"
        comment = shape_comment(call.type)
        aux = self.child_aux.get(call.child, False)
        if child.repeat is not None and aux:
            self._scan_with_aux(call, child, fn, args[0], target, rng, comment)
            return
        if aux:
            aux_name = self._fresh(f"{call.child}_aux")
            self.aux_terms.append(aux_name)
            self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
            self.lines.append(f"    {target}, {aux_name} = {fn}(cfg, params[{py_str(call.child)}], "
                              f"{', '.join(args)}{rng})  # {comment}")
            return
        if child.repeat is not None:
            step = f"{call.child}_step"
            if child.remat is not None and child.remat.kind != "none":
                self.lines.append("@functools.partial(jax.checkpoint, policy=REMAT_POLICY, prevent_cse=False)")
            constraint = self._constraint(call.args[0].type)
            if rng:
                self.lines.append(f"def {step}(h, xs):  # one of {child.repeat.code} stacked layers")
                self.lines.append(f"    layer_params, i = xs")
                if constraint:
                    self.lines.append(f"    h = shard(h, {constraint})")
                self.lines.append(f"    return {fn}(cfg, layer_params, h{rng.replace(str(self.rng_uses), 'i')}), None")
                xs = f'(params[{py_str(call.child)}], jnp.arange({child.repeat.code}))'
            else:
                self.lines.append(f"def {step}(h, layer_params):  # one of {child.repeat.code} stacked layers")
                if constraint:
                    self.lines.append(f"    h = shard(h, {constraint})")
                self.lines.append(f"    return {fn}(cfg, layer_params, h), None")
                xs = f"params[{py_str(call.child)}]"
            self.lines.append("")
            self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
            self.lines.append(f"    {target}, _ = jax.lax.scan({step}, {args[0]}, {xs})  # {comment}")
            return
        self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
        self.lines.append(
            f"    {target} = {fn}(cfg, params[{py_str(call.child)}], {', '.join(args)}{rng})  # {comment}"
        )

    def _scan_with_aux(self, call: ir.CallChild, child: ir.Instance, fn: str, x: str, target: str,
                       rng: str, comment: str) -> None:
        """A repeated child that returns an auxiliary loss: the scan carries (h, summed aux)."""
        step = f"{call.child}_step"
        if child.remat is not None and child.remat.kind != "none":
            self.lines.append("@functools.partial(jax.checkpoint, policy=REMAT_POLICY, prevent_cse=False)")
        per_layer = "xs" if rng else "layer_params"
        self.lines.append(f"def {step}(carry, {per_layer}):  # one of {child.repeat.code} stacked layers")
        self.lines.append("    h, aux = carry")
        if rng:
            self.lines.append("    layer_params, i = xs")
        constraint = self._constraint(call.args[0].type)
        if constraint:
            self.lines.append(f"    h = shard(h, {constraint})")
        layer_rng = rng.replace(str(self.rng_uses), "i") if rng else ""
        self.lines.append(f"    h, layer_aux = {fn}(cfg, layer_params, h{layer_rng})")
        self.lines.append("    return (h, aux + layer_aux), None")
        xs = (f'(params[{py_str(call.child)}], jnp.arange({child.repeat.code}))' if rng
              else f"params[{py_str(call.child)}]")
        aux_name = self._fresh(f"{call.child}_aux")
        self.aux_terms.append(aux_name)
        self.lines.append("")
        self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
        self.lines.append(f"    ({target}, {aux_name}), _ = jax.lax.scan({step}, ({x}, jnp.zeros((), jnp.float32)), "
                          f"{xs})  # {comment}")

    def _fresh(self, name: str) -> str:
        base, n = name, 1
        while name in self.temps:
            n += 1
            name = f"{base}{n}"
        self.temps.add(name)
        return name

    def _constraint(self, t) -> str:
        """The layout of a layer-boundary activation as `P(...)`, or "" when there is no schedule."""
        if self.schedule is None or not isinstance(t, TensorType):
            return ""
        logical = tuple(self.dim_axes.get(d.name) for d in t.dims)
        return spec_text(activation_spec(self.schedule, logical))

    def _hoist(self, call: ir.CallChild) -> str:
        name = self._fresh(f"{call.child}_out")
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
        return e.value.code, code_precedence(e.value.code)

    def _Lit(self, e: ir.Lit):
        if isinstance(e.value, DType):
            return f"jnp.{e.value.jnp}", _ATOM
        return repr(e.value), _ATOM

    def _Neg(self, e: ir.Neg):
        code, prec = self.expr(e.operand)
        return f"-{self._paren(code, prec, 4)}", 4

    def _Bin(self, e: ir.Bin):
        if e.op == "@":
            return self._matmul(e)
        p = _PREC[e.op]
        left, lp = self.expr(e.left)
        right, rp = self.expr(e.right)
        return f"{self._paren(left, lp, p)} {e.op} {self._paren(right, rp, p + 1)}", p

    def _matmul(self, e: ir.Bin):
        left, lp = self.expr(e.left)
        right, rp = self.expr(e.right)
        lt, rt = e.left.type.dims, e.right.type.dims
        if len(rt) == 2 and len(lt) >= 2:
            return f"{self._paren(left, lp, 2)} @ {self._paren(right, rp, 3)}", 2
        lspec, rspec = _operand_letters(lt, rt)
        out = lspec[:-1] + rspec[1:]
        return f"jnp.einsum({py_str(f'{lspec},{rspec}->{out}')}, {left}, {right})", _ATOM

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

    def next_rng(self) -> str:
        """A distinct dropout key for the next random site of this function."""
        self.rng_uses += 1
        return f"_fold(rng, {self.rng_uses})"

    def add_aux(self, name: str) -> None:
        """Add a local to this function's auxiliary loss (returned as `(y, aux)`)."""
        self.aux_terms.append(name)

    def einsum_spec(self, e: ir.Prim) -> str:
        return _einsum_spec(e)

    def matmul_spec(self, lt, rt) -> str:
        lspec, rspec = _operand_letters(lt, rt)
        return f"{lspec},{rspec}->{lspec[:-1] + rspec[1:]}"

    def paren(self, code: str, prec: int, need: int) -> str:
        return self._paren(code, prec, need)

    # ---------------------------------------------------------------- helpers
    def dim_code(self, dim: ir.Dim) -> str:
        """Runtime size of a free dim: read from the first argument that carries it."""
        for a in self.inst.forward.args:
            for i, d in enumerate(a.dims):
                if d.is_free and d.name == dim.name:
                    index = i - len(a.dims) if a.dims and a.dims[0].is_ellipsis else i
                    return f"{a.name}.shape[{index}]"
        return dim.code or str(dim.size)

    @staticmethod
    def _paren(code: str, prec: int, need: int) -> str:
        return code if prec >= need else f"({code})"


def _einsum_spec(e: ir.Prim) -> str:
    spec: ir.EinsumSpec = e.attr("spec")
    operands, out = spec.operands, spec.out
    letters = einsum_letters([n for op in operands for n in op] + list(out))
    return ",".join("".join(letters[n] for n in op) for op in operands) + "->" + "".join(letters[n] for n in out)


def _operand_letters(lt, rt) -> tuple[str, str]:
    """Einsum letters for `left @ right` (left's last dim contracts with right's first); `...` kept."""
    used: set[str] = set()

    def pick(name: str) -> str:
        for c in (name[0].lower(), *name.lower(), *"abcdefghijklmnopqrstuvwxyz"):
            if c.isalpha() and c not in used:
                used.add(c)
                return c
        raise AssertionError("ran out of einsum letters")

    left = ["..." if d.is_ellipsis else pick(d.name) for d in lt[:-1]]
    contract = pick(lt[-1].name)
    right = [pick(d.name) for d in rt[1:]]
    return "".join(left) + contract, contract + "".join(right)
