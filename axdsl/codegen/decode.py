"""Emit the KV-cache decode path of a decoder LM's model.py: `init_cache`, `prefill`, `decode_step`.

Decoding runs the same layers over only the new tokens, at positions pos, pos + 1, ...: the whole
prompt once (prefill), then one token per step. Every layer that holds an attention call (or a
child that does) gets a `<layer>_decode` variant taking and returning its part of the cache; the
other layers are called as they are. What each primitive does there is its registry entry's
`decoding` (axdsl/primitives/base.py Decoding): attention reads and writes its cache slot, rope,
iota and prefix shift positions by `pos`, position-wise ops run unchanged, and a model with an op
that mixes positions without a cache (conv1d, ssd, cumsum over the sequence, a scan over time) gets
no decode path (`decode_problem` says why; `axdsl sample` then runs the full forward per token).

The cache mirrors the parameter tree: cache["blocks"]["attn"]["k"] is [layers, B, L, kv_heads,
head_dim] for a repeated block, so the decode scan carries it alongside the stacked parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from axdsl import primitives
from axdsl.codegen.expressions import FunctionEmitter, LayerFunction, dims_text, shape_comment
from axdsl.codegen.names import py_str
from axdsl.codegen.pyexpr import py_size, py_value
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import forward_exprs, prims_of
from axdsl.passes.annotate_sharding import activation_spec, spec_text
from axdsl.primitives.base import Decoding


@dataclass
class CacheRow:
    """One cache array: its path, shape code and (on a sharded target) mesh placement."""

    path: str
    shape: str
    spec: str


@dataclass
class DecodePath:
    """What the template needs: the decode functions (leaves first), the cache rows, the root's."""

    functions: list[LayerFunction]
    rows: list[CacheRow]
    root_fn: str
    dtype: str  # the cache's default dtype: the compute dtype

    def cache_tree(self, leaf) -> str:
        """The cache as a nested dict literal, each array written by `leaf(row)`."""
        tree: dict = {}
        for row in self.rows:
            *parents, name = row.path.split("/")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[name] = leaf(row)

        def text(node) -> str:
            if isinstance(node, str):
                return node
            return "{" + ", ".join(f"{py_str(k)}: {text(v)}" for k, v in node.items()) + ",}"

        return text(tree)


def sequence_dims(inst: ir.Instance) -> list[ir.Dim]:
    """The sequence dims of a layer's inputs: the free dim after the batch of each [B, S, ...]."""
    return [
        a.dims[1]
        for a in inst.forward.args
        if len(a.dims) >= 2 and a.dims[0].is_free and a.dims[1].is_free
    ]


def decode_problem(root: ir.Instance) -> str | None:
    """Why this model cannot decode over a KV cache, or None when it can."""
    for inst in root.walk():
        seqs = sequence_dims(inst)
        where = f" (in {inst.layer} at {inst.path})"
        for e in forward_exprs(inst):
            if isinstance(e, ir.CallChild) and e.over is not None:
                return "a scan over time" + where
            if not isinstance(e, ir.Prim):
                continue
            rule = primitives.get(e.name)
            if rule.decoding is Decoding.SEQUENCE:
                return f"`{e.name}`, which mixes positions without a cache" + where
            reason = rule.decode_check(e) if rule.decode_check else None
            if reason:
                return reason + where
            if rule.decoding is Decoding.POSITIONWISE:
                for name, value in e.attrs:
                    dim = getattr(value, "value", value)  # a DIM static is the ir.Dim itself
                    if isinstance(dim, ir.Dim) and any(dim.same(s) for s in seqs):
                        return f"`{e.name}` over the sequence dim ({name} = {dim.name})" + where
    return None


def _holds_cache(inst: ir.Instance) -> bool:
    return any(primitives.get(p.name).decoding is Decoding.CACHED for p in prims_of(inst)) or any(
        _holds_cache(c) for c in inst.children
    )


