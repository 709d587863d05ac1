"""`axdsl aot SPEC --target T`: will the training step fit on the target, and how fast can it go?

Before anything is launched on real hardware:

1. build the spec for the target in memory (`axdsl.build.build_files`), as `axdsl build` would;
2. estimate per-chip memory (parameters, gradients, optimizer state, weight copies, activations
   under the target's remat policy) and model FLOPs from the IR (`axdsl.analysis`, no jax);
3. lower THE generated train step (`train.make_train_step`) with jax on abstract inputs
   (`train.abstract_state`, `train.batch_sharding`) over as many fake CPU devices as the target
   has chips, laid out by the generated `make_mesh`: nothing is allocated. GPU and TPU targets are
   lowered for their own platform (`lowering_platforms`), so the StableHLO is the target's;
4. with libtpu installed (`pip install -e '.[tpu]'`), TPU targets are also compiled for the real
   topology (`jax.experimental.topologies`, tpu.py), one chip included, and XLA's per-chip memory
   DECIDES the verdict, against the HBM XLA gives a program (v5e: 15.75 GiB); a compile that runs
   out of HBM is XLA's "does not fit". The analytic total is printed beside it. Otherwise the
   verdict is analytic (USABLE_FRACTION of the HBM) and says so. With `--compile`, CPU targets are
   compiled on this machine and XLA's `memory_analysis()` is printed beside the analytic figures
   (a GPU or TPU step is never compiled for the CPU and reported as the target's).

Exit codes: 0 fits, 3 does not fit (with concrete suggestions, found with the analytic model and
shown scaled by XLA's ratio when XLA decided), 1 the generated step failed to lower. Compile errors
in the spec raise CompileError, which the CLI prints (exit 1).

jax is imported only here, lazily, after XLA_FLAGS asks for enough host devices. When jax is
already imported with fewer devices (a test process, a notebook), the lowering runs in a
subprocess, `python -m axdsl.aot --lower ...`, which prints its result as one JSON line.

The package: `report.py` (Report, who decides, exit codes), `lower.py` (lowering and compiling),
`tpu.py` (compiling for a TPU topology without a TPU), `xla.py` (XLA's figures and messages),
`suggest.py` (the search for a layout that fits), `render.py` (the text), `__main__.py`
(the subprocess side).
"""

from __future__ import annotations

import sys
from pathlib import Path

from axdsl.analysis.flops import model_flops, param_count
from axdsl.analysis.memory import UpdateSkip, estimate_memory
from axdsl.aot.hlo import missing
from axdsl.aot.lower import lower_step
from axdsl.aot.render import render
from axdsl.aot.report import EXIT_ERROR, EXIT_FITS, EXIT_NO_FIT, Report
from axdsl.aot.suggest import split_suggestions, suggest, unsplittable
from axdsl.ir import nodes as ir
from axdsl.ir.printer import fit_lines, pipeline_text
from axdsl.ir.rewrite import prims_of
from axdsl.primitives.quantized import QUANTIZED
from axdsl.aot.xla import xla_total
from axdsl.objectives import batches_of
from axdsl.targets import USABLE_FRACTION, profiles

__all__ = [
    "EXIT_ERROR",
    "EXIT_FITS",
    "EXIT_NO_FIT",
    "USABLE_FRACTION",
    "Report",
    "analyze",
    "lower_step",
    "render",
    "run",
    "suggest",
    "xla_total",
]


def selected_kernels(model: ir.Model) -> tuple[bool, bool]:
    """(cuDNN attention, fp8 matmuls): whether the passes chose them anywhere in `model`."""
    prims = [p for inst in model.root.walk() for p in prims_of(inst)]
    cudnn = any(p.kernel is not None and p.kernel.kernel is ir.Kernel.CUDNN for p in prims)
    fp8 = any(p.name == QUANTIZED and p.attr("format") is ir.QuantFormat.FP8 for p in prims)
    return cudnn, fp8


class AotError(Exception):
    """A user mistake on the command line (an unknown model): printed, exit 1."""


