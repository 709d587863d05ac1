"""Print the KV-cache decode path that plan_decode recorded: `<layer>_decode`, cache tables.

Decoding runs the same layers over only the new tokens, at positions pos, pos + 1, ...: the whole
prompt once (prefill), then one token per step. Every layer plan_decode lists in
`DecodePlan.cached` gets a `<layer>_decode` variant taking and returning its part of the cache;
the other layers are called as they are. Each primitive's emitter writes its decode form when
the emitter says `decoding` (axdsl/primitives/base.py Decoding). The cache arrays, their keys
and their mesh placement are the plan's (axdsl/passes/plan_decode.py); nothing is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from axdsl.codegen.expressions import FunctionEmitter, LayerFunction, dims_text, shape_comment
from axdsl.codegen.names import py_str, spec_text
from axdsl.codegen.pyexpr import py_size, py_value
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import CacheEntry, DecodePlan
from axdsl.ir.rewrite import sequence_dims


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
        self._shard_carry(child)
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
    root: ir.Instance, plan: DecodePlan, functions: list, schedule: ir.Schedule | None, letters
) -> DecodePath:
    """The decode functions of the layers `plan` lists as cached, and its cache table."""
    fn_of = {path: f.name for f in functions for path in f.paths}
    cached = set(plan.cached)
    out: list[LayerFunction] = []
    dtype = "cfg.dtype" if root.hparam("dtype") is not None else "jnp.float32"
    masters = ir.master_weight_paths(root)

    def visit(inst: ir.Instance) -> str:
        child_fn = {c.name: fn_of[c.path] for c in inst.children}
        for c in inst.children:
            if c.path in cached:
                child_fn[c.name] = visit(c)
        name = fn_of[inst.path] + "_decode"
        emitter = DecodeEmitter(
            inst,
            child_fn,
            {},
            False,
            schedule,
            letters=letters,
            child_aux={c.name: _returns_aux(c, functions, fn_of) for c in inst.children},
            cached_children={c.name for c in inst.children if c.path in cached},
            seqs=sequence_dims(inst),
            master=inst.path in masters,
        )
        body = emitter.emit_body()
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

    root_fn = visit(root)
    return DecodePath(out, [_row(e) for e in plan.cache], root_fn, dtype)


def _returns_aux(inst: ir.Instance, functions: list, fn_of: dict) -> bool:
    name = fn_of[inst.path]
    return next(f.aux for f in functions if f.name == name)


def _row(entry: CacheEntry) -> CacheRow:
    """A cache array [*layers, batch, length, heads, dim] for one attention operand."""
    stack = [py_value(h) for h in entry.stack]
    sizes = [py_size(d) for d in entry.dims[2:]]
    shape = "(" + ", ".join([*stack, "batch", "length", *sizes]) + ")"
    spec = spec_text(entry.sharding.mesh) if entry.sharding is not None else "None"
    return CacheRow(entry.path, shape, spec)
