"""Lower a layer's `forward` from AST to IR tensor expressions.

Names are bound here: locals, arguments, parameters, a child's parameter (`embed.table`),
hyperparameters (become static values), free dims (`S`), children (calls) and primitives (looked
up in the registry, axdsl/primitives/, whose signatures check operands and static attributes).
Static `if`s are decided with the instance's hyperparameters; only the taken branch remains.
"""

from __future__ import annotations

from typing import NoReturn

from axdsl import primitives
from axdsl.errors import Span, did_you_mean, is_library, relocated
from axdsl.ir import nodes as ir
from axdsl.ir.expr import BinOp, Const
from axdsl.ir.nodes import DType, HValue, RefKind
from axdsl.irbuild.consteval import MAX_DIM, MAX_DIM_HINT, EvalError, kind_of
from axdsl.irbuild.context import BuildContext, Scope, blamed_names, dim_name
from axdsl.primitives import REQUIRED, StaticKind
from axdsl.syntax import ast


class _Abort(Exception):
    pass


def lower_forward(
    ctx: BuildContext, layer: ast.LayerDecl, scope: Scope, params, children
) -> ir.Forward | None:
    """The typed-expression forward of one instance; None when it has errors (reported)."""
    lowering = _Lowering(ctx, layer, scope, params, children)
    try:
        return lowering.run()
    except _Abort:
        return None


