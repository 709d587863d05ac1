"""The text of `axdsl aot`'s report: header, memory per chip, compute, and what XLA said."""

from __future__ import annotations

from axdsl.analysis.flops import bubble_slowdown, pipelined_share
from axdsl.aot.hlo import summary
from axdsl.aot.xla import xla_total
from axdsl.aot.report import Report, gib


def _si(n: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} "


def _pct(analytic: float, xla: float) -> str:
    if not xla:
        return "n/a"
    return f"analytic {100 * (analytic - xla) / xla:+.1f}%"


def render(r: Report) -> str:
    """The whole report, as `axdsl aot` prints it."""
    lines = _header(r) + [f"  note: {n}" for n in r.notes] + [""] + _memory(r) + [""] + _compute(r)
    lines += ["", "XLA"] + _render_lowering(r)
    lines += ["", _footer(r)]
    return "\n".join(lines)


def _footer(r: Report) -> str:
    if r.gpu:
        return (
            "The verdict is XLA's: it compiled the step for the target's GPUs, and its figure is "
            "held to the memory pool train.py asks for (XLA_PYTHON_CLIENT_MEM_FRACTION). The "
            "memory terms and FLOPs above are analytic (from the IR)."
        )
    if r.xla_decides:
        return (
            "The verdict is XLA's: it compiled the step for the target's TPU topology. The memory "
            "terms and FLOPs above are analytic (from the IR)."
        )
    return (
        "The verdict is analytic (axdsl/analysis/memory.py, against 90% of the HBM), as are the "
        "memory and FLOPs above; XLA's own figures are shown only where it compiled for the target."
    )


def _header(r: Report) -> list[str]:
    e, p = r.estimate, r.profile
    mesh = " ".join(f"{k}={v}" for k, v in e.mesh.items() if v > 1) or "one chip"
    return [
        f"axdsl aot: {r.model} ({r.spec}) on {r.target}: {e.chips} x {p.description}, "
        f"{gib(r.hbm)} each",
        f"  mesh {mesh}; batch {e.batch} "
        + ("images" if r.images else f"x seq {e.seq}")
        + (f" in {e.microbatches} micro-batches" if e.microbatches > 1 else "")
        + f"; remat {e.remat}; optimizer {e.optimizer}",
        (
            f"  {r.params_total / 1e9:.3g} B parameters "
            f"({r.params_embedding / 1e9:.3g} B in embeddings)"
            if r.params_total >= 1e8
            else f"  {r.params_total:,} parameters ({r.params_embedding:,} in embeddings)"
        ),
    ]


def _memory(r: Report) -> list[str]:
    """The analytic terms, the total against the chip's memory, and the verdict."""
    e = r.estimate
    lines = [
        "memory per chip (analytic: axdsl/analysis/memory.py)",
        f"  parameters        {gib(e.params):>12}",
        f"  gradients         {gib(e.grads):>12}",
        f"  optimizer state   {gib(e.opt_state):>12}   ({e.optimizer})",
    ]
    if e.weight_copies:
        lines.append(
            f"  weight copies     {gib(e.weight_copies):>12}   "
            "(compute-dtype parameters and their gradients)"
        )
    if e.transposed:
        lines.append(
            f"  transposed layers {gib(e.transposed):>12}   "
            "(XLA:GPU's transposed copy of the stacked layers' weights)"
        )
    lines.append(
        f"  activations       {gib(e.activations):>12}   saved {gib(e.saved)} "
        f"({e.layers} layers x {gib(e.saved_per_layer)} + outside the scan), "
        f"working {gib(e.working)} ({'loss' if e.working_kind == 'loss' else 'one layer backward'})"
    )
    if e.in_flight and e.pipeline is not None:
        pl = e.pipeline
        lines.append(
            f"  of which in flight {gib(e.in_flight):>11}   (the pipelined {pl.child}: "
            f"{pl.iterations} iterations x its layers on one stage, for one micro-batch of "
            f"{e.batch // e.microbatches // pl.microbatches}, plus the loop's buffer)"
        )
    if e.reused:
        lines.append(
            f"  unrolled reuse    {gib(-e.reused):>12}   "
            "(gradients of unrolled layers written where their freed residuals were)"
        )
    if e.offloaded:
        lines.append(f"  offloaded to host {gib(e.offloaded):>12}   (not on the chip)")
    if e.update:
        lines.append(
            f"  optimizer update  {gib(e.update):>12}   (new parameters and moments before the "
            f"skip-if-not-finite select; after the backward, so only the larger counts)"
        )
    phases = {
        "update": "the optimizer update",
        "backward": "the backward pass",
        "loss": "the loss, before any layer's gradient exists (not every term above is live)",
        "layer": f"one layer's backward beside the layers' gradients, {gib(e.layer_grads)} "
        "(not every term above is live)",
    }
    lines.append(f"  peak:             {phases[e.peak_phase]}")
    lines.append(f"  batch             {gib(e.inputs):>12}")
    lines += _verdict_xla(r) if r.xla_decides else _verdict_analytic(r)
    if r.unsplittable is not None:
        lines.append(f"  => does NOT run on this mesh: {r.unsplittable}")
    if not r.fits:
        scaled = (
            " (found with the analytic model; figures scaled by XLA's ratio)"
            if r.ratio != 1.0
            else ""
        )
        what = "run" if r.unsplittable is not None else "fit"
        lines.append(f"  to make it {what}{scaled}:")
        lines += [f"    - {s}" for s in r.suggestions]
    return lines


