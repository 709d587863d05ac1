"""Print the KV-cache decode path that plan_decode recorded: the layers' decode forms, the cache.

Decoding runs the same layers over only the new tokens, at positions pos, pos + 1, ...: the whole
prompt once (prefill), then one token per step. Every layer plan_decode lists in
`DecodePlan.cached` keeps its one function, which also takes `cache=None, pos=0`: statements whose
decode form differs (an attention call reading its cache slot, a child call passing its part of
the cache) run under `if cache is None:`, so the forward traces exactly as without a decode path.
The root's scan over stacked layers then carries the cache alongside their parameters. Each
primitive's emitter writes its decode form when the emitter says `decoding`
(axdsl/primitives/base.py Decoding). The cache arrays, their keys and their mesh placement are
the plan's (axdsl/passes/plan_decode.py); nothing is decided here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from axdsl.codegen.expressions import FunctionEmitter, LayerFunction, shape_comment
from axdsl.codegen.names import EinsumLetters, py_str, spec_text
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

    @property
    def key(self) -> str:
        """The path as a double-quoted literal, as in the formatted code around it."""
        return json.dumps(self.path)


@dataclass
class DecodePath:
    """What the template needs: the cache rows, the function prefill calls, what they need."""

    rows: list[CacheRow]
    root_fn: str
    dtype: str  # the cache's default dtype: the compute dtype
    imports: set[str] = field(default_factory=set)  # what the decode forms need
    helpers: set[str] = field(default_factory=set)


@dataclass
class DecodeEmitter(FunctionEmitter):
    """A layer's decode form: `(cfg, params, *args, cache, pos) -> (y, new_cache)`."""

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
        child = self.inst.expect_child(call.child)
        if call.child not in self.cached_children:
            if self.child_aux.get(call.child) and child.repeat is None:
                text = ", ".join(self.expr(a)[0] for a in call.args)
                fn = self.child_fn[call.child]
                self.lines.append(f"with jax.named_scope({py_str(call.child)}):")
                self.lines.append(
                    f"    {target}, _ = {fn}(cfg, params[{py_str(call.child)}], {text})"
                    f"  # {shape_comment(call.type)}"
                )
                return
            super()._child_call(call, target)
            return
        args = [self.expr(a)[0] for a in call.args]
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
    root: ir.Instance,
    plan: DecodePlan,
    functions: list[LayerFunction],
    schedule: ir.Schedule | None,
    letters: EinsumLetters,
    top: tuple[ir.Instance, LayerFunction],
) -> DecodePath:
    """The decode path of the layers `plan` lists as cached, and its cache table.

    Every cached layer shares its forward function: `merge` adds its decode form there (`cache`,
    `pos`). `top` is the root's part that decoding runs and its function: the root, or with a
    head split the root up to its head (`<root>_hidden`), whose scan then also carries the cache
    alongside the stacked parameters."""
    fn_of = {path: f.name for f in functions for path in f.paths}
    by_name = {f.name: f for f in functions}
    cached = set(plan.cached)
    dtype = "cfg.dtype" if root.hparam("dtype") is not None else "jnp.float32"
    masters = ir.master_weight_paths(root)
    imports: set[str] = set()
    helpers: set[str] = set()

    def emit(inst: ir.Instance) -> DecodeEmitter:
        emitter = DecodeEmitter(
            inst,
            {c.name: fn_of[c.path] for c in inst.children},
            {},
            False,
            schedule,
            letters=letters,
            child_aux={c.name: by_name[fn_of[c.path]].aux for c in inst.children},
            cached_children={c.name for c in inst.children if c.path in cached},
            seqs=sequence_dims(inst),
            master=inst.path in masters,
        )
        emitter.emit_body()
        imports.update(emitter.imports)
        helpers.update(emitter.helpers)
        return emitter

    for inst in root.walk():
        fn = by_name[fn_of[inst.path]]
        if inst is not root and inst.path in cached and not fn.decodes:
            merge(fn, emit(inst))
    top_inst, top_fn = top
    merge(top_fn, emit(top_inst))
    rows = [_row(e) for e in plan.cache]
    return DecodePath(rows, top_fn.name, dtype, imports, helpers)


def merge(fn: LayerFunction, decode: DecodeEmitter) -> None:
    """Make `fn` serve the decode path too: with `cache` it runs `decode`'s form and returns
    (y, the updated cache). Statements the same in both forms are written once; the others run
    under `if cache is None:`, so the forward (cache None, pos 0) traces exactly as before."""
    train, dec = fn.chunks, decode.chunks()
    assert len(train) == len(dec) and dec[0] == ["new_cache = {}", *train[0]], fn.name
    body = list(dec[0])
    for t, d in zip(train[1:-1], dec[1:-1], strict=True):
        body += t if t == d else _branch(t, d)
    *t_last, _ = train[-1]
    *d_last, ret = dec[-1]
    body += t_last if t_last == d_last else _branch(t_last, d_last)
    trained = f"({fn.result})" if fn.aux else fn.result
    comment = ret.partition("  # ")[2]
    body.append(
        f"return {trained} if cache is None else ({decode.result}, new_cache)"
        + (f"  # {comment}" if comment else "")
    )
    fn.body = body
    fn.args += ", cache: dict | None = None, pos: jax.Array | int = 0"
    fn.doc = (
        fn.doc.rstrip()
        + f"\n    With `cache` (decoding), {decode.inst.fwd.args[0].name} holds new tokens at"
        " positions pos, pos + 1, ...:\n    returns (y, the updated cache).\n    "
    )
    fn.decodes = True


def _branch(train: list[str], decode: list[str]) -> list[str]:
    """`if cache is None:` train `else:` decode, around only the top-level statements that
    differ, and inside the block opener both share (say a `with jax.named_scope(...):`)."""
    t, d = _blocks(train), _blocks(decode)
    while t and d and t[0] == d[0]:
        t, d = t[1:], d[1:]
    tail: list[list[str]] = []
    while t and d and t[-1] == d[-1]:
        tail.insert(0, t.pop())
        d = d[:-1]
    head = train[: len(train) - sum(map(len, t)) - sum(map(len, tail))]
    if len(t) == len(d) == 1 and t[0][0] == d[0][0] and t[0][0].endswith(":"):
        inner = _branch([line[4:] for line in t[0][1:]], [line[4:] for line in d[0][1:]])
        middle = [t[0][0], *_indent(inner)]
    else:
        flat = lambda blocks: [line for block in blocks for line in block]  # noqa: E731
        middle = ["if cache is None:", *_indent(flat(t))]
        middle += ["else:", *_indent(flat(d))] if d else []
    return [*head, *middle, *(line for block in tail for line in block)]


def _blocks(lines: list[str]) -> list[list[str]]:
    """The top-level statements of unindented `lines`, each with the lines nested in it."""
    out: list[list[str]] = []
    for line in lines:
        if out and (not line or line.startswith(" ") or line.startswith(")")):
            out[-1].append(line)
        else:
            out.append([line])
    return out


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else "" for line in lines]


def _row(entry: CacheEntry) -> CacheRow:
    """A cache array [*layers, batch, length, heads, dim] for one attention operand."""
    stack = [py_value(h) for h in entry.stack]
    sizes = [py_size(d) for d in entry.dims[2:]]
    shape = "(" + ", ".join([*stack, "batch", "length", *sizes]) + ")"
    spec = spec_text(entry.sharding.mesh) if entry.sharding is not None else "None"
    return CacheRow(entry.path, shape, spec)
