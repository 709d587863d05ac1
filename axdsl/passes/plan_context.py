"""plan_context: check a target's context(...) against the model and record how it runs.

    target "tpu-v5e-*" { mesh(seq = 4, fsdp = -1)  context(strategy = "ring") }

Context parallelism splits the sequence over the `seq` mesh axis. Every attention call of the
forward then runs on each shard's queries inside jax.shard_map (codegen prints
`context_parallel(...)`, kernels/context.py): `all_gather` gathers the keys and values once per
layer, `ring` passes key/value blocks around the shards with an online softmax, a fixed block
of keys at a time. Everything else the layers compute is position-wise or left to GSPMD, as the
`seq -> seq` rule already does.

Under `all_gather` the kernel select_kernels chose (it runs before this pass) runs on each
shard's queries: xla, vjp and cudnn given the mask of the tokens' original positions, splash as
`splash_context_attention(...)` (kernels/splash.py), its static mask built over the whole
sequence in run order and cut into rows per shard. Under `ring` no kernel runs (the ring is its
own attention), so select_kernels does not choose splash or cudnn there
(primitives/attention.py `_context_violations` says why).

`balance` runs the layers over the sequence in zig-zag order (MaxText's and torchtitan's load
balancing): the root reorders its [B, S] inputs once and puts its result back, RoPE and the
attention masks read the tokens' original positions, and every shard gets the same causal work.
Unset, it is true exactly when every attention call is causal, the only case where it changes
the work. It is a schedule: the loss is the same up to float rounding.

What cannot run is a located error at the directive, with a note at the model's line:
- the `seq` mesh axis has one shard, or the rules do not map `seq` to it;
- an attention with an explicit mask or additive bias (T5's relative bias): they are [S, S]
  operands a shard would have to slice by its positions;
- ring attention with a soft cap (the ring's online softmax has none);
- balance with a primitive that reads positions in order (learned position tables, convolutions,
  state-space scans) or a root whose result is not per position;
- a train sequence that does not split over the shards (twice as many chunks when balanced).

The decode path (KV cache) is unchanged: it attends over a cache, one new token at a time.
The resolved policy, with `balance` decided and the shard count, replaces the schedule's.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl import primitives
from axdsl.errors import Diagnostic, Diagnostics, Note, Span, filled
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import prims_of
from axdsl.passes.configure_target import TargetDirective, axis_shards
from axdsl.passes.fit_remat import sized_seq

CONTEXT_AXIS = "seq"  # the mesh axis context parallelism splits the sequence over


def plan_context(module: ir.Module) -> ir.Module:
    sched = module.schedule
    if sched is None or sched.context.value is None:
        return module
    policy: ir.ContextPolicy = sched.context.value
    at = module.report_at(sched.context.span)
    diags = Diagnostics()
    shards = _shards(sched, at, diags)
    calls = [(p, inst) for m in module.models for inst in m.root.walk() for p in prims_of(inst)]
    split = [p for p, _ in calls if primitives.get(p.name).context_check is not None]
    for prim in split:
        _check_split(prim, policy, at, diags)
    balance = policy.balance
    if balance is None:  # the zig-zag order evens out causal work, and changes nothing else
        balance = bool(split) and all(p.attr("causal").value for p in split)
    if balance:
        _check_reorderable(module, calls, at, diags)
    _check_seq(module, shards * (2 if balance else 1), balance, at, diags)
    diags.raise_if_any()
    resolved = replace(policy, balance=balance, shards=shards)
    return replace(module, schedule=replace(sched, context=replace(sched.context, value=resolved)))


def _shards(sched: ir.Schedule, at: Span, diags: Diagnostics) -> int:
    """The `seq` mesh axis's size, which must be above 1 and be where `seq` activations go."""
    shards = axis_shards(sched, CONTEXT_AXIS, TargetDirective.CONTEXT, "the sequence", at, diags)
    if CONTEXT_AXIS not in sched.rule("seq"):
        diags.error(
            at,
            "context(...) needs the sequence's activations on the `seq` mesh axis, but the rule "
            f"for seq is ({', '.join(sched.rule('seq'))})",
            "add rules(seq = seq) to this target block",
        )
    return shards


def _check_split(prim: ir.Prim, policy: ir.ContextPolicy, at: Span, diags: Diagnostics) -> None:
    """A call that runs per shard (its registry entry's context_check) must be able to."""
    check = filled(primitives.get(prim.name).context_check, "a context_check", "the registry")
    why = check(prim, policy)
    if why is not None:
        diags.add(
            Diagnostic(
                at,
                f"context parallelism cannot split {why}",
                "remove context(...) from this target block, or change the model's line below",
                (Note(prim.span, f"the `{prim.name}` call"),),
            )
        )


def _check_reorderable(
    module: ir.Module, calls: list[tuple[ir.Prim, ir.Instance]], at: Span, diags: Diagnostics
) -> None:
    """balance: only position-wise primitives and those given the tokens' positions
    (`takes_positions`) may run, and the root must map [B, S, ...] inputs to a [B, S, ...]
    result, which it puts back in order."""
    for prim, inst in calls:
        if (
            prim.decoding is not ir.Decoding.POSITIONWISE
            and not primitives.get(prim.name).takes_positions
        ):
            diags.add(
                Diagnostic(
                    at,
                    f"context(balance = true) runs the sequence in zig-zag order, but "
                    f"`{prim.name}` in {inst.layer} reads positions in their order",
                    "use context(balance = false): the sequence stays in order, split in "
                    "contiguous pieces",
                    (Note(prim.span, f"`{prim.name}` is here"),),
                )
            )
            return
    for model in module.models:
        fwd = model.root.fwd
        seqs = [a.dims[1] for a in fwd.args if len(a.dims) >= 2]
        result = fwd.result
        if not seqs or len(result) < 2 or not all(s.same(result[1]) for s in seqs):
            diags.error(
                at,
                f"context(balance = true) reorders the sequence of {model.name}, whose result is "
                "not one value per input position",
                "use context(balance = false)",
            )
            return


def _check_seq(module: ir.Module, pieces: int, balance: bool, at: Span, diags: Diagnostics) -> None:
    """The train sequence (or max_seq) splits into `pieces` equal chunks."""
    train = module.train_settings
    if train is not None and "seq" in dict(train.settings):
        seq = train.get("seq")
    else:
        seq = sized_seq(module, module.models[0])
    if seq is None or seq % pieces == 0:
        return
    how = f"{pieces // 2} shards in zig-zag order ({pieces} chunks)" if balance else "the shards"
    diags.error(
        at,
        f"a sequence of {seq} positions does not split evenly over {how}",
        f"train with a seq that is a multiple of {pieces}",
    )