def run(
    spec: Path,
    target: str,
    model: str | None = None,
    batch: int | None = None,
    seq: int | None = None,
    compile: bool = False,
) -> int:
    """Print the fit report of `spec`'s training step on `target`; return the exit code."""
    try:
        report = analyze(spec, target, model, batch, seq, compile=compile, lower=True)
    except AotError as exc:
        print(f"axdsl aot: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(render(report))
    if report.lowering.get("error") or report.kernel_problems:
        return EXIT_ERROR
    return EXIT_FITS if report.fits else EXIT_NO_FIT


def analyze(
    spec: Path,
    target: str,
    model: str | None = None,
    batch: int | None = None,
    seq: int | None = None,
    compile: bool = False,
    lower: bool = True,
) -> Report:
    """Build, estimate and (with `lower`) lower the step; the data behind `run`'s report."""
    from axdsl.build import build_files, default_out_dir, edited_files
    from axdsl.pipeline import compile_spec

    spec = Path(spec)
    module = compile_spec(spec, target)
    names = [m.name for m in module.models]
    model = model or names[0]
    if model not in names:
        raise AotError(f"no model `{model}` in {spec}; its models: {', '.join(names)}")
    batch = batch or module.train.get("batch")
    seq = seq or module.train.get("seq")
    sched = module.target
    profile = profiles()[sched.profile]
    m = next(x for x in module.models if x.name == model)
    files = build_files(spec, target)
    # the update's skip in the form the generated step writes (choose_update_skip); a build with
    # no train.py has no update
    select = "train.py" in files and sched.update_skip is UpdateSkip.SELECT
    est = estimate_memory(module, model, batch=batch, seq=seq, update_select=select)
    pc = param_count(m)
    report = Report(
        spec=spec,
        target=target,
        profile=profile,
        model=model,
        estimate=est,
        flops=model_flops(m, seq),
        params_total=pc.total,
        params_embedding=pc.embedding,
        hbm=profile.hbm_bytes,
        images=batches_of(module) == "classify",
    )
    if sched.remat_fit is not None:  # say what fit_remat chose, and from which figures
        fit = sched.remat_fit
        report.notes.append(" ".join(fit_lines(fit)))
        if (fit.batch, fit.seq) != (est.batch, est.seq):
            report.notes.append(
                f"remat({est.remat}) was chosen for batch {fit.batch} x seq {fit.seq}; "
                f"for batch {est.batch} x seq {est.seq}, set remat(...) in a target block "
                "if this report says it does not fit"
            )
    for left, why in sched.left_out:  # annotate_sharding: a variant this mesh cannot shard
        report.notes.append(f"{left} is left out of this target's build: {why}")
    if sched.pipeline.value is not None:  # plan_pipeline's split and the bubble it costs
        report.notes.append(
            f"{pipeline_text(sched.pipeline.value)}; the memory figures below divide the "
            "pipelined layers' weights, gradients and optimizer state by the stages, and count "
            "the activations of every micro-batch in flight on a stage (the bubble's included)"
        )
    edited = edited_files(default_out_dir(spec, target))
    if edited:
        report.notes.append(
            f"you edited {default_out_dir(spec, target)}/{edited[0]}: this report is for "
            "the train step a fresh build generates, not for your edits"
        )
    if lower:
        if "train.py" not in files:
            report.lowering = {
                "skipped": "no train.py: the first model fits no objective of the train block"
            }
        else:
            report.lowering = lower_step(files, spec, target, model, batch, seq, sched, compile)
    kernels = report.lowering.get("kernels")
    if kernels is not None:  # the compiled program runs what select_kernels and quantize chose
        report.kernel_problems = missing(kernels, *selected_kernels(m))
    report.unsplittable = unsplittable(module, est)
    if report.unsplittable is not None:
        report.suggestions = split_suggestions(module, model, est, report.limit, target, select)
    elif not report.fits:  # searched with the analytic model, scaled by XLA's ratio if it decided
        report.suggestions = suggest(module, model, est, report.limit, target, select, report.ratio)
    return report
