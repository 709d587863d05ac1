"""Instantiate a model's layer tree with every hyperparameter resolved (AST -> IR instances).

A hyperparameter's value comes from, in order: set here (constructor argument or model setting),
inherited (the nearest ancestor with a hyperparameter of the same name: dims are written once),
its default. Each `HParam` records which (an `ir.Origin`), so `axdsl dump` can show it. Static
`if`s on params and children are decided here, so the IR holds only what exists.

    model tiny = DecoderLM { dim = 64 ... }        Instance / : DecoderLM
    layer Block(dim: int, ...) {          ->         dim = 64          # set here
      child attn_norm = norm                         Instance /blocks : Block
                                                       dim = 64        # inherited from /
"""

from __future__ import annotations

import math
from typing import TypeGuard

from axdsl.errors import Span, did_you_mean
from axdsl.ir import nodes as ir
from axdsl.ir.expr import BinOp, Binary, Const, Expr, Field, ops_of, spec_text, subexprs
from axdsl.ir.nodes import (
    DType,
    InitKind,
    HValue,
    LayerValue,
    Origin,
    OriginKind,
    PatternValue,
    RepeatValue,
    RefKind,
)
from axdsl.ir.printer import value_text
from axdsl.irbuild.consteval import MAX_DIM, MAX_DIM_HINT, EvalError, kind_of
from axdsl.irbuild.context import BuildContext, Scope, blamed_names, dim_name
from axdsl.irbuild.forward import lower_forward
from axdsl.syntax import ast

HPARAM_TYPES = ("int", "float", "bool", "string", "dtype", "Layer", "enum")

MAX_DEPTH = 32