class _Lowering:
    def __init__(self, ctx: BuildContext, layer, scope: Scope, params, children):
        self.ctx = ctx
        self.diags = ctx.diags
        self.layer = layer
        self.scope = scope
        self.lookup = scope.lookup
        self.params = {p.name: p for p in params}
        self.children = {c.name: c for c in children}
        self.declared_params = {p.name for p in layer.params}
        self.declared_children = {c.name for c in layer.children}
        self.locals: set[str] = set()
        self.poisoned: set[str] = set()  # locals whose assignment failed: uses are not errors again
        self.free: set[str] = set()
        self.off_inputs: dict[str, ast.Expr] = {}  # inputs whose `if` is false: its condition
        self.failed = False
        self._reading: dict = {}  # span -> the names the expression there reads (see `fail`)

    def fail(
        self, span: Span, message: str, hint: str | None = None, read: ast.Expr | None = None
    ) -> NoReturn:
        """Record an error and abandon this forward. One in a library layer's line that reads
        hyperparameters (a primitive's static attribute, or `read`: a dim) is shown at the
        user's line that set one of them, with a note for the library line."""
        names = self._reading.get(span, []) if span is not None and is_library(span) else []
        if read is not None and is_library(span):
            names = blamed_names(read)
        user = ir.user_line(names, self.scope.origins) if names else None
        self.diags.add(
            relocated(
                span, message, hint, user, f"in layer `{self.layer.name}` at `{self.scope.path}`"
            )
        )
        raise _Abort()

    # ---------------------------------------------------------------- shapes
    def shape(self, exprs: tuple[ast.Expr, ...], bind_free: bool) -> tuple[ir.Dim, ...]:
        dims = []
        for i, e in enumerate(exprs):
            if isinstance(e, ast.EllipsisDim):
                if i != 0:
                    self.fail(e.span, "`...` may only stand first in a shape")
                dims.append(ir.ELLIPSIS)
            elif isinstance(e, ast.Name) and self.scope.find(e.id) is None and e.id[:1].isupper():
                if bind_free:
                    self.free.add(e.id)
                dims.append(ir.Dim(e.id))
            else:
                dims.append(self.dim_value(e))
        return tuple(dims)

    def dim_value(self, e: ast.Expr) -> ir.Dim:
        if isinstance(e, ast.Name) and self.scope.find(e.id) is None and not e.id[:1].isupper():
            hint = (
                did_you_mean(e.id, self.scope.names())
                or "free dims such as B and S start with a capital letter"
            )
            self.fail(e.span, f"unknown dim `{e.id}`", hint)
        v = self.ctx.eval(e, self.scope)
        if v is None:
            raise _Abort()
        if not isinstance(v.value, int) or isinstance(v.value, bool) or v.value < 1:
            self.fail(e.span, f"a dimension must be a positive int, got {v.value!r}", None, e)
        if v.value > MAX_DIM:
            self.fail(e.span, f"dimension {v.value:,} is too large", MAX_DIM_HINT, e)
        return ir.Dim(dim_name(e), v.value, v.expr)

    # ---------------------------------------------------------------- body
    def run(self) -> ir.Forward | None:
        fwd = self.layer.forward
        args = []
        for a in fwd.args:
            if a.name in self.locals or a.name in self.off_inputs:
                self.fail(a.span, f"argument `{a.name}` is declared twice")
            self._check_new_name(a.name, a.span)
            if a.condition is not None and not self.condition(a.condition):
                self.off_inputs[a.name] = a.condition
                continue
            args.append(ir.Arg(a.name, self.shape(a.shape, bind_free=True), a.span))
            self.locals.add(a.name)
        result = self.shape(fwd.result, bind_free=False)
        body: list[ir.Stmt] = []
        self.block(fwd.body, body)
        returns = [i for i, s in enumerate(body) if isinstance(s, ir.Ret)]
        if not returns:
            self.fail(
                fwd.span,
                f"forward of `{self.layer.name}` does not return a value",
                "end it with `return ...`",
            )
        if returns[0] != len(body) - 1:
            self.fail(body[returns[0] + 1].span, "statement after `return` is never run")
        return ir.Forward(tuple(args), result, tuple(body), fwd.span)

    def block(self, stmts, out: list) -> None:
        for s in stmts:
            try:
                if isinstance(s, ast.If):
                    cond = self.condition(s.condition)
                    self.block(s.then if cond else s.orelse, out)
                elif isinstance(s, ast.Assign):
                    value = self.expr(s.value)
                    self._check_new_name(s.name, s.span)
                    self.locals.add(s.name)
                    out.append(ir.Let(s.name, value, s.point, s.span))
                else:
                    out.append(ir.Ret(self.expr(s.value), s.span))
            except _Abort:
                self.failed = True
                if isinstance(s, ast.Assign):
                    self.poisoned.add(s.name)
        if self.failed:
            raise _Abort()

    def _check_new_name(self, name: str, span) -> None:
        if name in self.declared_params or name in self.declared_children or self.scope.find(name):
            self.fail(
                span, f"`{name}` shadows a parameter, child or hyperparameter", "pick another name"
            )
        if name in primitives.REGISTRY and not primitives.get(name).internal:
            self.fail(span, f"`{name}` shadows the primitive `{name}`", "pick another name")

    # ---------------------------------------------------------------- expressions
    def expr(self, e: ast.Expr) -> ir.TExpr:
        if self._is_static(e):
            v = self.static(e, None, None)
            if isinstance(e, (ast.Num, ast.Bool, ast.Str)):
                return ir.Lit(v.value, e.span)
            return ir.Ref(self.ctx.source_text(e), RefKind.HPARAM, e.span, value=v)
        if isinstance(e, ast.Name):
            return self.name(e)
        if isinstance(e, ast.BinOp):
            if e.op not in ir.TENSOR_OPS:
                self.fail(
                    e.span,
                    f"`{e.op}` on tensors is not supported in a forward",
                    "static conditions go in `if`, on hyperparameters",
                )
            return ir.Bin(BinOp(e.op), self.expr(e.left), self.expr(e.right), e.span)
        if isinstance(e, ast.Unary):
            if e.op != "-":
                self.fail(e.span, "`not` on tensors is not supported")
            return ir.Neg(self.expr(e.operand), e.span)
        if isinstance(e, ast.Call):
            return self.call(e)
        if isinstance(e, ast.Attr):
            return self.attr(e)
        if isinstance(e, ast.ListExpr):
            self.fail(e.span, "lists are not tensors")
        self.fail(e.span, "unexpected expression")

    def _is_static(self, e: ast.Expr) -> bool:
        if isinstance(e, (ast.Num, ast.Bool, ast.Str)):
            return True
        if isinstance(e, ast.Name):
            return (
                e.id not in self.locals
                and e.id not in self.params
                and e.id not in self.children
                and e.id not in self.free
                and (self.scope.find(e.id) is not None or e.id in ir.DTYPES)
            )
        if isinstance(e, ast.BinOp):
            return e.op != "@" and self._is_static(e.left) and self._is_static(e.right)
        if isinstance(e, ast.Unary):
            return self._is_static(e.operand)
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in ("sqrt", "log", "min", "max")
        ):
            return all(self._is_static(a) for a in e.args)
        return False

    def name(self, e: ast.Name) -> ir.TExpr:
        n = e.id
        if n in self.locals:
            return ir.Ref(n, RefKind.LOCAL, e.span)
        if n in self.params:
            return ir.Ref(n, RefKind.PARAM, e.span)
        if n in self.free:
            return ir.Ref(n, RefKind.DIM, e.span)
        if n in self.children:
            self.fail(e.span, f"child `{n}` must be called", f"write `{n}(x)`")
        if n in self.poisoned:
            raise _Abort()  # its assignment already failed with an error
        if n in self.off_inputs:
            cond = self.ctx.source_text(self.off_inputs[n])
            self.fail(
                e.span,
                f"input `{n}` does not exist for these hyperparameters (its `if` is false)",
                f"use it under the same condition: `if {cond} {{ ... }}` or `{n} if {cond}`",
            )
        if n in self.declared_params:
            self._missing_member(e.span, "parameter", n, self.layer.params)
        if n in self.declared_children:
            self._missing_member(e.span, "child", n, self.layer.children)
        candidates = sorted(
            self.locals | set(self.params) | set(self.children) | set(self.scope.names())
        )
        self.fail(e.span, f"unknown name `{n}`", did_you_mean(n, candidates))

    def attr(self, e: ast.Attr) -> ir.TExpr:
        if not isinstance(e.obj, ast.Name) or e.obj.id not in self.children:
            self.fail(
                e.span, "only a child's parameter can be read with `.`", "write `child.param`"
            )
        child = self.children[e.obj.id]
        if child.param(e.name) is None:
            self.fail(
                e.span,
                f"child `{child.name}` has no parameter `{e.name}`",
                did_you_mean(e.name, [p.name for p in child.params]),
            )
        if child.repeat is not None:
            self.fail(e.span, "parameters of a repeated child cannot be read directly")
        return ir.Ref(e.name, RefKind.CHILD_PARAM, e.span, owner=child.name)

    def call(self, e: ast.Call) -> ir.TExpr:
        if not isinstance(e.func, ast.Name):
            self.fail(e.span, "only children and primitives can be called")
        fname = e.func.id
        if fname == "scan" and fname not in self.children:
            return self.scan(e)
        if fname in self.children:
            if e.kwargs:
                self.fail(e.kwargs[0].span, "children take tensors as positional arguments")
            given = [v for v in (self.given(a) for a in e.args) if v is not None]
            self._check_conditional_arity(e, self.children[fname], len(given))
            return ir.CallChild(fname, tuple(self.expr(a) for a in given), e.span)
        if fname in primitives.REGISTRY and not primitives.get(fname).internal:
            return self.primitive(e, primitives.get(fname))
        if fname in self.declared_children:
            self._missing_member(e.func.span, "child", fname, self.layer.children)
        candidates = sorted(set(self.children) | set(primitives.callable_names()))
        self.fail(e.func.span, f"unknown function `{fname}`", did_you_mean(fname, candidates))

    def _check_conditional_arity(self, e: ast.Call, child: ir.Instance, passed: int) -> None:
        """A call whose `value if cond` arguments leave the child the wrong number of inputs
        (std's DecoderLM with `packed = true` over a block that takes no segment ids) is an
        error at the user's line that set a condition, not at the library's call."""
        conditions = [a.condition for a in e.args if isinstance(a, ast.When)]
        fwd = child.forward
        if not conditions or fwd is None or passed == len(fwd.args):
            return
        inputs = ", ".join(a.name for a in fwd.args)
        read = ast.ListExpr(tuple(conditions), e.span)
        settings = " and ".join(f"`{n}`" for n in dict.fromkeys(ast.names_in(read)))
        self.fail(
            e.span,
            f"child `{child.name}` ({child.layer}) takes {len(fwd.args)} input(s) ({inputs}), "
            f"but with {settings} as set it is passed {passed}",
            f"leave {settings} at its default, or use a layer whose forward takes the input",
            read=read,
        )

    def given(self, e: ast.Expr) -> ast.Expr | None:
        """An argument as passed: `value if cond` is the value when the static condition holds,
        else nothing (None)."""
        if not isinstance(e, ast.When):
            return e
        return e.value if self.condition(e.condition) else None

    def scan(self, e: ast.Call) -> ir.CallChild:
        """`scan(cell, x, over = S, init = h0)`: the child `cell` over the steps of dim S."""
        usage = "write `scan(cell, x, over = S)`, optionally with `init = h0`"
        if not e.args or not isinstance(e.args[0], ast.Name) or e.args[0].id not in self.children:
            at = e.args[0].span if e.args else e.span
            self.fail(
                at,
                "the first argument of `scan` is a child layer, the cell run at every step",
                usage,
            )
        child = self.children[e.args[0].id]
        if child.repeat is not None:
            self.fail(
                e.args[0].span,
                f"`scan` runs one cell over time; `{child.name}` is a repeated child",
                "scan a child that is not repeated",
            )
        if len(e.args) < 2:
            self.fail(e.span, "`scan` needs at least one input to run over", usage)
        kwargs = {}
        for kw in e.kwargs:
            if kw.name not in ("over", "init"):
                self.fail(
                    kw.span,
                    f"`scan` has no argument `{kw.name}`",
                    did_you_mean(kw.name, ["over", "init"]),
                )
            kwargs[kw.name] = kw.value
        if "over" not in kwargs:
            self.fail(e.span, "`scan` needs `over`, the dim its steps run along", usage)
        over = self.dim(kwargs["over"])
        xs = tuple(self.expr(a) for a in e.args[1:])
        init = (self.expr(kwargs["init"]),) if "init" in kwargs else ()
        return ir.CallChild(child.name, init + xs, e.span, over=over, scan_init=bool(init))

    def _missing_member(self, span, what: str, name: str, decls) -> None:
        """A declared parameter or child that was not built: off by its `if`, or already in
        error."""
        decl = next(d for d in decls if d.name == name)
        if decl.condition is not None and self.ctx.condition(decl.condition, self.scope) is False:
            self.fail(
                span,
                f"{what} `{name}` does not exist for these hyperparameters (its `if` is false)",
                "use it under the same condition, "
                f"e.g. `if {self.ctx.source_text(decl.condition)} {{ ... }}`",
            )
        raise _Abort()  # building it failed, and that error is already reported

    def condition(self, e: ast.Expr) -> bool:
        """The value of a static `if` condition: a bool computed from hyperparameters."""
        try:
            v = self.ctx.ev.eval(e, self.lookup, self.scope.names)
        except EvalError:
            raise _Abort() from None
        if not isinstance(v.value, bool):
            self.fail(
                e.span,
                f"an `if` condition must be a bool, got {kind_of(v.value)}",
                "conditions are built from hyperparameters, e.g. `if bias` or `if dropout > 0.0`",
            )
        return v.value

    # ---------------------------------------------------------------- static attributes
    def static(self, e: ast.Expr, kind: StaticKind | None, what: str | None) -> HValue:
        try:
            v = self.ctx.ev.eval(e, self.lookup, self.scope.names)
        except EvalError:
            raise _Abort() from None
        if kind is None:
            return v
        ok = {
            StaticKind.BOOL: isinstance(v.value, bool),
            StaticKind.INT: isinstance(v.value, int) and not isinstance(v.value, bool),
            StaticKind.FLOAT: isinstance(v.value, (int, float)) and not isinstance(v.value, bool),
            StaticKind.STRING: isinstance(v.value, str),
            StaticKind.DTYPE: isinstance(v.value, DType),
        }[kind]
        if not ok:
            self.fail(
                e.span,
                f"`{what}` must be a static {kind.value}, got {kind_of(v.value)}",
            )
        return v

    def dim(self, e: ast.Expr) -> ir.Dim:
        if isinstance(e, ast.Name) and (
            e.id in self.free or (e.id[:1].isupper() and self.scope.find(e.id) is None)
        ):
            if e.id not in self.free:
                self.fail(
                    e.span,
                    f"unknown dim `{e.id}`",
                    "free dims must appear in the forward's arguments",
                )
            return ir.Dim(e.id)
        return self.dim_value(e)

    def dims(self, e: ast.Expr, what: str) -> tuple[ir.Dim, ...]:
        """A static list of dims, `[heads, head_dim]`."""
        if not isinstance(e, ast.ListExpr) or not e.items:
            self.fail(
                e.span,
                f"`{what}` must be a list of dims",
                "e.g. `[heads, head_dim]`",
            )
        return tuple(self.dim(item) for item in e.items)

    def dim_by_name(self, name: str, span) -> ir.Dim:
        if name in self.free or (name[:1].isupper() and self.scope.find(name) is None):
            return ir.Dim(name)
        return self.dim_value(ast.Name(name, span))

    # ---------------------------------------------------------------- primitive calls
    def primitive(self, call: ast.Call, prim: primitives.Primitive) -> ir.Prim:
        """A primitive call checked against its signature: tensors, then static attributes."""
        if prim.lower is not None:
            return prim.lower(self, call)
        sig, name = prim.signature, prim.name
        for a in call.args:
            if isinstance(a, ast.When):
                self.fail(
                    a.span,
                    f"a positional argument of `{name}` cannot be conditional",
                    "make it a keyword, `name = value if cond`, or use an `if` block",
                )
        if len(call.args) > len(sig.tensors) + len(sig.statics):
            self.fail(
                call.span,
                f"`{name}` takes at most {len(sig.tensors) + len(sig.statics)} "
                "positional arguments",
            )
        if len(call.args) < len(sig.tensors):
            self.fail(
                call.span,
                f"`{name}` needs {len(sig.tensors)} tensor argument(s): {', '.join(sig.tensors)}",
            )
        tensors = tuple(self.expr(a) for a in call.args[: len(sig.tensors)])
        given = {
            s.name: a for s, a in zip(sig.statics, call.args[len(sig.tensors) :], strict=False)
        }
        optional = self._keywords(call, prim, given)
        reads = {a.span: ast.names_in(a) for a in given.values()}
        self._reading.update(reads)
        attrs = {s.name: self._static_attr(call, prim, s, given) for s in sig.statics}
        self._check_bounds(call, sig.statics, given, attrs)
        if prim.check is not None:
            prim.check(self, given, attrs)
        names = tuple(k for k in sig.optional_tensors if k in optional)
        return ir.Prim(
            name,
            tensors + tuple(optional[k] for k in names),
            tuple(attrs.items()),
            call.span,
            optional=names,
            reads=tuple(dict.fromkeys(n for ns in reads.values() for n in ns)),
            decoding=prim.decoding,
        )

    def _check_bounds(
        self, call: ast.Call, statics: tuple[primitives.Static, ...], given: dict, attrs: dict
    ) -> None:
        """Every static attribute within its declared bounds (`window >= 0`), reported where the
        value is written: a library layer's `window = window` is shown at the user's setting."""
        for s in statics:
            attr = attrs[s.name]
            broken = ast.violated(s.bounds, attr.value) if isinstance(attr, HValue) else None
            if broken is not None:
                at = given[s.name].span if s.name in given else call.span
                self.fail(at, f"`{s.name}` must be {broken}, got {attr.value!r}", s.hint)

    def _keywords(
        self, call: ast.Call, prim: primitives.Primitive, given: dict
    ) -> dict[str, ir.TExpr]:
        """Sort keyword arguments into optional tensors and static attributes (`given`)."""
        sig, optional = prim.signature, {}
        statics = [s.name for s in sig.statics]
        for kw in call.kwargs:
            value = self.given(kw.value)
            if value is None:
                continue  # `name = value if cond` with a false condition: not given
            kw = ast.Kwarg(kw.name, value, kw.span)
            if kw.name in sig.optional_tensors:
                optional[kw.name] = self.expr(kw.value)
            elif kw.name in statics:
                if kw.name in given:
                    self.fail(kw.span, f"`{kw.name}` is given twice")
                given[kw.name] = kw.value
            else:
                self.fail(
                    kw.span,
                    f"`{prim.name}` has no argument `{kw.name}`",
                    did_you_mean(kw.name, statics + list(sig.optional_tensors)),
                )
        return optional

    def _static_attr(
        self, call: ast.Call, prim: primitives.Primitive, s: primitives.Static, given: dict
    ):
        if s.name in given:
            expr = given[s.name]
            if s.kind is StaticKind.DIMS:
                return self.dims(expr, s.name)
            return self.dim(expr) if s.kind is StaticKind.DIM else self.static(expr, s.kind, s.name)
        if s.default is REQUIRED:
            self.fail(call.span, f"`{prim.name}` needs `{s.name}`")
        return None if s.default is None else HValue(s.default, Const(s.default))
