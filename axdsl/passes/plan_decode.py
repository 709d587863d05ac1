"""plan_decode: the KV-cache decode path of a next-token LM, or why it has none.

    model lm > / : DecoderLM                  ->    decode: cached /blocks/attn, /blocks, /
      /blocks : Block x2                              cache blocks/attn/k: [layers=2] + [B, S,
        /blocks/attn : Attention                        kv_heads=1, head_dim=16] shard(...)
                                                      cache blocks/attn/v: ...

Decoding runs the same layers over only the new tokens, at positions pos, pos + 1, ...: the whole
prompt once (prefill), then one token per step. Every layer that holds an attention call (or a
child that does) takes and returns its part of the cache; the other layers run as they are. What
each primitive does there is its registry entry's `decoding` (axdsl/primitives/base.py Decoding):
attention reads and writes its cache slot, rope, iota and prefix shift positions by `pos`,
position-wise ops run unchanged, and a model with an op that mixes positions without a cache
(conv1d, ssd, cumsum over the sequence, a scan over time) gets no decode path: `problem` says why
(`axdsl sample` then runs the full forward per token).

The cache mirrors the parameter tree: cache["blocks"]["attn"]["k"] is [layers, B, L, kv_heads,
head_dim] for a repeated block, so the decode scan carries it alongside the stacked parameters;
each attention call of a layer has the keys `k`, `v`, then `k2`, `v2`, ... in forward order. On
a target with a mesh each array is placed as its attention operand is (shard_activations).
"""

from __future__ import annotations

from dataclasses import replace

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.head import has_lm_signature
from axdsl.ir.nodes import CacheEntry, DecodePlan
from axdsl.ir.rewrite import forward_exprs, prims_of, sequence_dims
from axdsl.objectives import objective_name
from axdsl.ir.axes import dim_axes
from axdsl.passes.shard_activations import placement
from axdsl.primitives.base import Decoding


def plan_decode(module: ir.Module) -> ir.Module:
    if objective_name(module) != "next_token":
        return module
    models = []
    for model in module.models:
        plan = None
        if has_lm_signature(model.root):
            plan = decode_plan(model.root, module.schedule)
        models.append(replace(model, decode=plan))
    return replace(module, models=tuple(models))


def decode_plan(root: ir.Instance, schedule: ir.Schedule | None) -> DecodePlan | None:
    """The layers that carry a cache and the cache's arrays; None for a model without attention
    (nothing to cache, so nothing to say)."""
    problem = decode_problem(root)
    if problem is not None:
        return DecodePlan(problem)
    if not holds_cache(root):
        return None
    axes = dim_axes(root)
    cached: list[str] = []
    cache: list[CacheEntry] = []

    def visit(inst: ir.Instance, stack: tuple[ir.HValue, ...]) -> None:
        own = stack + ((inst.repeat,) if inst.repeat is not None else ())
        for c in inst.children:
            if holds_cache(c):
                visit(c, own)
        base = (inst.path.strip("/") + "/") if inst.path != "/" else ""
        calls = [p for p in prims_of(inst) if primitives.get(p.name).decoding is Decoding.CACHED]
        for n, prim in enumerate(calls, start=1):
            suffix = "" if n == 1 else str(n)
            for key, operand in ((f"k{suffix}", prim.args[1]), (f"v{suffix}", prim.args[2])):
                dims = ir.tensor_type(operand).dims
                shard = placement(schedule, dims, axes, len(own)) if schedule else None
                cache.append(CacheEntry(base + key, own, dims, shard))
        cached.append(inst.path)

    visit(root, ())
    return DecodePlan(None, tuple(cached), tuple(cache))


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


def holds_cache(inst: ir.Instance) -> bool:
    """Whether this layer or one below it calls a primitive that decodes over a cache."""
    own = any(primitives.get(p.name).decoding is Decoding.CACHED for p in prims_of(inst))
    return own or any(holds_cache(c) for c in inst.children)