class InstanceBuilder:
    """Builds `ir.Model`s from model declarations; errors go to the context's diagnostics."""

    def __init__(self, ctx: BuildContext):
        self.ctx = ctx
        self.program = ctx.program
        self.diags = ctx.diags
        self.ev = ctx.ev

    # ---------------------------------------------------------------- models
    def model(self, decl: ast.ModelDecl) -> ir.Model | None:
        chain = self._model_chain(decl)
        if chain is None:
            return None
        layer_name = chain[0].base
        if layer_name not in self.program.layers:
            self.diags.error(
                chain[0].base_span,
                f"unknown layer `{layer_name}`",
                did_you_mean(layer_name, list(self.program.layers)),
            )
            return None
        settings: dict[str, ast.Setting] = {}
        for m in chain:
            for s in m.settings:
                settings[s.name] = s
        root = self.instantiate(
            self.program.layers[layer_name],
            "/",
            decl.name,
            decl.span,
            set_exprs=settings,
            set_values={},
            parent=None,
            stack=(),
        )
        if root is None:
            return None
        self._check_param_count(decl, root)
        return ir.Model(decl.name, root, decl.span)

    def _check_param_count(self, decl: ast.ModelDecl, root: ir.Instance) -> None:
        """A model no machine could hold is an error at the user's model, before any compute."""
        total = _param_count(root)
        if total > MAX_PARAMS:
            self.diags.error(
                decl.span,
                f"model `{decl.name}` has {total:,} parameters ({total:.2e}), more than any "
                f"machine holds",
                f"at most 2**48 = {MAX_PARAMS:.2e} parameters: in f32 with Adam's two moments "
                "that is 3 PiB, beyond the largest accelerator system (a TPU v7 pod: 9,216 chips "
                "x 192 GB = 1.8 PB); check `layers`, `dim`, `vocab` and the other sizes",
            )

    def _model_chain(self, decl: ast.ModelDecl) -> list[ast.ModelDecl] | None:
        chain, seen = [decl], {decl.name}
        while chain[0].extends:
            base = self.program.models.get(chain[0].base)
            if base is None:
                self.diags.error(
                    chain[0].base_span,
                    f"unknown model `{chain[0].base}`",
                    did_you_mean(chain[0].base, list(self.program.models)),
                )
                return None
            if base.name in seen:
                cycle = " -> ".join([m.name for m in reversed(chain)] + [base.name])
                self.diags.error(
                    decl.span,
                    f"model `{decl.name}` extends itself: {cycle}",
                    "a model extends a different model or `=` a layer",
                )
                return None
            seen.add(base.name)
            chain.insert(0, base)
        return chain

    # ---------------------------------------------------------------- instances
    def instantiate(
        self,
        layer: ast.LayerDecl,
        path: str,
        name: str,
        span: Span,
        *,
        set_exprs: dict[str, ast.Setting],
        set_values: dict[str, HValue],
        parent: Scope | None,
        stack: tuple[str, ...],
        repeat: HValue | None = None,
        set_by: LayerValue | None = None,
    ) -> ir.Instance | None:
        if layer.name in stack:
            cycle = " -> ".join(stack + (layer.name,))
            self.diags.error(span, f"layer recursion: {cycle}", "a layer cannot contain itself")
            return None
        if len(stack) > MAX_DEPTH:
            self.diags.error(span, "layer tree is too deep")
            return None
        stack = stack + (layer.name,)
        declared = {h.name: h for h in layer.hparams}
        for key, s in set_exprs.items():
            if key not in declared:
                self.diags.error(
                    s.span,
                    f"layer `{layer.name}` has no hyperparameter `{key}`",
                    did_you_mean(key, list(declared)),
                )
        for key in set_values:
            if key not in declared:
                self.diags.error(
                    set_by.span_of(key) if set_by else span,  # the user's `hiden = 96`, not std's
                    f"layer `{layer.name}` has no hyperparameter `{key}`",
                    did_you_mean(key, list(declared)),
                )
        scope = Scope(path, {}, parent)
        self._resolve_hparams(
            layer,
            scope,
            set_exprs,
            set_values,
            is_root=parent is None,
            span=span,
            set_by=set_by,
        )
        hparams = tuple(scope.values[h.name] for h in layer.hparams if h.name in scope.values)
        if len(hparams) != len(layer.hparams):
            return None  # errors already reported
        params = tuple(p for p in (self._param(decl, scope) for decl in layer.params) if p)
        children = []
        for child in layer.children:
            inst = self._child(child, path, scope, stack)
            if inst is not None:
                children.append(inst)
        forward = lower_forward(self.ctx, layer, scope, params, children) if layer.forward else None
        if layer.forward is None:
            self.diags.error(
                layer.span,
                f"layer `{layer.name}` has no forward",
                "add `forward(x: [B, S, dim]) -> [B, S, dim] { ... }`",
            )
        return ir.Instance(
            path,
            name,
            layer.name,
            hparams,
            params,
            tuple(children),
            forward,
            span,
            layer.span,
            repeat,
        )

    def _resolve_hparams(
        self,
        layer: ast.LayerDecl,
        scope: Scope,
        set_exprs,
        set_values,
        is_root: bool,
        span: Span,
        set_by: LayerValue | None,
    ) -> None:
        declared = {h.name: h for h in layer.hparams}
        busy: set[str] = set()

        def resolve_one(name: str, at: ast.Name | None) -> ir.HParam | None:
            if name in scope.values:
                return scope.values[name]
            decl = declared[name]
            if name in busy:
                self.diags.error(decl.span, f"hyperparameter `{name}` depends on itself")
                return None
            busy.add(name)
            try:
                hp = self._hparam_value(
                    layer, decl, scope, set_exprs, set_values, lookup, is_root, span, set_by
                )
            except EvalError:
                hp = None
            busy.discard(name)
            if hp is not None:
                scope.values[name] = hp
            return hp

        def lookup(name: str, at: ast.Name) -> HValue | None:
            if name in declared:
                hp = resolve_one(name, at)
                if hp is None:
                    raise EvalError(name)
                return hp.value
            found = scope.parent.find(name) if scope.parent else None
            return found.value if found else None

        for h in layer.hparams:
            resolve_one(h.name, None)

    def _hparam_value(
        self,
        layer: ast.LayerDecl,
        decl: ast.HParamDecl,
        scope: Scope,
        set_exprs,
        set_values,
        lookup,
        is_root: bool,
        inst_span: Span,
        set_by: LayerValue | None,
    ) -> ir.HParam | None:
        """Resolve one hyperparameter; type errors point where the user wrote the value.

        `set_by` is the layer constructor (`RMSNorm(eps = 1e-5)`) that set `set_values`: the
        origin of such a value is the constructor; its errors point at the argument.
        """
        type_name = self._type_name(decl.type)
        if type_name is None:
            return None
        visible = lambda: scope.names()  # noqa: E731
        expr: ast.Expr | None = None
        at = decl.span
        if decl.name in set_values:
            origin = Origin(OriginKind.SET, set_by.span if set_by else None)
            value = set_values[decl.name]
            at = set_by.span_of(decl.name) if set_by else inst_span
        elif decl.name in set_exprs:
            setting = set_exprs[decl.name]
            expr, at = setting.value, setting.value.span
            value, origin = self.ev.eval(setting.value, lookup, visible), Origin(
                OriginKind.SET, setting.span
            )
        elif scope.parent is not None and (inherited := scope.parent.find(decl.name)) is not None:
            owner = self._owner_path(scope.parent, decl.name)
            value, origin = inherited.value, Origin(OriginKind.INHERITED, where=owner)
        elif decl.default is not None:
            expr = decl.default
            value, origin = self._eval_default(decl.default, lookup, visible, scope), ir.DEFAULT
        else:
            self.diags.error(
                inst_span,
                f"`{decl.name}` of layer `{layer.name}` at `{scope.path}` needs a value",
                f"set `{decl.name} = ...` in the model or the parent layer, or give it a default "
                f"(declared at {decl.span})",
            )
            return None
        value = self._check_type(decl, type_name, value, origin, scope, at, expr)
        if value is None or not self._check_bounds(decl, value, scope, at, expr):
            return None
        if is_root and type_name in ("int", "float", "dtype"):
            value = HValue(value.value, Field(decl.name))
        options = tuple(decl.type.options) if type_name == "enum" else ()
        return ir.HParam(
            decl.name, ir.HParamType(ir.HParamKind(type_name), options), value, origin, decl.span
        )

    def _owner_path(self, scope: Scope | None, name: str) -> str:
        while scope is not None and name not in scope.values:
            scope = scope.parent
        return scope.path if scope else "?"

    def _type_name(self, t: ast.TypeRef) -> str | None:
        if t.name in HPARAM_TYPES:
            return t.name
        self.diags.error(
            t.span,
            f"unknown type `{t.name}`",
            did_you_mean(t.name, HPARAM_TYPES) or f"types are {', '.join(HPARAM_TYPES)}",
        )
        return None

    def _check_type(
        self,
        decl: ast.HParamDecl,
        type_name: str,
        value: HValue,
        origin: Origin,
        scope: Scope,
        at: Span,
        expr: ast.Expr | None,
    ) -> HValue | None:
        """Check `value` against the declared type; report at `at`, where the value was written."""
        v = value.value
        ok = {
            "int": isinstance(v, int) and not isinstance(v, bool),
            "float": isinstance(v, (int, float)) and not isinstance(v, bool),
            "bool": isinstance(v, bool),
            "string": isinstance(v, str),
            "enum": isinstance(v, str) and v in decl.type.options,
            "dtype": isinstance(v, DType),
            "Layer": isinstance(v, (LayerValue, RepeatValue, PatternValue)),
        }[type_name]
        if ok:
            if type_name == "float" and isinstance(v, int):
                return HValue(float(v), value.expr)
            return value
        where = f" ({origin})" if origin.kind is not OriginKind.SET else ""
        declared = f"declared as `{decl.name}: {_show_type(decl.type)}` at {decl.span}"
        text = self.ctx.source_text(expr) if expr is not None else _value_source(value)
        hint: str | None
        ops = ops_of(value.expr) if value.expr is not None else set()
        if (
            type_name == "int"
            and isinstance(v, float)
            and BinOp.FLOORDIV not in ops
            and BinOp.DIV in ops
        ):
            msg = (
                f"`{decl.name}` of layer at `{scope.path}` must be an int, but `{text}` is {v:g}: "
                f"the division is not exact"
            )
            hint = (
                "the divisor must divide the dividend (e.g. heads must divide dim), "
                f"or set `{decl.name}`"
            )
        elif type_name == "enum" and isinstance(v, str):
            options = ", ".join(map(_show, decl.type.options))
            msg = f"`{decl.name}` must be one of {options}, got {_show(v)}"
            hint = did_you_mean(v, decl.type.options) or declared
        else:
            msg = (
                f"`{decl.name}` of layer at `{scope.path}` is {type_name}, "
                f"but got {kind_of(v)} {_show(v)}{where}"
            )
            hint = declared if at != decl.span else None
        names = ast.names_in(expr) if expr is not None else []
        if isinstance(expr, ast.BinOp) and expr.op == "/":  # an inexact division: blame the divisor
            names = ast.names_in(expr.right) + names
        self.ctx.error_at_user_line(
            at, msg, hint, scope, names, f"in the default of a layer at `{scope.path}`"
        )
        return None

    def _check_bounds(
        self, decl: ast.HParamDecl, value: HValue, scope: Scope, at: Span, expr: ast.Expr | None
    ) -> bool:
        """Check `value` against the bounds declared in its type (`eps: float(> 0)`); report at
        the user's line that set it (or a value it derives from), never at the library's."""
        broken = ast.violated(decl.type.bounds, value.value)
        if broken is None:
            return True
        names = [decl.name] + (blamed_names(expr) if expr is not None else [])
        self.ctx.error_at_user_line(
            at,
            f"`{decl.name}` must be {broken}, got {_show(value.value)}",
            f"declared as `{decl.name}: {_show_type(decl.type)}` at {decl.span}",
            scope,
            names,
            f"in a layer at `{scope.path}`",
        )
        return False

    def _eval_default(self, expr: ast.Expr, lookup, visible, scope: Scope) -> HValue:
        """A declaration's default, evaluated; an error in it (`dim / heads` with the user's
        `heads = 0`) is shown at the user's line that set a value it reads, the divisor first."""
        names = blamed_names(expr)

        def report(span: Span, msg: str, hint: str | None) -> None:
            self.ctx.error_at_user_line(
                span, msg, hint, scope, names, f"in the default of a layer at `{scope.path}`"
            )

        self.ev.report = report
        try:
            return self.ev.eval(expr, lookup, visible)
        finally:
            self.ev.report = None

    # ---------------------------------------------------------------- params and children
    def _param(self, decl: ast.ParamDecl, scope: Scope) -> ir.Param | None:
        if not self.ctx.condition(decl.condition, scope):
            return None
        dims = []
        for d in decl.shape:
            if isinstance(d, ast.EllipsisDim):
                self.diags.error(
                    d.span, "a parameter's shape must be fully known; `...` is for forward shapes"
                )
                return None
            v = self.ctx.eval(d, scope)
            if v is None:
                return None
            positive = isinstance(v.value, int) and not isinstance(v.value, bool) and v.value >= 1
            if not positive or v.value > MAX_DIM:
                # blamed: what the dim reads, then the root settings its value derives from
                fields = (
                    [f.name for f in subexprs(v.expr) if isinstance(f, Field)] if v.expr else []
                )
                self.ctx.error_at_user_line(
                    d.span,
                    (
                        f"dimension {v.value:,} is too large"
                        if positive
                        else f"a dimension must be a positive int, got {_show(v.value)}"
                    ),
                    MAX_DIM_HINT if positive else None,
                    scope,
                    blamed_names(d) + fields,
                )
                return None
            dims.append(ir.Dim(dim_name(d), v.value, v.expr))
        init = self._init(decl, scope)
        axes = decl.axes
        if axes is None:
            self.diags.error(
                decl.span,
                f"parameter `{decl.name}` has no logical axes",
                f"add `axes(...)` with one logical axis per dim ({len(dims)} here); "
                f"known axes: {', '.join(ir.LOGICAL_AXES)}",
            )
            return None
        dtype_name = decl.dtype or self._root_param_dtype(scope)
        if dtype_name not in ir.DTYPES:
            self.diags.error(
                decl.dtype_span or decl.span,
                f"unknown dtype `{dtype_name}`",
                did_you_mean(dtype_name, ir.DTYPES) or f"dtypes are {', '.join(ir.DTYPES)}",
            )
            return None
        if init is None:
            return None
        return ir.Param(decl.name, tuple(dims), axes, init, DType(dtype_name), decl.span)

    def _root_param_dtype(self, scope: Scope) -> str:
        hp = scope.find("param_dtype")
        return hp.value.value.name if hp and isinstance(hp.value.value, DType) else "f32"

    def _init(self, decl: ast.ParamDecl, scope: Scope) -> ir.Init | None:
        spec = decl.init
        if spec is None:
            return ir.Init(InitKind.NORMAL, (HValue(0.02, Const(0.02)),), decl.span)
        known = [str(k) for k in InitKind]
        if spec.kind not in known:
            self.diags.error(
                spec.span,
                f"unknown initializer `{spec.kind}`",
                did_you_mean(spec.kind, known) or f"use one of {', '.join(known)}",
            )
            return None
        kind = InitKind(spec.kind)
        if len(spec.args) != kind.arity:
            self.diags.error(spec.span, f"`{spec.kind}` takes {kind.arity} argument(s)")
            return None
        args = []
        for a in spec.args:
            v = self.ctx.eval(a, scope)
            if v is None:
                return None
            if not isinstance(v.value, (int, float)) or isinstance(v.value, bool):
                self.diags.error(
                    a.span, f"initializer arguments are numbers, got {kind_of(v.value)}"
                )
                return None
            args.append(HValue(float(v.value), v.expr))
        problem = _init_range(kind, [a.value for a in args])
        if problem:
            self.diags.error(spec.span, f"`{spec.kind}` {problem[0]}", problem[1])
            return None
        return ir.Init(kind, tuple(args), spec.span)

    def _child(self, decl: ast.ChildDecl, path: str, scope: Scope, stack) -> ir.Instance | None:
        if not self.ctx.condition(decl.condition, scope):
            return None
        v = self.ctx.eval(decl.value, scope)
        if v is None:
            return None
        repeat = None
        value = v.value
        if isinstance(value, RepeatValue):
            repeat, value = value.count, value.layer
        if isinstance(value, PatternValue):
            if repeat is None:
                self.diags.error(
                    decl.value.span,
                    f"child `{decl.name}` is a list of layers, which only " "`repeat` can run",
                    f"write `child {decl.name} = repeat(n, [...])`",
                )
                return None
            return self._pattern(decl, value, repeat, path, scope, stack)
        if not isinstance(value, LayerValue):
            self.diags.error(
                decl.value.span,
                f"child `{decl.name}` must be a layer, got {kind_of(value)}",
                "write `child name = LayerName(...)` or name a Layer hyperparameter",
            )
            return None
        layer = self.program.layers[value.layer]
        child_path = (path if path.endswith("/") else path + "/") + decl.name
        return self.instantiate(
            layer,
            child_path,
            decl.name,
            decl.span,
            set_exprs={},
            set_values=dict(value.args),
            parent=scope,
            stack=stack,
            repeat=repeat,
            set_by=value,
        )

    def _pattern(
        self,
        decl: ast.ChildDecl,
        pattern: PatternValue,
        count: HValue,
        path: str,
        scope: Scope,
        stack,
    ) -> ir.Instance | None:
        """`repeat(n, [A(), B()])`: a group instance with children "0", "1" (A, B) and a forward
        that runs them in turn, repeated n / k times, so one scan runs the whole pattern.

        When k does not divide n, the last n % k layers (pattern[0], pattern[1], ...) run once
        after the scan: the child is then `groups` (the scanned group) followed by `tail`.
        """
        k = len(pattern.layers)
        q, r = divmod(count.value, k)
        if q == 0:
            at = decl.value.args[0].span if _is_repeat_call(decl.value) else decl.value.span
            self.ctx.error_at_user_line(
                at,
                f"`repeat` count {count.value} is smaller than the pattern's {k} layers",
                f"a pattern runs whole at least once: repeat it at least {k} times, "
                "or repeat a single layer",
                scope,
                ast.names_in(decl.value),
                f"in child `{decl.name}` of the layer at `{scope.path}`",
            )
            return None
        child_path = (path if path.endswith("/") else path + "/") + decl.name
        camel = "".join(w.capitalize() for w in decl.name.split("_"))
        groups = (
            count if k == 1 else HValue(q, Binary(BinOp.FLOORDIV, _count_expr(count), Const(k)))
        )
        if r == 0:
            elements = self._elements(pattern.layers, child_path, scope, stack)
            if elements is None:
                return None
            return ir.Instance(
                child_path,
                decl.name,
                camel + "Pattern",
                (),
                (),
                elements,
                _pattern_forward(elements),
                decl.span,
                pattern.span,
                groups,
                pattern=True,
            )
        scanned = self._elements(pattern.layers, child_path + "/groups", scope, stack)
        tail = self._elements(pattern.layers[:r], child_path + "/tail", scope, stack)
        if scanned is None or tail is None:
            return None
        parts = (
            ir.Instance(
                child_path + "/groups",
                "groups",
                camel + "Group",
                (),
                (),
                scanned,
                _pattern_forward(scanned),
                decl.span,
                pattern.span,
                groups,
                pattern=True,
            ),
            ir.Instance(
                child_path + "/tail",
                "tail",
                camel + "Tail",
                (),
                (),
                tail,
                _pattern_forward(tail),
                decl.span,
                pattern.span,
                None,
                pattern=True,
            ),
        )
        return ir.Instance(
            child_path,
            decl.name,
            camel + "Pattern",
            (),
            (),
            parts,
            _pattern_forward(list(parts)),
            decl.span,
            pattern.span,
            None,
            pattern=True,
        )

    def _elements(
        self, layers: tuple[LayerValue, ...], path: str, scope: Scope, stack
    ) -> tuple[ir.Instance, ...] | None:
        """A pattern's layers as children "0", "1", ... of `path`; None when one failed
        (reported)."""
        out = [
            self.instantiate(
                self.program.layers[lv.layer],
                f"{path}/{i}",
                str(i),
                lv.span,
                set_exprs={},
                set_values=dict(lv.args),
                parent=scope,
                stack=stack,
                set_by=lv,
            )
            for i, lv in enumerate(layers)
        ]
        built = [e for e in out if e is not None and e.forward is not None]
        return tuple(built) if len(built) == len(out) else None


