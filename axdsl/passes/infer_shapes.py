"""infer_shapes: give every forward expression a type and check that shapes agree.

Dims are concrete sizes (from hyperparameters) or free dims (`B`, `S`) bound by a forward's
arguments; `...` stands for any leading dims. Child calls are checked against the child's declared
signature, so each forward is checked on its own and errors point at the offending expression.

    y = x @ w_gate            Let y = Bin(@, x: [B, S, dim=64], w_gate: [dim=64, hidden=128])
                        ->                                   : [B, S, hidden=128]
"""

from __future__ import annotations

from dataclasses import replace
from typing import NoReturn

from axdsl import primitives
from axdsl.errors import Diagnostics, Span, filled, is_library, relocated
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import ELLIPSIS, Dim, RefKind, ScalarType, TensorType
from axdsl.ir.rewrite import prims_of


class _ShapeError(Exception):
    pass


def infer_shapes(module: ir.Module) -> ir.Module:
    """Type every forward expression; shape mismatches are located errors, raised together."""
    diags = Diagnostics()
    models = tuple(
        replace(m, root=_instance(m.root, diags, {i.path: i for i in m.root.walk()}))
        for m in module.models
    )
    diags.raise_if_any()
    return replace(module, models=models)


def _instance(inst: ir.Instance, diags: Diagnostics, tree: dict[str, ir.Instance]) -> ir.Instance:
    """`tree` maps every path of the model to its (untyped) instance, to trace inherited values."""
    children = tuple(_instance(c, diags, tree) for c in inst.children)
    inst = replace(inst, children=children)
    if inst.forward is None:
        return inst
    return replace(inst, forward=_Typer(inst, diags, tree).forward(inst.forward))


def _blame_order(names: list[str], message: str) -> list[str]:
    """Names the message mentions first, the last-mentioned first (`a` is not a multiple of `b`
    blames `b`), then the rest in operand order."""

    def last(n: str) -> int:
        return max(message.rfind(f"`{n}"), message.rfind(f" {n}="))

    mentioned = sorted((n for n in dict.fromkeys(names) if last(n) >= 0), key=last, reverse=True)
    return mentioned + [n for n in dict.fromkeys(names) if n not in mentioned]