def _verdict_analytic(r: Report) -> list[str]:
    """The analytic total against the usable fraction of the HBM: the verdict without XLA."""
    e = r.estimate
    total = (
        f"  total             {gib(e.total):>12}   of {gib(r.hbm)} HBM "
        f"({100 * e.total / r.hbm:.0f}%; usable {r.usable / r.hbm:.0%}: {gib(r.usable)})"
    )
    if r.unsplittable is not None:  # no verdict on memory for a step that cannot run
        return [total]
    if r.borderline:
        return [
            total,
            f"  => fits (analytic, borderline): {gib(e.total - r.usable)} over the usable "
            "memory, within what the model overestimates steps that fit by on this "
            "platform; compile for the target (libtpu) to be sure",
        ]
    if e.total <= r.limit:
        return [total, f"  => fits (analytic): {gib(r.usable - e.total)} to spare"]
    return [
        total,
        f"  => does NOT fit (analytic): {gib(e.total - r.usable)} over the usable memory",
    ]


def _verdict_xla(r: Report) -> list[str]:
    """XLA's per-chip figure against the HBM it gives a program; the analytic total beside it."""
    if r.gpu:
        return _verdict_gpu(r)
    e, where = r.estimate, f"TPU topology {r.lowering.get('tpu_topology')}"
    total = f"  total (analytic)  {gib(e.total):>12}   of {gib(r.hbm)} HBM"
    if r.peak is None:  # ran out of HBM; the message gave no figure
        return [
            total,
            f"  => does NOT fit (XLA, {where}): its compile ran out of HBM "
            f"({gib(r.limit)} available)",
            f"  analytic: {gib(e.total)}",
        ]
    how = (
        "its compile ran out of HBM: what it says the program needs"
        if r.out_of_memory
        else "memory_analysis()'s peak: what a chip needs"
    )
    if r.out_of_memory:
        verdict = f"=> does NOT fit (XLA): {gib(r.peak - r.limit)} over"
    elif r.peak <= r.limit:
        verdict = f"=> fits (XLA): {gib(r.limit - r.peak)} to spare"
    else:  # compiled: XLA's own HBM check passed, though its figure is higher
        verdict = (
            f"=> fits (XLA): its compile for the chip passed its own HBM check; "
            f"memory_analysis() says {gib(r.peak - r.limit)} above the HBM it gives a program"
        )
    return [
        total,
        f"  XLA ({where}) {gib(r.peak):>9}   "
        f"of {gib(r.limit)} XLA gives a program per chip ({how})",
        f"  {verdict}",
        f"  analytic: {gib(e.total)} ({100 * (e.total - r.peak) / r.peak:+.0f}% of XLA's)",
    ]


def _verdict_gpu(r: Report) -> list[str]:
    """XLA's per-GPU figure against the memory pool train.py asks for; the analytic beside it."""
    e, peak = r.estimate, r.peak or 0
    memory = r.lowering.get("device_memory") or r.hbm
    fraction = r.profile.usable_fraction(1.0)
    verdict = (
        f"=> fits (XLA): {gib(r.limit - peak)} to spare"
        if peak <= r.limit
        else f"=> does NOT fit (XLA): {gib(peak - r.limit)} over the pool"
    )
    return [
        f"  total (analytic)  {gib(e.total):>12}   of {gib(r.hbm)} HBM",
        f"  XLA (GPUs {r.lowering.get('gpu_topology')}) {gib(peak):>9}   of {gib(r.limit)}: "
        f"the pool train.py asks for ({fraction:.0%} of {gib(memory)}; arguments + "
        "temporaries + outputs not donated)",
        f"  {verdict}",
        (
            f"  analytic: {gib(e.total)} ({100 * (e.total - peak) / peak:+.0f}% of XLA's)"
            if peak
            else f"  analytic: {gib(e.total)}"
        ),
    ]


