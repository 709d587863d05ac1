"""fit_remat: resolve `remat(fit)` to the least recomputation whose train step fits the chip.

Accelerator profiles ask for `remat = "fit"` (targets/profiles.toml), as may a target block with
`remat(fit)`. Rematerialization never changes results, only time and memory, so the compiler may
choose it: it weighs, in order of less recomputation,

    none                  keep every activation of the scanned block
    save = [every point]  keep the spec's named points (`as query_proj`, ...); recompute the rest
    save_dots             keep matmul outputs without batch dims
    full                  keep only each layer's input

and takes the first whose analytic per-chip memory (analysis/memory.py, the figure `axdsl aot`
prints, for the train block's batch and seq, or the model's max_seq where the spec sets no seq)
is within the chip's usable memory (the platform's usable fraction, analysis/platforms.py) less a
margin for the model's error (FIT_MARGIN). When none fits the batch in one piece and the train
block does not set `microbatches`, it weighs the same policies at 2, 4, ... micro-batches
(gradient accumulation: the same global batch, smaller activations) and takes the fewest pieces
with the least recomputation that fit; the generated TrainConfig then says `microbatches = k  #
fit_remat`. When nothing fits, it takes `full` and says so: `axdsl aot` then suggests what would
fit. The decision is recorded in the schedule (`Schedule.remat_fit`:
each policy tried with its bytes), so `axdsl dump`, the generated comment and `axdsl aot` all say
what was chosen and why.

    before:  remat(fit)  # profile tpu-v5e                        /blocks : Block x16 remat(fit)
    after:   remat(full)  # fit_remat, for profile tpu-v5e        /blocks : Block x16 remat(full)
             # fit_remat, for llama1b at batch 4 x seq 2048, 14.32 GiB usable per chip (analytic):
             # none 30.84, save(points) 16.83, save_dots 17.83, full 11.83 GiB: full fits

It runs last, after quantize_matmuls and select_kernels: the memory a step needs depends on the
kernels (splash attention keeps no [S, S] logits) and on quantization. A spec without a repeated
block needs no remat: `fit` then becomes `none` with nothing weighed.
"""

from __future__ import annotations

import math
from dataclasses import replace

from axdsl.analysis.memory import estimate_memory
from axdsl.analysis.platforms import facts
from axdsl.ir import nodes as ir
from axdsl.passes.insert_remat import attach_remat, named_points
from axdsl.targets import profiles

FULL = ir.RematPolicy(ir.RematKind.FULL)
# Memory a chosen step leaves free beyond the platform's usable figure: the analytic model was
# measured up to 9% under XLA's TPU compile on steps that fit (gpt2-medium remat full, -9.0%;
# llama 3.2 1B full, -7.0%: benchmarks/RESULTS.md), and a choice that runs out costs a run.
FIT_MARGIN = 0.10


def fit_remat(module: ir.Module) -> ir.Module:
    """Replace a `fit` remat request by the policy chosen from memory (see the module docstring)."""
    choice = module.target.remat
    if choice.value.kind is not ir.RematKind.FIT:
        return module
    train = module.models[0]  # the model the train block trains, as `axdsl aot` assumes
    if not any(i.repeat is not None for i in train.root.walk()):
        return _decide(module, ir.RematPolicy(ir.RematKind.NONE), choice, None)
    profile = profiles()[module.target.profile]
    fraction = profile.usable_fraction(facts(profile.kind).usable_fraction)
    usable = int(profile.hbm_bytes * fraction / (1 + FIT_MARGIN))
    seq = sized_seq(module, train)
    tried: list[ir.FitTry] = []
    for k in microbatch_counts(module):
        for policy in candidates(train.root):
            est = estimate_memory(
                module,
                train.name,
                seq=seq,
                microbatches=k,
                remat=policy,
            )
            tried.append(ir.FitTry(policy, est.total, k))
            if est.total <= usable:
                break
        if tried[-1].bytes <= usable:
            break
    fit = ir.RematFit(tuple(tried), usable, train.name, est.batch, est.seq)
    module = _decide(module, tried[-1].policy if fit.fits else FULL, choice, fit)
    return _split_batch(module, fit.microbatches, choice) if fit.microbatches > 1 else module


def microbatch_counts(module: ir.Module) -> list[int]:
    """The micro-batch counts weighed, fewest first: the train block's alone where it is written
    (or there is none), else 1, 2, 4, ... while each piece still splits evenly over the mesh
    axes that shard the batch. Gradient accumulation keeps the global batch and its gradient
    (the mean of equal pieces' means) and lowers the activations a step holds; fit_remat takes it
    only when no remat policy fits the batch in one piece."""
    train = module.train_settings
    if train is None or "microbatches" not in dict(train.settings):
        return [1]
    written = train.choice("microbatches")
    if not written.origin.is_default:
        return [written.value]
    batch = train.get("batch")
    ways = math.prod(module.target.size(a) for a in module.target.kept_axes("batch"))
    counts, k = [], 1
    while k <= batch and batch % k == 0 and (batch // k) % ways == 0:
        counts.append(k)
        k *= 2
    return counts or [1]


def _split_batch(module: ir.Module, k: int, asked: ir.Choice) -> ir.Module:
    """The module with the train block's micro-batches set to `k` (origin: fit)."""
    origin = ir.Origin(ir.OriginKind.FIT, asked.span, where=str(asked.origin))
    train = module.train
    settings = tuple(
        (name, ir.Choice(k, origin) if name == "microbatches" else c) for name, c in train.settings
    )
    return replace(module, train_settings=replace(train, settings=settings))


def sized_seq(module: ir.Module, model: ir.Model) -> int | None:
    """The sequence length the step is sized for: the train block's `seq` (None: estimate_memory
    reads it), or, where the spec sets none, the model's max_seq. train.py then runs 128 by
    default, but `--seq` may go up to max_seq: the choice must hold for the largest."""
    train = module.train_settings
    written = (
        train is not None
        and "seq" in dict(train.settings)
        and not train.choice("seq").origin.is_default
    )
    max_seq = model.root.hparam("max_seq")
    if written or max_seq is None or not isinstance(max_seq.value.value, int):
        return None
    return max_seq.value.value


def candidates(root: ir.Instance) -> list[ir.RematPolicy]:
    """The policies weighed, least recomputation first; the named points are those inside the
    scanned (repeated) layers, the only ones a remat policy acts on."""
    points = tuple(
        sorted(set().union(*(named_points(i) for i in root.walk() if i.repeat is not None)))
    )
    saved = [ir.RematPolicy(ir.RematKind.SAVE, points)] if points else []
    return [ir.RematPolicy(ir.RematKind.NONE), *saved, ir.RematPolicy(ir.RematKind.SAVE_DOTS), FULL]


def _decide(
    module: ir.Module, policy: ir.RematPolicy, asked: ir.Choice, fit: ir.RematFit | None
) -> ir.Module:
    """The module with `policy` on the schedule (origin: fit, and who asked) and every repeat."""
    origin = ir.Origin(ir.OriginKind.FIT, asked.span, where=str(asked.origin))
    schedule = replace(module.target, remat=ir.Choice(policy, origin), remat_fit=fit)
    models = tuple(replace(m, root=attach_remat(m.root, policy)) for m in module.models)
    return replace(module, schedule=schedule, models=models)
