"""The text of `axdsl aot`'s report: header, memory per chip, compute, and what XLA said."""

from __future__ import annotations

from axdsl.aot.lower import xla_total
from axdsl.aot.report import USABLE_FRACTION, Report, gib


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
    lines += ["", "Memory and FLOPs above are analytic (from the IR); XLA's own figures are shown "
                  "only where it compiled for the target."]
    return "\n".join(lines)


def _header(r: Report) -> list[str]:
    e, p = r.estimate, r.profile
    mesh = " ".join(f"{k}={v}" for k, v in e.mesh.items() if v > 1) or "one chip"
    return [
        f"axdsl aot: {r.model} ({r.spec}) on {r.target}: {e.chips} x {p.description}, "
        f"{gib(r.hbm)} each",
        f"  mesh {mesh}; batch {e.batch} " + ("images" if r.images else f"x seq {e.seq}")
        + (f" in {e.microbatches} micro-batches" if e.microbatches > 1 else "")
        + f"; remat {e.remat}; optimizer {e.optimizer}",
        f"  {r.params_total / 1e9:.3g} B parameters ({r.params_embedding / 1e9:.3g} B in embeddings)"
        if r.params_total >= 1e8 else
        f"  {r.params_total:,} parameters ({r.params_embedding:,} in embeddings)",
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
        lines.append(f"  weight copies     {gib(e.weight_copies):>12}   "
                     "(compute-dtype parameters and their gradients)")
    lines.append(
        f"  activations       {gib(e.activations):>12}   saved {gib(e.saved)} "
        f"({e.layers} layers x {gib(e.saved_per_layer)} + outside the scan), "
        f"working {gib(e.working)} ({'loss' if e.working_kind == 'loss' else 'one layer backward'})")
    if e.reused:
        lines.append(f"  unrolled reuse    {gib(-e.reused):>12}   (gradients of unrolled layers written where "
                     f"their freed residuals were)")
    if e.offloaded:
        lines.append(f"  offloaded to host {gib(e.offloaded):>12}   (not on the chip)")
    if e.update:
        lines.append(f"  optimizer update  {gib(e.update):>12}   (new parameters and moments before the "
                     f"skip-if-not-finite select; after the backward, so only the larger counts)")
    phase = "the optimizer update" if e.peak_phase == "update" else "the backward pass"
    lines.append(f"  peak:             {phase}")
    lines += [
        f"  batch             {gib(e.inputs):>12}",
        f"  total             {gib(e.total):>12}   of {gib(r.hbm)} HBM "
        f"({100 * e.total / r.hbm:.0f}%; usable {USABLE_FRACTION:.0%}: {gib(r.usable)})",
    ]
    if r.fits:
        lines.append(f"  => fits: {gib(r.usable - e.total)} to spare")
    else:
        lines.append(f"  => does NOT fit: {gib(e.total - r.usable)} over the usable memory")
        lines.append("  to make it fit, any of:")
        lines += [f"    - {s}" for s in r.suggestions]
    return lines


def _compute(r: Report) -> list[str]:
    e, f = r.estimate, r.flops
    if r.images:
        return ["compute (model FLOPs)",
                "  not counted: model FLOPs are counted per token of a sequence, and an image model's "
                "batch has none (train.py shows no MFU for it either)"]
    peak = r.profile.peak_flops("bf16")
    step_flops = f.per_step(e.batch)
    ideal = step_flops / (peak * e.chips)
    return [
        "compute (model FLOPs, MaxText's formula: 6 x params-in-matmuls + sequence mixing)",
        f"  per token (train)    {_si(f.train_per_token)}FLOP   (matmuls {_si(3 * f.matmul)}FLOP, "
        f"attention/SSD {_si(3 * f.attention)}FLOP at seq {f.seq})",
        f"  per step             {_si(step_flops)}FLOP   ({e.batch * e.seq:,} tokens)",
        f"  ideal step time      {ideal * 1e3:.4g} ms at the bf16 peak ({_si(peak)}FLOP/s x {e.chips} chips, "
        f"100% MFU); {ideal / 0.4 * 1e3:.4g} ms at 40% MFU",
        f"  ideal throughput     {e.batch * e.seq / ideal:,.0f} tokens/s",
    ]


def _render_lowering(r: Report) -> list[str]:
    lo = r.lowering
    if not lo:
        return ["  not lowered"]
    if "skipped" in lo:
        return [f"  lowering skipped: {lo['skipped']}"]
    if "error" in lo and "lower_s" not in lo:
        return [f"  ERROR: {lo['error']}"]
    out = [f"  lowered the generated train step for {lo.get('platform')} over {lo.get('devices')} "
           f"devices (mesh {lo.get('mesh')}) in {lo.get('lower_s')} s"
           + (" (in a subprocess)" if lo.get("subprocess") else "") + ": ok"]
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
    elif r.profile.kind == "gpu" and not xla:
        out.append("  GPU: exact per-chip figures need a compile on a machine with the GPU "
                   "(jax cannot compile for CUDA without one); run `axdsl aot ... --compile` there")
    return out


def _xla(r: Report) -> tuple[list[str], dict | None]:
    """XLA's memory_analysis() beside the analytic figures; and the figures, when they count."""
    lo, e = r.lowering, r.estimate
    xla = lo.get("xla")
    if xla and lo.get("tpu_topology") and not xla["temp"]:
        return [
            f"  compiled for TPU topology {lo['tpu_topology']} in {lo.get('compile_s')} s: XLA reports "
            f"arguments {gib(xla['argument'])} per chip (analytic {gib(e.state)}; TPU pads the two "
            f"minor dims of every array to (8, 128) tiles, which the analytic figures do not model)",
            "  this ahead-of-time TPU executable reports no temporaries (temp_size 0), so activations "
            "and the total stay analytic",
        ], None
    if not xla:
        return [], xla
    where = f"TPU topology {lo['tpu_topology']}" if lo.get("tpu_topology") else "this CPU"
    total = xla_total(xla)
    return [
        f"  compiled for {where}" + (f" in {lo['compile_s']} s" if "compile_s" in lo else "")
        + ": memory_analysis() per device vs analytic",
        f"    arguments (state + batch)  XLA {gib(xla['argument']):>11}   analytic {gib(e.state):>11}"
        f"   ({_pct(e.state, xla['argument'])})",
        f"    temporaries                XLA {gib(xla['temp']):>11}   analytic {gib(e.temporaries):>11}"
        f"   ({_pct(e.temporaries, xla['temp'])})",
        f"    outputs not donated        XLA {gib(max(xla['output'] - xla['alias'], 0)):>11}",
        f"    total                      XLA {gib(total):>11}   analytic {gib(e.total):>11}"
        f"   ({_pct(e.total, total)})",
    ], xla