def _compute(r: Report) -> list[str]:
    e, f = r.estimate, r.flops
    if r.images:
        return [
            "compute (model FLOPs)",
            "  not counted: model FLOPs are counted per token of a sequence, and an image model's "
            "batch has none (train.py shows no MFU for it either)",
        ]
    peak = r.profile.peak_flops("bf16")
    step_flops = f.per_step(e.batch)
    ideal = step_flops / (peak * e.chips)
    lines = [
        "compute (model FLOPs, MaxText's formula: 6 x params-in-matmuls + sequence mixing)",
        f"  per token (train)    {_si(f.train_per_token)}FLOP   (matmuls {_si(3 * f.matmul)}FLOP, "
        f"attention/SSD {_si(3 * f.attention)}FLOP at seq {f.seq})",
        f"  per step             {_si(step_flops)}FLOP   ({e.batch * e.seq:,} tokens)",
        f"  ideal step time      {ideal * 1e3:.4g} ms at the bf16 peak "
        f"({_si(peak)}FLOP/s x {e.chips} chips, "
        f"100% MFU); {ideal / 0.4 * 1e3:.4g} ms at 40% MFU",
    ]
    if e.pipeline is not None and e.pipeline.stages > 1:
        slowed = bubble_slowdown(f, e.pipeline)
        lines.append(
            f"  pipeline bubble      {e.pipeline.bubble:.1%} of the loop idles each stage; "
            f"{pipelined_share(f, e.pipeline.child):.0%} of the FLOPs run in it: "
            f"{ideal * slowed * 1e3:.4g} ms at best, MFU at most {1 / slowed:.1%}"
        )
        ideal *= slowed
    lines.append(f"  ideal throughput     {e.batch * e.seq / ideal:,.0f} tokens/s")
    return lines


def _render_lowering(r: Report) -> list[str]:
    lo = r.lowering
    if not lo:
        return ["  not lowered"]
    if "skipped" in lo:
        return [f"  lowering skipped: {lo['skipped']}"]
    if "error" in lo and "lower_s" not in lo:
        return [f"  ERROR: {lo['error']}"]
    out = [
        f"  lowered the generated train step for {lo.get('platform')} over {lo.get('devices')} "
        f"devices (mesh {lo.get('mesh')}) in {lo.get('lower_s')} s"
        + (" (in a subprocess)" if lo.get("subprocess") else "")
        + ": ok"
    ]
    if lo.get("note"):
        out.append(f"  note: {lo['note']}")
    if lo.get("error"):
        out.append(f"  ERROR: {lo['error']}")
    xla_lines, xla = _xla(r)
    out += xla_lines
    if lo.get("compile_note"):
        out.append(f"  {lo['compile_note']}")
    if lo.get("tpu"):
        out.append(f"  TPU: {lo['tpu']}")
    if lo.get("gpu"):
        out.append(f"  GPU: {lo['gpu']}")
    if lo.get("kernels"):
        out.append("  what the compiled step runs (per GPU):")
        out += [f"    {line}" for line in summary(lo["kernels"])]
        out += [f"  ERROR: {problem}" for problem in r.kernel_problems]
    return out


def _xla(r: Report) -> tuple[list[str], dict | None]:
    """XLA's memory_analysis() beside the analytic figures; and the figures, when they count."""
    lo, e = r.lowering, r.estimate
    xla = lo.get("xla")
    if r.out_of_memory is not None:
        need = r.out_of_memory.get("required")
        return [
            f"  compiled for TPU topology {lo['tpu_topology']} in {lo.get('compile_s')} s: "
            "RESOURCE_EXHAUSTED, the program needs "
            f"{gib(need) if need else '(no figure)'} per chip "
            f"(arguments and temporaries), above the {gib(r.limit)} of HBM it has"
        ], None
    if not xla:
        return [], xla
    tpu = bool(lo.get("tpu_topology"))
    where = (
        f"TPU topology {lo['tpu_topology']}"
        if tpu
        else f"GPUs {lo['gpu_topology']}" if r.gpu else "this CPU"
    )
    total = xla_total(xla, tpu)
    temps = total - xla["argument"] if tpu else xla["temp"]
    if tpu:  # the peak is what a chip needs; temp_size sums buffers never live together
        last = [
            f"    peak (what a chip needs)   XLA {gib(total):>11}   analytic {gib(e.total):>11}"
        ]
    else:
        last = [
            f"    outputs not donated        XLA {gib(max(xla['output'] - xla['alias'], 0)):>11}",
            f"    total                      XLA {gib(total):>11}   analytic {gib(e.total):>11}",
        ]
    last[-1] += f"   ({_pct(e.total, total)})"
    return [
        f"  compiled for {where}"
        + (f" in {lo['compile_s']} s" if "compile_s" in lo else "")
        + ": memory_analysis() per device vs analytic",
        f"    arguments (state + batch)  XLA {gib(xla['argument']):>11}   "
        f"analytic {gib(e.state):>11}"
        f"   ({_pct(e.state, xla['argument'])})",
        f"    temporaries{' at the peak' if tpu else '            '} XLA {gib(temps):>11}   "
        f"analytic {gib(e.temporaries):>11}"
        f"   ({_pct(e.temporaries, temps)})",
        *last,
    ], xla