@dataclass
class DecodeEmitter(FunctionEmitter):
    """A layer's decode variant: `(cfg, params, *args, cache, pos) -> (y, new_cache)`."""

    cached_children: set[str] = field(default_factory=set)
    slots: list[tuple[str, ir.Prim]] = field(default_factory=list)  # (k slot, the attention call)
    seqs: list[ir.Dim] = field(default_factory=list)
    decoding = True

    def is_sequence(self, dim: ir.Dim) -> bool:
        return any(dim.same(s) for s in self.seqs)

    def cache_slot(self, prim: ir.Prim) -> tuple[str, str]:
        """The cache keys of this layer's next attention call: "k", "v", then "k2", "v2", ..."""
        n = len(self.slots) + 1
        suffix = "" if n == 1 else str(n)
        self.slots.append((f"k{suffix}", prim))
        return f"k{suffix}", f"v{suffix}"

    def emit_body(self) -> list[str]:
        self.own_aux = False  # decoding is inference: auxiliary losses are dropped
        self.needs_rng = {}  # and dropout is off (the layers' rng defaults to None)
        self.lines.append("new_cache = {}")
        body = super().emit_body()
        last = body[-1]
        code, _, comment = last.removeprefix("return ").partition("  # ")
        body[-1] = (
            f"return {code}, new_cache  # {comment}" if comment else f"return {code}, new_cache"
        )
        return body

    def _child_call(self, call: ir.CallChild, target: str) -> None:
        if call.child not in self.cached_children:
            if self.child_aux.get(call.child) and self.inst.child(call.child).repeat is None:
                args = ", ".join(self.expr(a)[0] for a in call.args)
                fn = self.child_fn[call.child]
                self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
                self.lines.append(
                    f"    {target}, _ = {fn}(cfg, params[{py_str(call.child)}], {args})"
                    f"  # {shape_comment(call.type)}"
                )
                return
            super()._child_call(call, target)
            return
        args = [self.expr(a)[0] for a in call.args]
        child = self.inst.child(call.child)
        fn, key = self.child_fn[call.child], py_str(call.child)
        comment = shape_comment(call.type)
        if child.repeat is None:
            self.lines.append(f"with jax.named_scope({key}):")
            self.lines.append(
                f"    {target}, new_cache[{key}] = {fn}(cfg, params[{key}], {', '.join(args)}, "
                f"cache[{key}], pos)  # {comment}"
            )
            return
        args = [args[0]] + [self._side_input(call.child, a) for a in args[1:]]
        step = self._fresh(f"{call.child if call.child.isidentifier() else 'layer'}_step")
        self.lines.append(
            f"def {step}(h, xs):  # one of {py_value(child.repeat)} stacked layers and its cache"
        )
        self.lines.append("    layer_params, layer_cache = xs")
        self.cast_layer()
        self._shard_carry(call.args[0].type)
        self.lines.append(
            f"    return {fn}(cfg, layer_params, {', '.join(['h', *args[1:]])}, layer_cache, pos)"
        )
        self.lines.append("")
        self.lines.append(f"with jax.named_scope({key}):")
        self.lines.append(
            f"    {target}, new_cache[{key}] = jax.lax.scan({step}, {args[0]}, "
            f"(params[{key}], cache[{key}]))  # {comment}"
        )


def decode_path(
    root: ir.Instance, functions: list, schedule: ir.Schedule | None, dim_axes: dict, letters
) -> DecodePath | None:
    """The decode functions and cache table of `root`, or None when `decode_problem` finds one."""
    if decode_problem(root) is not None or not _holds_cache(root):
        return None
    fn_of = {path: f.name for f in functions for path in f.paths}
    out: list[LayerFunction] = []
    rows: list[CacheRow] = []
    dtype = "cfg.dtype" if root.hparam("dtype") is not None else "jnp.float32"
    masters = ir.master_weight_paths(root)

    def visit(inst: ir.Instance, stack: list[str]) -> str:
        own_stack = stack + ([py_value(inst.repeat)] if inst.repeat is not None else [])
        child_fn = {c.name: fn_of[c.path] for c in inst.children}
        cached = set()
        for c in inst.children:
            if _holds_cache(c):
                child_fn[c.name] = visit(c, own_stack)
                cached.add(c.name)
        name = fn_of[inst.path] + "_decode"
        emitter = DecodeEmitter(
            inst,
            child_fn,
            {},
            False,
            schedule,
            dim_axes,
            letters=letters,
            child_aux={c.name: _returns_aux(c, functions, fn_of) for c in inst.children},
            cached_children=cached,
            seqs=sequence_dims(inst),
            master=inst.path in masters,
        )
        body = emitter.emit_body()
        for slot, prim in emitter.slots:
            base = (inst.path.strip("/") + "/") if inst.path != "/" else ""
            for key, operand in ((slot, prim.args[1]), ("v" + slot[1:], prim.args[2])):
                rows.append(_row(base + key, own_stack, operand, schedule, dim_axes))
        if any(f.name == name for f in out):
            return name
        args = ", ".join(f"{a.name}: jax.Array" for a in inst.forward.args)
        doc = (
            f"{inst.layer} over new tokens at positions pos, pos + 1, ...: (y "
            f"{dims_text(inst.forward.result)}, its updated cache).\n\n    "
            f"The decode path of `{fn_of[inst.path]}`; its cache is `cache`.\n    "
        )
        out.append(
            LayerFunction(
                name,
                inst.layer,
                f"{args}, cache: dict, pos: jax.Array",
                False,
                body,
                doc,
                [inst.path],
                False,
                emitter.imports,
                emitter.helpers,
            )
        )
        return name

    root_fn = visit(root, [])
    return DecodePath(out, rows, root_fn, dtype)


def _returns_aux(inst: ir.Instance, functions: list, fn_of: dict) -> bool:
    name = fn_of[inst.path]
    return next(f.aux for f in functions if f.name == name)


def _row(path: str, stack: list[str], operand: ir.TExpr, schedule, dim_axes: dict) -> CacheRow:
    """A cache array for one attention operand [B, S, heads, dim]: [*layers, batch, length, heads, dim]."""
    dims = operand.type.dims
    sizes = [py_size(d) for d in dims[2:]]
    shape = "(" + ", ".join([*stack, "batch", "length", *sizes]) + ")"
    spec = "None"
    if schedule is not None:
        logical = (None,) * len(stack) + tuple(dim_axes.get(d.name) for d in dims)
        spec = spec_text(activation_spec(schedule, logical))
    return CacheRow(path, shape, spec)