def _init_range(kind: InitKind, args: list[float]) -> tuple[str, str] | None:
    """(message, hint) when the arguments of a log-domain initializer have no value to take."""
    if kind is InitKind.LOG_ARANGE and args[0] <= 0:
        return (
            f"starts at log({args[0]:g}), which is not a number",
            "the start is > 0: `log_arange(1.0)`",
        )
    if kind is InitKind.DT_LOG_UNIFORM and not 0 < args[0] < args[1]:
        return (
            f"draws from [{args[0]:g}, {args[1]:g}], which is not a range of positive steps",
            "write `dt_log_uniform(low, high)` with 0 < low < high, as Mamba's `(0.001, 0.1)`",
        )
    return None


def _pattern_forward(elements) -> ir.Forward:
    """`x = 0(x, mem); x = 1(x, mem); return 2(x, mem)`: the signature of the first layer, whose
    first argument is carried through every layer and the others passed to each unchanged;
    infer_shapes checks that every layer agrees with it."""
    first = elements[0].forward
    args = first.args

    def call(inst: ir.Instance) -> ir.CallChild:
        refs = tuple(ir.Ref(a.name, RefKind.LOCAL, inst.span) for a in args)
        return ir.CallChild(inst.name, refs, inst.span)

    if not args:  # nothing to carry: the repeat's call reports it
        return ir.Forward(
            (), first.result, (ir.Ret(call(elements[0]), elements[0].span),), first.span
        )
    carry = args[0].name
    body: list[ir.Stmt] = [ir.Let(carry, call(e), None, e.span) for e in elements[:-1]]
    body.append(ir.Ret(call(elements[-1]), elements[-1].span))
    return ir.Forward(args, args[0].dims, tuple(body), first.span)


