"""fit_remat: resolve `remat(fit)` to the least recomputation whose train step fits the chip.

Accelerator profiles ask for `remat = "fit"` (targets/profiles.toml), as may a target block with
`remat(fit)`. Rematerialization never changes results, only time and memory, so the compiler may
choose it: it weighs, in order of less recomputation,

    none                  keep every activation of the scanned block
    save = [every point]  keep the spec's named points (`as query_proj`, ...); recompute the rest
    save_dots             keep matmul outputs without batch dims
    full                  keep only each layer's input

and takes the first whose analytic per-chip memory (analysis/memory.py, the figure `axdsl aot`
prints, for the train block's batch and seq) is within the chip's usable memory (the platform's
usable fraction, analysis/platforms.py; not aot's borderline band, which risks running out).
When none fits, it takes `full` and says so: `axdsl aot` then suggests what would fit. The decision is recorded
in the schedule (`Schedule.remat_fit`: each policy tried with its bytes), so `axdsl dump`, the
generated comment and `axdsl aot` all say what was chosen and why.

    before:  remat(fit)  # profile tpu-v5e          /blocks : Block x16 remat(fit)
    after:   remat(save_dots)  # chosen by fit ...  /blocks : Block x16 remat(save_dots)

It runs last, after quantize_matmuls and select_kernels: the memory a step needs depends on the
kernels (splash attention keeps no [S, S] logits) and on quantization. A spec without a repeated
block needs no remat: `fit` then becomes `none` with nothing weighed.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.analysis.memory import GENERATED_UPDATE_SKIP, UpdateSkip, estimate_memory
from axdsl.analysis.platforms import facts
from axdsl.ir import nodes as ir
from axdsl.passes.insert_remat import attach_remat, named_points
from axdsl.targets import profiles

FULL = ir.RematPolicy(ir.RematKind.FULL)


def fit_remat(module: ir.Module) -> ir.Module:
    """Replace a `fit` remat request by the policy chosen from memory (see the module docstring)."""
    choice = module.schedule.remat
    if choice.value.kind is not ir.RematKind.FIT:
        return module
    train = module.models[0]  # the model the train block trains, as `axdsl aot` assumes
    if not any(i.repeat is not None for i in train.root.walk()):
        return _decide(module, ir.RematPolicy(ir.RematKind.NONE), choice, None)
    profile = profiles()[module.schedule.profile]
    usable = int(profile.hbm_bytes * facts(profile.kind).usable_fraction)  # no borderline band
    tried: list[ir.FitTry] = []
    for policy in candidates(train.root):
        est = estimate_memory(module, train.name, remat=policy,
                              update_select=GENERATED_UPDATE_SKIP is UpdateSkip.SELECT)
        tried.append(ir.FitTry(policy, est.total))
        if est.total <= usable:
            break
    fit = ir.RematFit(tuple(tried), usable, train.name, est.batch, est.seq)
    return _decide(module, tried[-1].policy if fit.fits else FULL, choice, fit)


def candidates(root: ir.Instance) -> list[ir.RematPolicy]:
    """The policies weighed, least recomputation first."""
    points = tuple(sorted(named_points(root)))
    saved = [ir.RematPolicy(ir.RematKind.SAVE, points)] if points else []
    return [ir.RematPolicy(ir.RematKind.NONE), *saved, ir.RematPolicy(ir.RematKind.SAVE_DOTS), FULL]


def _decide(module: ir.Module, policy: ir.RematPolicy, asked: ir.Choice,
            fit: ir.RematFit | None) -> ir.Module:
    """The module with `policy` on the schedule (origin: fit, and who asked) and every repeat."""
    origin = ir.Origin(ir.OriginKind.FIT, asked.span, where=str(asked.origin))
    schedule = replace(module.schedule, remat=ir.Choice(policy, origin), remat_fit=fit)
    models = tuple(replace(m, root=attach_remat(m.root, policy)) for m in module.models)
    return replace(module, schedule=schedule, models=models)