def fmt(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def unify(
    decl: tuple[Dim, ...], actual: tuple[Dim, ...], binding: dict[str, tuple[Dim, ...]]
) -> str | None:
    """Match actual dims against a declared signature, extending `binding`; return an error or
    None."""
    has_ellipsis = bool(decl) and decl[0].is_ellipsis
    fixed = decl[1:] if has_ellipsis else decl
    if has_ellipsis:
        if len(actual) < len(fixed) and not (actual and actual[0].is_ellipsis):
            return f"expected at least {len(fixed)} dims {fmt(decl)}, got {fmt(actual)}"
        prefix, rest = actual[: len(actual) - len(fixed)], actual[len(actual) - len(fixed) :]
        if "..." in binding and binding["..."] != prefix:
            return f"leading dims {fmt(prefix)} differ from {fmt(binding['...'])}"
        binding["..."] = prefix
    else:
        if any(d.is_ellipsis for d in actual):
            return f"expected exactly {fmt(decl)}, got {fmt(actual)} of unknown rank"
        if len(actual) != len(decl):
            return f"expected {len(decl)} dims {fmt(decl)}, got {len(actual)} dims {fmt(actual)}"
        rest = actual
    for d, a in zip(fixed, rest, strict=False):  # fewer when `actual` has an unknown rank
        if d.is_free:
            bound = binding.get(d.name)
            if bound is None:
                binding[d.name] = (a,)
            elif not bound[0].same(a):
                return f"dim `{d.name}` is {bound[0]} in one place and {a} in another"
        elif not d.same(a):
            return f"expected {fmt(decl)}, got {fmt(actual)}: `{d}` does not match `{a}`"
    return None


def _caller_named(result: tuple[Dim, ...], decls, args) -> tuple[Dim, ...]:
    """A child's declared result with each sized dim that also sizes one of its arguments named as
    the caller's matching dim: a norm over `[..., dim]` applied to `[B, S, heads, head_dim]`
    returns `[B, S, heads, head_dim]`, not `[..., dim]` in the child's words (same sizes)."""
    names: dict[str, Dim] = {}
    for decl, a in zip(decls, args, strict=True):
        fixed = decl.dims[1:] if decl.dims and decl.dims[0].is_ellipsis else decl.dims
        actual = a.type.dims[len(a.type.dims) - len(fixed) :] if fixed else ()
        for d, got in zip(fixed, actual, strict=False):  # an argument may have fewer dims
            if d.size is not None and got.size == d.size and not got.is_ellipsis:
                names.setdefault(d.name, got)
    return tuple(
        names.get(d.name, d) if d.size is not None and not d.is_ellipsis else d for d in result
    )


def substitute(dims: tuple[Dim, ...], binding: dict[str, tuple[Dim, ...]]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for d in dims:
        if d.is_ellipsis:
            out.extend(binding.get("...", (ELLIPSIS,)))
        elif d.is_free and d.name in binding:
            out.extend(binding[d.name])
        else:
            out.append(d)
    return tuple(out)


class _Typer:
    def __init__(
        self, inst: ir.Instance, diags: Diagnostics, tree: dict[str, ir.Instance] | None = None
    ):
        self.inst = inst
        self.diags = diags
        self.tree = tree or {inst.path: inst}
        self.env: dict[str, ir.Type | None] = {}
        self.reads: list[str] = []  # hyperparameters the expression being typed reads (its dims)

    def fail(self, span: Span, message: str, hint: str | None = None) -> NoReturn:
        self.error(span, message, hint)
        raise _ShapeError()

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        """Record an error; one inside a library layer also says which instance it is in, and is
        shown at the user's line that set a value it reads (with a note for the library line)."""
        if not is_library(span):
            self.diags.error(span, message, hint)
            return
        message += f" (in `{self.inst.path}`, layer `{self.inst.layer}`)"
        names = _blame_order(self.reads, message)
        user = ir.user_line(names, lambda n: ir.hparam_origins(self.tree, self.inst.path, n))
        self.diags.add(
            relocated(
                span, message, hint, user, f"in layer `{self.inst.layer}` at `{self.inst.path}`"
            )
        )

    def forward(self, fwd: ir.Forward) -> ir.Forward:
        for a in fwd.args:
            self.env[a.name] = TensorType(a.dims)
        body: list[ir.Stmt] = []
        for stmt in fwd.body:
            try:
                value = self.expr(stmt.value)
            except _ShapeError:
                return fwd
            if isinstance(stmt, ir.Let):
                if not isinstance(value.type, TensorType):
                    # a scalar local is fine (e.g. a scale), it just has no dims
                    pass
                self.env[stmt.name] = value.type
                body.append(replace(stmt, value=value))
            else:
                body.append(replace(stmt, value=value))
                self._check_result(fwd, value, stmt.span)
        return replace(fwd, body=tuple(body))

    def _check_result(self, fwd: ir.Forward, value: ir.TExpr, span) -> None:
        if not isinstance(value.type, TensorType):
            self.error(
                value.span,
                f"forward of `{self.inst.layer}` must return a tensor, got a {value.type}",
            )
            return
        binding: dict[str, tuple[Dim, ...]] = {}
        for a in fwd.args:  # the forward's own free dims stand for themselves
            for d in a.dims:
                if d.is_free:
                    binding[d.name] = (d,)
        if fwd.args and fwd.args[0].dims and fwd.args[0].dims[0].is_ellipsis:
            binding["..."] = (ELLIPSIS,)
        err = unify(fwd.result, value.type.dims, binding)
        if err:
            detail = err.split(": ", 1)[1] if err.startswith("expected [") and ": " in err else err
            self.error(
                value.span,
                f"forward of `{self.inst.layer}` returns {fmt(value.type.dims)} but declares "
                f"{fmt(fwd.result)}",
                detail,
            )

    # ---------------------------------------------------------------- expressions
    def expr(self, e: ir.TExpr) -> ir.TExpr:
        method = getattr(self, "_" + type(e).__name__)
        return replace(e, **method(e))

    def _Ref(self, e: ir.Ref) -> dict:
        if e.kind in (RefKind.LOCAL, RefKind.ARG):
            return {"type": self.env[e.name]}
        if e.kind is RefKind.PARAM:
            return {"type": TensorType(self.inst.expect_param(e.name).dims)}
        if e.kind is RefKind.CHILD_PARAM:
            return {"type": TensorType(self.inst.expect_child(e.owner).expect_param(e.name).dims)}
        if e.kind is RefKind.DIM:
            return {"type": ScalarType("int")}
        value = filled(e.value, f"the value of {e.name}", "resolve")
        return {"type": ScalarType(_scalar_kind(value.value))}

    def _Lit(self, e: ir.Lit) -> dict:
        return {"type": ScalarType(_scalar_kind(e.value))}

    def _Neg(self, e: ir.Neg) -> dict:
        operand = self.expr(e.operand)
        return {"operand": operand, "type": operand.type}

    def _Bin(self, e: ir.Bin) -> dict:
        left, right = self.expr(e.left), self.expr(e.right)
        self.reads = _dim_names((left, right))
        t: ir.Type
        if e.op == "@":
            t = self._matmul(e, left.type, right.type)
        else:
            t = self._broadcast(e, left.type, right.type)
        return {"left": left, "right": right, "type": t}

    def _matmul(self, e, lt, rt) -> TensorType:
        if not (isinstance(lt, TensorType) and isinstance(rt, TensorType)):
            self.fail(e.span, "`@` needs two tensors")
        if len(rt.dims) < 1 or not lt.dims:
            self.fail(e.span, "`@` needs tensors with at least one dim")
        a, b = lt.dims[-1], rt.dims[0]
        if a.is_ellipsis or b.is_ellipsis or not a.same(b):
            self.fail(
                e.span,
                f"matmul dims do not agree: last dim of the left operand is `{a}` "
                f"but first dim of the right operand is `{b}`",
                f"left is {fmt(lt.dims)}, right is {fmt(rt.dims)}; "
                "`@` contracts left's last dim with right's first",
            )
        return TensorType(lt.dims[:-1] + rt.dims[1:])

    def _broadcast(self, e, lt, rt) -> ir.Type:
        if isinstance(lt, ScalarType) and isinstance(rt, ScalarType):
            return ScalarType("float" if "float" in (lt.kind, rt.kind) else lt.kind)
        if isinstance(lt, ScalarType):
            return rt
        if isinstance(rt, ScalarType):
            return lt
        a, b = list(lt.dims), list(rt.dims)
        out: list[Dim] = []
        while a and b:
            x, y = a.pop(), b.pop()
            if x.is_ellipsis or y.is_ellipsis:
                if x.is_ellipsis and y.is_ellipsis and not a and not b:
                    out.append(ELLIPSIS)
                    break
                self.fail(
                    e.span,
                    f"cannot broadcast {fmt(lt.dims)} with {fmt(rt.dims)}: ranks are not known",
                )
            if x.same(y):
                out.append(x)
            elif x.size == 1:
                out.append(y)
            elif y.size == 1:
                out.append(x)
            else:
                self.fail(
                    e.span,
                    f"shapes do not agree for `{e.op}`: {fmt(lt.dims)} and {fmt(rt.dims)}",
                    f"`{x}` and `{y}` differ; residual and elementwise operands must match or be 1",
                )
        rest = a or b
        return TensorType(tuple(rest) + tuple(reversed(out)))

    def _CallChild(self, e: ir.CallChild) -> dict:
        args = tuple(self.expr(a) for a in e.args)
        self.reads = _dim_names(args)
        child = self.inst.expect_child(e.child)
        fwd = child.fwd  # the builder reports a layer without a forward
        if self.inst.pattern:
            return {"args": args, "type": TensorType(self._pattern_element(e, child, args))}
        if e.over is not None:
            return {"args": args, "type": TensorType(self._scan(e, child, args))}
        if len(args) != len(fwd.args):
            self.fail(
                e.span, f"child `{e.child}` takes {len(fwd.args)} argument(s), got {len(args)}"
            )
        binding: dict[str, tuple[Dim, ...]] = {}
        for a, decl in zip(args, fwd.args, strict=True):
            if not isinstance(a.type, TensorType):
                self.fail(a.span, f"argument `{decl.name}` of `{e.child}` must be a tensor")
            err = unify(decl.dims, a.type.dims, binding)
            if err:
                self.fail(a.span, f"argument `{decl.name}` of `{e.child}` ({child.layer}): {err}")
        result = substitute(_caller_named(fwd.result, fwd.args, args), binding)
        if child.repeat is not None:
            self._check_repeated(e, child, args, result)
        return {"args": args, "type": TensorType(result)}

    def _check_repeated(self, e: ir.CallChild, child: ir.Instance, args, result) -> None:
        """What a scan can run: the first argument is the carry, which each layer returns in the
        same shape; the other arguments are side inputs, passed unchanged to every layer."""
        if not args:
            self.fail(
                e.span,
                f"repeated child `{e.child}` takes no tensor, so there is nothing to carry "
                "from layer to layer",
                "a repeated layer's first argument is the carry: "
                "`forward(x: [...]) -> [...]` returning x's shape",
            )
        if not _same_dims(result, args[0].type.dims):
            sides = [a.name for a in child.fwd.args[1:]]
            hint = "the first argument is carried from layer to layer; " + (
                f"{', '.join(f'`{n}`' for n in sides)} "
                f"{'is a side input' if len(sides) == 1 else 'are side inputs'}, "
                "the same for every layer"
                if sides
                else "a layer's output is the next layer's input"
            )
            self.fail(
                e.span,
                f"a repeated block must return the shape it takes: {fmt(args[0].type.dims)} "
                f"-> {fmt(result)}",
                hint,
            )

    def _scan(self, e: ir.CallChild, child: ir.Instance, args) -> tuple[Dim, ...]:
        """`scan(cell, x, over = S)`: the cell takes (carry, one step of each input) and returns
        the carry; the result stacks the carry of every step along S, where S is in the first input.
        A later input without S is a side input, passed whole to every step."""
        over = e.over
        assert over is not None  # _CallChild types a scan (`over` set) here
        fwd = child.fwd
        init = args[0] if e.scan_init else None
        xs = args[1:] if e.scan_init else args
        if len(fwd.args) != len(xs) + 1:
            self.fail(
                e.span,
                f"`scan` runs `{e.child}` ({child.layer}) with a carry and {len(xs)} input(s), but "
                f"it takes {len(fwd.args)} argument(s)",
                "a scanned cell's forward is (carry, one step of each input) -> carry",
            )
        for a in args:
            if not isinstance(a.type, TensorType):
                self.fail(a.span, f"the inputs of `scan` are tensors, got a {a.type}")
        if _prims_with(child, "aux_loss"):
            self.fail(
                e.span,
                f"`{e.child}` returns an auxiliary loss (MoE), which `scan` cannot run yet",
                "scan a cell without MoE",
            )
        binding: dict[str, tuple[Dim, ...]] = {}
        axes = []
        for k, (a, decl) in enumerate(zip(xs, fwd.args[1:], strict=True)):
            axis = _axis_of(a.type.dims, over)
            several = any(d.same(over) for d in a.type.dims)
            if axis is None and (k == 0 or several):
                self.fail(
                    a.span,
                    f"`scan` over `{e.over}`: input {fmt(a.type.dims)} has no dim `{e.over}`"
                    + (" (or several)" if several else ""),
                    "`over` names a dim of the first input, the dim the steps run along (a later "
                    "input without it is passed whole to every step)",
                )
            axes.append(axis)
            if axis is None:  # a side input: every step reads all of it
                err = unify(decl.dims, a.type.dims, binding)
                if err:
                    self.fail(
                        a.span,
                        f"`{decl.name}` of `{e.child}` ({child.layer}), "
                        f"the same at every step: {err}",
                    )
                continue
            step = a.type.dims[:axis] + a.type.dims[axis + 1 :]
            err = unify(decl.dims, step, binding)
            if err:
                self.fail(
                    a.span, f"one step of `{decl.name}` of `{e.child}` ({child.layer}): {err}"
                )
        if init is not None:
            err = unify(fwd.args[0].dims, init.type.dims, binding)
            if err:
                self.fail(
                    init.span, f"`init` is the carry `{fwd.args[0].name}` of `{e.child}`: {err}"
                )
            carry = init.type.dims
        else:
            carry = substitute(fwd.args[0].dims, binding)
            if any(d.is_free and d.name not in binding or d.is_ellipsis for d in fwd.args[0].dims):
                self.fail(
                    e.span,
                    f"the carry `{fwd.args[0].name}` {fmt(fwd.args[0].dims)} of `{e.child}` has "
                    "dims the inputs do not fix, so it cannot start at zeros",
                    "give `init = ...`",
                )
        result = substitute(fwd.result, binding)
        if not _same_dims(result, carry):
            self.fail(
                e.span,
                f"`{e.child}` returns {fmt(result)} but takes its carry as {fmt(carry)}",
                "a scanned cell returns the next carry, in the carry's shape",
            )
        first = axes[0]
        assert first is not None  # the first input has the dim: checked at k == 0 above
        at = min(first, len(result))
        return result[:at] + (xs[0].type.dims[first],) + result[at:]

    def _pattern_element(self, e: ir.CallChild, child: ir.Instance, args) -> tuple[Dim, ...]:
        """One layer of a repeated pattern (`self.inst` is its group): it takes the carry and the
        side inputs as the pattern's first layer takes them, and returns the carry's shape."""
        first = self.inst.children[0]
        fwd = child.fwd
        name = lambda c: f"pattern element {c.name} (`{c.layer}`)"  # noqa: E731
        if not self.inst.fwd.args:
            if first.pattern:  # `groups` then `tail`: the layers inside already said it
                raise _ShapeError()
            self.fail(
                e.span,
                f"{name(first)} takes no tensor, so there is nothing to carry from layer to layer",
                "a repeated layer's first argument is the carry: `forward(x: [...]) -> [...]` "
                "returning x's shape",
            )
        if len(args) != len(fwd.args):
            self.fail(
                e.span,
                f"{name(child)} takes {len(fwd.args)} tensor(s), but {name(first)} takes "
                f"{len(args)}",
                "every layer of a pattern gets the same carry and side inputs",
            )
        binding: dict[str, tuple[Dim, ...]] = {}
        for i, (a, decl) in enumerate(zip(args, fwd.args, strict=True)):
            err = unify(decl.dims, a.type.dims, binding)
            if err:
                what = "the carry" if i == 0 else f"side input `{first.fwd.args[i].name}`"
                self.fail(
                    e.span,
                    f"{name(child)} takes {what} as {fmt(decl.dims)}, but {name(first)} "
                    f"takes it as {fmt(first.fwd.args[i].dims)}",
                    (
                        "a side input is passed unchanged to every layer, "
                        "so every layer of the pattern must take it in one shape"
                        if i
                        else err
                    ),
                )
        result = substitute(fwd.result, binding)
        carry = self.inst.fwd.args[0].dims
        if not _same_dims(result, carry):
            self.fail(
                e.span,
                f"{name(child)} returns {fmt(result)}, but the carry is {fmt(carry)}",
                "every layer of a repeated pattern returns the shape it takes",
            )
        return result

    def _Prim(self, e: ir.Prim) -> dict:
        """Type the operands, then apply the primitive's own shape rule (axdsl/primitives/)."""
        args = tuple(self.expr(a) for a in e.args)
        prim = primitives.get(e.name)
        self.reads = list(e.reads) + _dim_names(args)
        for a in args:
            if not isinstance(a.type, TensorType) and not prim.scalar_operands:
                self.fail(a.span, f"`{e.name}` needs a tensor, got a {a.type}")
        return {"args": args, "type": TensorType(prim.shape(self, e, args))}


def _axis_of(dims: tuple[Dim, ...], over: Dim) -> int | None:
    """The one position of `over` in `dims` (a free dim by name, else by size), or None."""
    found = [i for i, d in enumerate(dims) if not d.is_ellipsis and d.same(over)]
    return found[0] if len(found) == 1 else None


def _prims_with(inst: ir.Instance, flag: str) -> bool:
    """Whether `inst` or a layer below it calls a primitive whose registry entry sets `flag`."""
    return any(getattr(primitives.get(p.name), flag) for i in inst.walk() for p in prims_of(i))


def _dim_names(operands) -> list[str]:
    """The dim names of typed operands, in order: the hyperparameters an error may blame."""
    return [d.name for a in operands if isinstance(a.type, TensorType) for d in a.type.dims]


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(x.same(y) for x, y in zip(a, b, strict=True))


def _scalar_kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "dtype"