def _is_repeat_call(e: ast.Expr) -> TypeGuard[ast.Call]:
    return (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id == "repeat"
        and len(e.args) == 2
    )


def _count_expr(count: HValue) -> Expr:
    """A `repeat` count's expression (a count written in the spec always has one)."""
    return count.expr if count.expr is not None else Const(count.value)


def _value_source(v: HValue) -> str:
    """How a value without its spec text reads in a message: its expression, or the value."""
    return spec_text(v.expr) if v.expr is not None else value_text(v.value)


def _show(v) -> str:
    """A value for a message: as the spec writes it (`value_text`), layers by name only."""
    if isinstance(v, LayerValue):
        return f"`{v.layer}(...)`"
    if isinstance(v, PatternValue):
        return "`[" + ", ".join(f"{lv.layer}(...)" for lv in v.layers) + "]`"
    if isinstance(v, RepeatValue):
        inner = (
            _show(v.layer).strip("`")
            if isinstance(v.layer, PatternValue)
            else f"{v.layer.layer}(...)"
        )
        return f"`repeat({_show(v.count.value)}, {inner})`"
    return value_text(v)


MAX_PARAMS = 2**48  # see InstanceBuilder._check_param_count


def _param_count(inst: ir.Instance, copies: int = 1) -> int:
    """The parameters of `inst` and its children, each repeated layer counted `repeat` times."""
    if inst.repeat is not None and isinstance(inst.repeat.value, int):
        copies *= inst.repeat.value
    own = sum(math.prod(d.size or 1 for d in p.dims) for p in inst.params)
    return copies * own + sum(_param_count(c, copies) for c in inst.children)


def _show_type(t: ast.TypeRef) -> str:
    if t.name == "enum":
        return "enum(" + ", ".join(_show(o) for o in t.options) + ")"
    if t.bounds:
        return f"{t.name}(" + ", ".join(map(str, t.bounds)) + ")"
    return t.name
