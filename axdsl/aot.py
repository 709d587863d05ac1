"""`axdsl aot SPEC --target T`: will the training step fit on the target, and how fast can it go?

Before anything is launched on real hardware:

1. build the spec for the target in memory (`axdsl.build.build_files`), as `axdsl build` would;
2. estimate per-chip memory (parameters, gradients, optimizer state, weight copies, activations
   under the target's remat policy) and model FLOPs from the IR (`axdsl.analysis`, no jax);
3. lower THE generated train step (`train.make_train_step`) with jax on abstract inputs
   (`train.abstract_state`, `train.batch_sharding`) over as many fake CPU devices as the target
   has chips, laid out by the generated `make_mesh`: nothing is allocated. GPU and TPU targets are
   lowered for their own platform (`lowering_platforms`), so the StableHLO is the target's;
4. with libtpu installed, TPU targets are also compiled for the real topology
   (`jax.experimental.topologies`) and XLA's exact per-chip memory is printed; with `--compile`,
   CPU targets are compiled on this machine and XLA's `memory_analysis()` is printed beside the
   analytic figures (a GPU or TPU step is never compiled for the CPU and reported as the target's).

Exit codes: 0 fits, 3 does not fit (with concrete suggestions), 1 the generated step failed to
lower. Compile errors in the spec raise CompileError, which the CLI prints (exit 1).

jax is imported only here, lazily, after XLA_FLAGS asks for enough host devices. When jax is
already imported with fewer devices (a test process, a notebook), the lowering runs in a
subprocess, `python -m axdsl.aot --lower ...`, which prints its result as one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from axdsl.analysis.flops import FlopCount, model_flops, param_count
from axdsl.analysis.memory import MemoryEstimate, estimate_memory
from axdsl.ir import nodes as ir
from axdsl.targets import Profile, profiles

EXIT_FITS, EXIT_ERROR, EXIT_NO_FIT = 0, 1, 3
# Memory the step may use: XLA and the runtime keep some for themselves (buffers of the
# collectives, fragmentation), and the analytic figures are good to about 10%.
USABLE_FRACTION = 0.9
RESULT_TAG = "AXDSL_AOT_RESULT "
PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
# TPU topologies by chip count for jax.experimental.topologies (2-D tori for v5e/v6e, 3-D for v4/v5p).
TPU_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
TPU_TOPOLOGY_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}


@dataclasses.dataclass
class Report:
    """Everything `run` prints; tests read it through `analyze`."""

    spec: Path
    target: str
    profile: Profile
    model: str
    estimate: MemoryEstimate
    flops: FlopCount
    params_total: int
    params_embedding: int
    hbm: int
    lowering: dict = dataclasses.field(default_factory=dict)
    suggestions: list[str] = dataclasses.field(default_factory=list)

    @property
    def usable(self) -> int:
        return int(self.hbm * USABLE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.estimate.total <= self.usable


# ---------------------------------------------------------------------------- entry point
def run(spec: Path, target: str, model: str | None = None, batch: int | None = None,
        seq: int | None = None, compile: bool = False) -> int:
    """Print the fit report of `spec`'s training step on `target`; return the exit code."""
    try:
        report = analyze(spec, target, model, batch, seq, compile=compile, lower=True)
    except _AotError as exc:
        print(f"axdsl aot: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(render(report))
    if report.lowering.get("error"):
        return EXIT_ERROR
    return EXIT_FITS if report.fits else EXIT_NO_FIT


class _AotError(Exception):
    pass


def analyze(spec: Path, target: str, model: str | None = None, batch: int | None = None,
            seq: int | None = None, compile: bool = False, lower: bool = True) -> Report:
    """Build, estimate and (with `lower`) lower the step; the data behind `run`'s report."""
    from axdsl.build import build_files
    from axdsl.pipeline import compile_spec

    spec = Path(spec)
    module = compile_spec(spec, target)
    names = [m.name for m in module.models]
    model = model or names[0]
    if model not in names:
        raise _AotError(f"no model `{model}` in {spec}; its models: {', '.join(names)}")
    train = module.train_settings
    batch = batch or train.get("batch")
    seq = seq or train.get("seq")
    sched = module.schedule
    profile = profiles()[sched.profile]
    m = next(x for x in module.models if x.name == model)
    files = build_files(spec, target)
    # The generated step's skip-on-non-finite select costs memory at the update (see memory.py).
    select = "jnp.where(ok" in files.get("train.py", "")
    est = estimate_memory(module, model, batch=batch, seq=seq, update_select=select)
    pc = param_count(m)
    report = Report(spec=spec, target=target, profile=profile, model=model, estimate=est,
                    flops=model_flops(m, seq), params_total=pc.total, params_embedding=pc.embedding,
                    hbm=profile.hbm_bytes)
    if not report.fits:
        report.suggestions = suggest(module, model, est, report.usable, target, select)
    if lower:
        if "train.py" not in files:
            report.lowering = {"skipped": "the spec's first model is not a language model: no train.py"}
        else:
            report.lowering = lower_step(files, spec, target, model, batch, seq, sched.chips,
                                         sched.kind, compile)
    return report


# ---------------------------------------------------------------------------- suggestions
def suggest(module: ir.Module, model: str, est: MemoryEstimate, usable: int, target: str,
            update_select: bool = True) -> list[str]:
    """Concrete changes that make the step fit, each with the per-chip total it would give."""
    out: list[str] = []
    sched = module.schedule
    sizes = dict(est.mesh)
    chips = est.chips
    pattern = f'target "{target}"'
    batch_rule = dict((k, c.value) for k, c in sched.rules).get("batch", ())

    def total(**kw) -> int:
        kw.setdefault("batch", est.batch)
        kw.setdefault("microbatches", est.microbatches)
        return estimate_memory(module, model, seq=est.seq, update_select=update_select, **kw).total

    def shards(mesh: dict[str, int]) -> int:
        return math.prod(mesh.get(a, 1) for a in batch_rule)

    # 1. FSDP: every chip on fsdp, then more chips.
    base = dict(sizes)
    if base.get("data", 1) > 1 and "fsdp" in sizes:
        base["fsdp"] = base.get("fsdp", 1) * base["data"]
        base["data"] = 1
        t = total(mesh=base)
        if t <= usable:
            out.append(f"more FSDP on the same {chips} chips: put the data axis on fsdp, "
                       f"`{pattern} {{ mesh(fsdp = -1) }}` -> {_gib(t)} per chip")
    others = math.prod(v for k, v in base.items() if k != "fsdp")
    for k in range(1, 13):
        fsdp = base.get("fsdp", 1) * 2**k
        mesh = {**base, "fsdp": fsdp}
        # Same sequences per chip: the global batch grows with the chips when it must.
        batch = max(est.batch, est.batch * shards(mesh) // max(shards(sizes), 1))
        t = total(batch=batch, mesh=mesh)
        if t <= usable:
            n = fsdp * others
            grown = f", global batch {batch}" if batch != est.batch else ""
            out.append(f"more FSDP: fsdp = {fsdp} over {n} chips{grown} -> {_gib(t)} per chip; "
                       f"check it with `axdsl aot {module.spec} --target {sched.profile}-{n}"
                       + (f" --batch {batch}`" if grown else "`"))
            break
    # 2. A stronger remat policy.
    order = ["none", "save", "offload", "save_dots", "full"]
    now = est.remat
    for kind in order[order.index(now) + 1 if now in order else len(order):]:
        if kind in ("save", "offload"):
            continue
        t = total(remat=ir.RematPolicy(kind))
        if t <= usable:
            keeps = "only each layer input" if kind == "full" else "matmul outputs"
            out.append(f"stronger remat: `{pattern} {{ remat({kind}) }}` (keeps {keeps}) "
                       f"-> {_gib(t)} per chip")
            break
    # 3. More micro-batches (same global batch, smaller activations).
    k = est.microbatches * 2
    while est.batch % k == 0 and (est.batch // k) % shards(sizes) == 0:
        t = total(microbatches=k)
        if t <= usable:
            out.append(f"smaller micro-batches: `train {{ microbatches = {k} }}` "
                       f"({est.batch // k} sequences per micro-batch) -> {_gib(t)} per chip")
            break
        k *= 2
    # 4. Nothing alone: remat(full) and more chips together.
    if not out:
        for j in range(0, 13):
            mesh = {**base, "fsdp": base.get("fsdp", 1) * 2**j}
            batch = max(est.batch, est.batch * shards(mesh) // max(shards(sizes), 1))
            t = total(batch=batch, mesh=mesh, remat=ir.RematPolicy("full"))
            if t <= usable:
                n = mesh["fsdp"] * others
                out.append(f"together: `{pattern} {{ remat(full) }}` and fsdp over {n} chips "
                           f"(`--target {sched.profile}-{n}`) -> {_gib(t)} per chip")
                break
        else:
            out.append("no layout tried fits (FSDP up to 4096x, remat(full), micro-batches): "
                       "use a smaller model, shorter sequences or a chip with more memory")
    return out


# ---------------------------------------------------------------------------- lowering
def lower_step(files: dict[str, str], spec: Path, target: str, model: str, batch: int, seq: int,
               chips: int, kind: str, compile: bool) -> dict:
    """Lower the generated step here when jax can have `chips` devices, else in a subprocess."""
    if _can_run_here(chips):
        return _lower_here(files, model, batch, seq, chips, kind, compile)
    return _lower_in_subprocess(spec, target, model, batch, seq, chips, compile)


def _can_run_here(chips: int) -> bool:
    if "jax" not in sys.modules:
        _request_devices(chips)
        return True
    import jax

    try:
        return len(jax.devices("cpu")) >= chips
    except RuntimeError:
        return False


def _request_devices(chips: int) -> None:
    """Ask XLA for `chips` host devices; must run before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    if m and int(m.group(1)) >= chips:
        return
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags).strip()
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={chips}".strip()


def _lower_in_subprocess(spec: Path, target: str, model: str, batch: int, seq: int, chips: int,
                         compile: bool) -> dict:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={chips}".strip()
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "axdsl.aot", "--lower", str(spec), "--target", target,
           "--model", model, "--batch", str(batch), "--seq", str(seq)] + (["--compile"] if compile else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            result["subprocess"] = True
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"lowering subprocess exited {proc.returncode}: " + " | ".join(tail)}


def _lower_here(files: dict[str, str], model: str, batch: int, seq: int, chips: int, kind: str,
                compile: bool) -> dict:
    import jax
    import jax.numpy as jnp

    tmp = Path(tempfile.mkdtemp(prefix="axdsl_aot_"))
    package = f"_axdsl_aot_{os.getpid()}_{abs(hash(files['model.py'])) % 10**8}"
    (tmp / package).mkdir()
    for name, text in files.items():
        (tmp / package / name).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(tmp))
    result: dict = {"devices": chips, "platform": PLATFORMS.get(kind, "cpu")}
    try:
        train = importlib.import_module(f"{package}.train")
        mod = importlib.import_module(f"{package}.model")
        tc = dataclasses.replace(train.TRAIN, model=model, batch=batch, seq=seq)
        cfg = mod.CONFIGS[model]
        mesh = mod.make_mesh(jax.devices("cpu")[:chips])
        result["mesh"] = {k: int(v) for k, v in mesh.shape.items()}
        if hasattr(train, "check_config"):
            try:
                train.check_config(cfg, tc, mesh)
            except SystemExit as exc:
                return {**result, "error": f"the generated train.py rejects this configuration: {exc}"}
        t0 = time.perf_counter()
        # abstract_state and make_train_step make a PRNG key eagerly (for eval_shape): outside
        # the mesh, on the default device, which also works for a TPU topology without chips.
        state = train.abstract_state(cfg, tc, mesh)
        tokens = jax.ShapeDtypeStruct((tc.batch, tc.seq + 1), jnp.int32, sharding=train.batch_sharding(mesh))
        step = train.make_train_step(cfg, tc, mesh)
        with jax.set_mesh(mesh):  # the model pins activation layouts only inside a mesh context
            platform = result["platform"]
            try:
                lowered = step.trace(state, tokens).lower(lowering_platforms=(platform,))
            except Exception as exc:  # noqa: BLE001 - report why, then fall back to the CPU lowering
                if platform == "cpu":
                    raise
                result["note"] = f"lowering for {platform} failed ({_short(exc)}); lowered for cpu instead"
                result["platform"] = "cpu"
                lowered = step.trace(state, tokens).lower(lowering_platforms=("cpu",))
            result["lower_s"] = round(time.perf_counter() - t0, 2)
            result["hlo_chars"] = len(lowered.as_text())
            if compile and result["platform"] == "cpu" and kind == "cpu":
                t0 = time.perf_counter()
                compiled = lowered.compile()
                result["compile_s"] = round(time.perf_counter() - t0, 2)
                result["xla"] = _memory_stats(compiled.memory_analysis())
            elif compile:
                result["compile_note"] = (f"not compiled: a {kind} step compiled for this CPU would not "
                                          f"give the {kind}'s memory")
        if kind == "tpu":
            result.update(_tpu_compile(train, mod, cfg, tc, chips))
    except Exception as exc:  # noqa: BLE001 - the generated code failed: say so, exit 1
        msg = _short(exc)
        if "cuDNN" in msg or "cudnn" in msg:
            result["skipped"] = ("the step uses cuDNN attention, which jax traces only on a machine "
                                 "with an NVIDIA GPU; the figures are analytic only")
        else:
            result["error"] = f"lowering the generated train step failed: {type(exc).__name__}: {msg}"
    finally:
        sys.path.remove(str(tmp))
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def _tpu_compile(train, mod, cfg, tc, chips: int) -> dict:
    """Compile for the real TPU topology when libtpu is installed (exact per-chip memory)."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return {"tpu": "libtpu is not installed: figures are analytic. For XLA's exact per-chip "
                       "memory of this TPU, `pip install libtpu` (the version jax[tpu] pins) and rerun"}
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    name = _tpu_topology_name(train.TARGET, chips)
    if name is None:
        return {"tpu": f"no known TPU topology for {chips} chips of {train.TARGET}"}
    try:
        topo = topologies.get_topology_desc(name, "tpu")
        mesh = mod.make_mesh(list(topo.devices))
        state = train.abstract_state(cfg, tc, mesh)  # (its PRNG key cannot run on a topology)
        tokens = jax.ShapeDtypeStruct((tc.batch, tc.seq + 1), jnp.int32, sharding=train.batch_sharding(mesh))
        t0 = time.perf_counter()
        step = train.make_train_step(cfg, tc, mesh)
        with jax.set_mesh(mesh):
            compiled = step.lower(state, tokens).compile()
        seconds = round(time.perf_counter() - t0, 2)
        return {"tpu_topology": name, "xla": _memory_stats(compiled.memory_analysis()), "compile_s": seconds}
    except Exception as exc:  # noqa: BLE001
        return {"tpu": f"compiling for TPU topology {name} failed: {_short(exc)}"}


def _tpu_topology_name(target: str, chips: int) -> str | None:
    m = re.match(r"tpu-(v\d+[a-z]*)", target)
    if not m:
        return None
    gen = m.group(1)
    table = TPU_TOPOLOGY_2D if gen in ("v5e", "v6e") else TPU_TOPOLOGY_3D
    shape = table.get(chips)
    return f"{gen}:{shape}" if shape else None


def _memory_stats(ma) -> dict:
    if ma is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")
    return {k.replace("_size_in_bytes", ""): int(getattr(ma, k, 0) or 0) for k in keys}


def xla_total(xla: dict) -> int:
    """Peak bytes per device by XLA's accounting: arguments + temporaries + non-donated outputs."""
    return xla["argument"] + xla["temp"] + max(xla["output"] - xla["alias"], 0)


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ---------------------------------------------------------------------------- the report
def _gib(n: float) -> str:
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"


def _si(n: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} "


def render(r: Report) -> str:
    e, f, p = r.estimate, r.flops, r.profile
    mesh = " ".join(f"{k}={v}" for k, v in e.mesh.items() if v > 1) or "one chip"
    lines = [
        f"axdsl aot: {r.model} ({r.spec}) on {r.target}: {e.chips} x {p.description}, "
        f"{_gib(r.hbm)} each",
        f"  mesh {mesh}; batch {e.batch} x seq {e.seq}"
        + (f" in {e.microbatches} micro-batches" if e.microbatches > 1 else "")
        + f"; remat {e.remat}; optimizer {e.optimizer}",
        f"  {r.params_total / 1e9:.3g} B parameters ({r.params_embedding / 1e9:.3g} B in embeddings)"
        if r.params_total >= 1e8 else
        f"  {r.params_total:,} parameters ({r.params_embedding:,} in embeddings)",
        "",
        "memory per chip (analytic: axdsl/analysis/memory.py)",
        f"  parameters        {_gib(e.params):>12}",
        f"  gradients         {_gib(e.grads):>12}",
        f"  optimizer state   {_gib(e.opt_state):>12}   ({e.optimizer})",
    ]
    if e.weight_copies:
        lines.append(f"  weight copies     {_gib(e.weight_copies):>12}   "
                     "(compute-dtype parameters and their gradients)")
    lines += [
        f"  activations       {_gib(e.activations):>12}   saved {_gib(e.saved)} "
        f"({e.layers} layers x {_gib(e.saved_per_layer)} + outside the scan), "
        f"working {_gib(e.working)} ({'loss' if e.working_kind == 'loss' else 'one layer backward'})",
    ]
    if e.offloaded:
        lines.append(f"  offloaded to host {_gib(e.offloaded):>12}   (not on the chip)")
    if e.update:
        lines.append(f"  optimizer update  {_gib(e.update):>12}   (new parameters and moments before the "
                     f"skip-if-not-finite select; after the backward, so only the larger counts)")
    phase = "the optimizer update" if e.peak_phase == "update" else "the backward pass"
    lines.append(f"  peak:             {phase}")
    lines += [
        f"  batch             {_gib(e.inputs):>12}",
        f"  total             {_gib(e.total):>12}   of {_gib(r.hbm)} HBM "
        f"({100 * e.total / r.hbm:.0f}%; usable {USABLE_FRACTION:.0%}: {_gib(r.usable)})",
    ]
    if r.fits:
        lines.append(f"  => fits: {_gib(r.usable - e.total)} to spare")
    else:
        lines.append(f"  => does NOT fit: {_gib(e.total - r.usable)} over the usable memory")
        lines.append("  to make it fit, any of:")
        lines += [f"    - {s}" for s in r.suggestions]
    peak = p.peak_flops("bf16")
    step_flops = f.per_step(e.batch)
    ideal = step_flops / (peak * e.chips)
    lines += [
        "",
        "compute (model FLOPs, MaxText's formula: 6 x params-in-matmuls + attention)",
        f"  per token (train)    {_si(f.train_per_token)}FLOP   (matmuls {_si(3 * f.matmul)}FLOP, "
        f"attention {_si(3 * f.attention)}FLOP at seq {f.seq})",
        f"  per step             {_si(step_flops)}FLOP   ({e.batch * e.seq:,} tokens)",
        f"  ideal step time      {ideal * 1e3:.4g} ms at the bf16 peak ({_si(peak)}FLOP/s x {e.chips} chips, "
        f"100% MFU); {ideal / 0.4 * 1e3:.4g} ms at 40% MFU",
        f"  ideal throughput     {e.batch * e.seq / ideal:,.0f} tokens/s",
    ]
    lines += ["", "XLA"] + _render_lowering(r)
    lines += ["", "Memory and FLOPs above are analytic (from the IR); XLA's own figures are shown "
                  "only where it compiled for the target."]
    return "\n".join(lines)


def _render_lowering(r: Report) -> list[str]:
    lo, e = r.lowering, r.estimate
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
    xla = lo.get("xla")
    if xla and lo.get("tpu_topology") and not xla["temp"]:
        out += [
            f"  compiled for TPU topology {lo['tpu_topology']} in {lo.get('compile_s')} s: XLA reports "
            f"arguments {_gib(xla['argument'])} per chip (analytic {_gib(e.state)}; TPU pads the two "
            f"minor dims of every array to (8, 128) tiles, which the analytic figures do not model)",
            "  this ahead-of-time TPU executable reports no temporaries (temp_size 0), so activations "
            "and the total stay analytic",
        ]
        xla = None
    elif xla:
        where = f"TPU topology {lo['tpu_topology']}" if lo.get("tpu_topology") else "this CPU"
        total = xla_total(xla)
        out += [
            f"  compiled for {where}" + (f" in {lo['compile_s']} s" if "compile_s" in lo else "")
            + ": memory_analysis() per device vs analytic",
            f"    arguments (state + batch)  XLA {_gib(xla['argument']):>11}   analytic {_gib(e.state):>11}"
            f"   ({_pct(e.state, xla['argument'])})",
            f"    temporaries                XLA {_gib(xla['temp']):>11}   analytic {_gib(e.temporaries):>11}"
            f"   ({_pct(e.temporaries, xla['temp'])})",
            f"    outputs not donated        XLA {_gib(max(xla['output'] - xla['alias'], 0)):>11}",
            f"    total                      XLA {_gib(total):>11}   analytic {_gib(e.total):>11}"
            f"   ({_pct(e.total, total)})",
        ]
    if lo.get("compile_note"):
        out.append(f"  {lo['compile_note']}")
    if lo.get("tpu"):
        out.append(f"  TPU: {lo['tpu']}")
    elif r.profile.kind == "gpu" and not xla:
        out.append("  GPU: exact per-chip figures need a compile on a machine with the GPU "
                   "(jax cannot compile for CUDA without one); run `axdsl aot ... --compile` there")
    return out


def _pct(analytic: float, xla: float) -> str:
    if not xla:
        return "n/a"
    return f"analytic {100 * (analytic - xla) / xla:+.1f}%"


# ---------------------------------------------------------------------------- subprocess side
def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m axdsl.aot")
    p.add_argument("spec", type=Path)
    p.add_argument("--target", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--lower", action="store_true", help="only lower; print the result as one JSON line")
    args = p.parse_args(argv)
    if not args.lower:
        return run(args.spec, args.target, args.model, args.batch, args.seq, compile=args.compile)
    from axdsl.build import build_files
    from axdsl.pipeline import compile_spec

    module = compile_spec(args.spec, args.target)
    train = module.train_settings
    sched = module.schedule
    _request_devices(sched.chips)
    result = _lower_here(build_files(args.spec, args.target), args.model or module.models[0].name,
                         args.batch or train.get("batch"), args.seq or train.get("seq"),
                         sched.chips, sched.kind, args.compile)
    print(RESULT_TAG + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
