"""Model FLOP utilization of generated tpu-v5e-1 code on one TPU v5e chip, real shapes cut to fit.

    python benchmarks/tpu_bench.py prepare DIR [--variants]  # here: build every config, plan.json
    python benchmarks/tpu_bench.py run DIR [--only NAME ...]  # on the chip: jax, optax, orbax, tqdm
    python benchmarks/tpu_bench.py --dry-run                  # tiny cpu builds of the same configs

`prepare` cuts real shapes from specs/ to one 16 GiB chip (fewer layers or experts; every width,
head count, head_dim, vocabulary and attention feature kept) and builds each with `axdsl build
--target tpu-v5e-1`: once as the compiler schedules it (its remat, quantization and kernels:
"chosen") and, with --variants, once per schedule written in a target block, to weigh the levers.
It records each build's analytic memory (`axdsl aot` without lowering) and model FLOPs.

`run` needs nothing of axdsl. Each config runs in a process of its own (one program holds the chip
at a time); for each build it compiles the generated `make_train_step`, records XLA's
`memory_analysis()` (not `cost_analysis()`: it counts a scan's body once), runs WARMUP + STEPS
steps on the default data and prints tokens/s and MFU: the generated train.py's model FLOPs per
token (MODEL_FLOPS, MaxText's formula) x tokens/s over the chip's 197 TFLOP/s bf16 peak. A build
XLA refuses for memory is reported as "does not fit" with XLA's figure. Results are also written
as JSON lines to RESULTS (default DIR/results.jsonl). It prints a markdown table for
benchmarks/RESULTS.md. The goals (issue 34): dense >= 55%, 32k context >= 55%, MoE >= 35%,
Mamba-2 >= 30%.

benchmarks/gpu_bench.py runs the same machinery on one H200: its own configs, builds and table,
the peak and XLA figure it writes into plan.json, a process per build and a time budget for all.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = "tpu-v5e-1"
PEAK = 197e12  # bf16 FLOP/s of one v5e chip (the profile's peak_tflops)
WARMUP, STEPS = 2, 8
GOALS = {"dense": 0.55, "long": 0.55, "moe": 0.35, "ssm": 0.30}


@dataclasses.dataclass(frozen=True)
class Config:
    """One real shape cut to one chip: `spec` is copied, `cut` extends its first model."""

    name: str
    kind: str  # a key of GOALS
    spec: str  # specs/<spec>.axl
    base: str  # the model the cut extends
    tiny: str  # the spec's test-size model, which a dry run extends instead
    cut: str  # the settings that differ from `base`, in .axl
    batch: int
    seq: int
    why: str  # what was cut and why
    edit: tuple[str, str] = ("", "")  # a size inside a block, replaced in the copied spec (old, new)


CONFIGS = (
    Config("llama1b", "dense", "llama3_2_1b", "llama3_2_1b", "llama3_2_tiny",
           "max_seq = 2048  param_dtype = bf16", 4, 2048,
           "Llama 3.2 1B whole (16 layers, 32 heads of 64): bf16 weights and AdamW moments"),
    Config("llama_32k", "long", "llama3_2_1b", "llama3_2_1b", "llama3_2_tiny",
           "layers = 2  heads = 16  kv_heads = 8  max_seq = 32768", 1, 32768,
           "Llama 3.2 1B width, 2 layers of 16 heads of 128, one sequence of 32,768 tokens"),
    Config("gemma2", "dense", "gemma2_2b", "gemma2_2b", "gemma2_tiny",
           "layers = 6  param_dtype = bf16", 1, 8192,
           "Gemma 2 2B cut to 6 layers (local and global, head_dim 256, soft caps), bf16 weights"),
    Config("qwen3_moe", "moe", "qwen3_30b_a3b", "qwen3_30b_a3b", "qwen3_30b_a3b_tiny",
           "layers = 2  param_dtype = bf16  max_seq = 2048", 2, 2048,
           "Qwen3-30B-A3B cut to 2 layers of 16 experts (top 8 of 768 wide, as in the model: the "
           "same work per token), bf16 weights", ("experts = 128", "experts = 16")),
    Config("qwen3_moe_l1", "moe", "qwen3_30b_a3b", "qwen3_30b_a3b", "qwen3_30b_a3b_tiny",
           "layers = 1  param_dtype = bf16  max_seq = 2048", 2, 2048,
           "Qwen3-30B-A3B cut to 1 layer of 32 experts (top 8 of 768 wide), bf16 weights",
           ("experts = 128", "experts = 32")),
    Config("mamba2", "ssm", "mamba2_2_7b", "mamba2_2_7b", "mamba2_tiny", "layers = 4", 4, 2048,
           "Mamba-2 2.7B cut to 4 layers (80 heads, dim 2560), f32 weights"),
)
# schedule variants weighed with --variants (target-block lines; they keep the target's int8),
# and the configs each is tried on
VARIANTS = {
    "save_dots": ("remat(save_dots)", ("llama1b", "llama_32k", "gemma2", "qwen3_moe", "qwen3_moe_l1",
                                       "mamba2")),
    "save_ctx": ("remat(save = [context])", ("llama1b", "llama_32k", "gemma2")),
    "save_qkv": ("remat(save = [query_proj, key_proj, value_proj, context])", ("llama1b",)),
    "save_qkv3": ("remat(save = [query_proj, key_proj, value_proj])", ("llama1b",)),
    "remat_none": ("remat(none)", ()),
    "bf16": ("quantize(none)", ()),
    "bf16_xla": ("quantize(none) kernels(attention = xla)", ()),
}
TRAIN = """
train {{
  batch = {batch}  seq = {seq}  steps = 100
  optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1)
  schedule = cosine(warmup = 5, final = 0.1)
}}
"""


# ---------------------------------------------------------------------------- prepare (here)
def cut_spec(config: Config, out: Path, schedule: str, dry: bool) -> Path:
    """specs/<spec>.axl with the cut model appended (the tiny variant's sizes on a dry run)."""
    text = (REPO / "specs" / f"{config.spec}.axl").read_text()
    if not dry:  # the train block's seq is checked against every model: drop the test-size one
        text = re.sub(rf"\nmodel {config.tiny} extends .*?\n}}\n", "\n", text, flags=re.S)
        # a size inside a block: the models of a spec share one parameter table, so it is
        # changed where it is written (the base model's) rather than by the cut's `extends`
        text = text.replace(*config.edit) if config.edit[0] else text
    base, cut = (config.tiny, "layers = 2") if dry else (config.base, config.cut)
    # the cut comes first: the train block trains a spec's first model, and fit_remat sizes for it
    imports = re.match(r"(?:\s*(?:#[^\n]*|import [^\n]*)\n)*", text).end()
    text = f"{text[:imports]}\nmodel {config.name}_cut extends {base} {{\n  {cut}\n}}\n{text[imports:]}"
    text += TRAIN.format(batch=2 if dry else config.batch, seq=128 if dry else config.seq)
    if schedule:
        text += f'\ntarget "*" {{ {schedule} }}\n'
    path = out / f"{config.name}.axl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def schedules_of(config: Config, variants: bool) -> dict[str, str]:
    """A config's builds: "chosen" (no schedule line), and with `variants` those of VARIANTS."""
    tried = {k: line for k, (line, names) in VARIANTS.items() if config.name in names}
    return {"chosen": ""} | (tried if variants else {})


def prepare(out: Path, variants: bool, dry: bool, target: str = TARGET,
            configs: tuple[Config, ...] = CONFIGS,
            schedules: Callable[[Config, bool], dict[str, str]] = schedules_of) -> dict:
    """Build every config (and variant) under `out`, a package root; write and return plan.json.
    `schedules` names each build of a config and the target-block line it is built with."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import build

    from axdsl.aot import analyze

    target = "cpu" if dry else target
    plan: dict = {"target": target, "runs": []}
    for config in configs:
        for name, schedule in schedules(config, variants and not dry).items():
            spec = cut_spec(config, out / f"spec_{config.name}_{name}", schedule, dry)
            model, package = f"{config.name}_cut", f"gen_{config.name}_{name}"
            gen = build(spec, target, out / package)
            report = analyze(spec, target, model=model, lower=False)
            plan["runs"].append({
                "config": config.name, "kind": config.kind, "variant": name, "model": model,
                "module": f"{package}.{gen.parent.name}.{gen.name}.train", "why": config.why,
                "batch": 2 if dry else config.batch, "seq": 128 if dry else config.seq,
                "analytic_bytes": report.estimate.total, "remat": str(report.estimate.remat),
                "fits": report.fits, "model_flops_per_token": report.flops.train_per_token,
            })
    (out / "__init__.py").touch()
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


# ---------------------------------------------------------------------------- run (on the chip)
def profile_steps(compiled, state, batch, where: Path) -> None:
    """A jax.profiler trace of two more steps, kept as where (a Perfetto JSON trace, gzipped)."""
    import glob

    import jax

    tmp = Path(tempfile.mkdtemp(prefix="trace_"))
    jax.profiler.start_trace(str(tmp), create_perfetto_trace=True)
    for _ in range(2):
        state, metrics = compiled(state, batch)
        float(metrics["loss"])
    jax.profiler.stop_trace()
    found = glob.glob(str(tmp / "**" / "perfetto_trace.json.gz"), recursive=True)
    if found:
        shutil.copy(found[0], where)


def chip_need(compiled, box: list, batch, fresh_state, tries: int = 6) -> tuple[int, object]:
    """The HBM the step really needs on this chip (arguments and temporaries), found by running it
    beside a filler array of the largest size that still lets it run: bytes_limit - filler.
    (The allocator's peak_bytes_in_use does not see the program's temporaries.) A run that fails
    may have consumed its donated state, so the state is made again after each failure; `box`
    holds the state so that no caller's frame keeps a failed call's arguments alive."""
    import gc

    import jax
    import jax.numpy as jnp

    stats = jax.devices()[0].memory_stats()
    limit, held = stats["bytes_limit"], stats["bytes_in_use"]
    state = box.pop()
    lo, hi = 0, limit - held  # the filler fits with the step at lo, not at hi
    for _ in range(tries):
        mid = (lo + hi) // 2
        failed = ""
        try:
            filler = jnp.zeros((mid // 4,), jnp.float32)
            state, metrics = compiled(state, batch)
            float(metrics["loss"])
        except Exception as exc:  # noqa: BLE001 - RESOURCE_EXHAUSTED is the answer sought
            if "RESOURCE_EXHAUSTED" not in str(exc):
                raise
            failed = str(exc).strip().splitlines()[0][:160]
        filler = metrics = None  # outside the except block: its traceback holds the arguments
        if not failed:
            lo = mid
            continue
        hi = mid
        print(f"  filler {mid / 2**30:.2f} GiB: {failed}", flush=True)
        state = None
        gc.collect()
        state = fresh_state()
    return limit - lo, state


def measure(root: str, run: dict, steps: int, profile: Path | None = None, fill: bool = False,
            peak: float = PEAK, xla_peak: bool = True) -> dict:
    """Compile one build's train step, then time `steps` steps after WARMUP: its figures. MFU is
    against `peak` FLOP/s; the XLA memory is its peak_memory_in_bytes with `xla_peak` (TPU), else
    arguments + temporaries + outputs not donated (XLA:GPU allocates its temporaries as one
    block)."""
    import jax

    sys.path.insert(0, root)
    tm = importlib.import_module(run["module"])
    tc = dataclasses.replace(tm.TRAIN, model=run["model"], batch=run["batch"], seq=run["seq"])
    cfg = tm.CONFIGS[tc.model]
    mesh = tm.make_mesh()
    out: dict = {k: run[k] for k in ("config", "variant", "batch", "seq", "analytic_bytes", "remat")}
    with jax.set_mesh(mesh):
        sharding = tm.batch_sharding(mesh)
        began = time.perf_counter()
        step = tm.make_train_step(cfg, tc, mesh)
        abstract = tm.abstract_state(cfg, tc, mesh)
        batch_shape = jax.ShapeDtypeStruct((tc.batch, tc.seq + 1), "int32", sharding=sharding)
        try:
            compiled = step.lower(abstract, batch_shape).compile()
        except Exception as exc:  # noqa: BLE001 - XLA refusing the step is a result, not a crash
            out["error"] = str(exc).strip().splitlines()[0][:400]
            return out
        out["compile_s"] = round(time.perf_counter() - began, 1)
        ma = compiled.memory_analysis()
        out["xla"] = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}
        out["xla_sum"] = out["xla"]["argument"] + out["xla"]["temp"] + max(out["xla"]["output"] - out["xla"]["alias"], 0)
        out["xla_bytes"] = (int(ma.peak_memory_in_bytes) if xla_peak else 0) or out["xla_sum"]
        # matmuls XLA kept in 8-bit floats (a quantize-dequantize can compile to a bf16 gemm)
        hlo = compiled.as_text() or ""
        out["f8_gemms"] = sum("f8e" in line and ("custom-call(" in line or " dot(" in line)
                              for line in hlo.splitlines())
        tokens, _ = tm.runtime.split(tm.runtime.stdlib_bytes(8 << 20))
        state = tm.init_state(cfg, tc, mesh, jax.random.key(tc.seed))
        times, losses = [], []
        for i in range(WARMUP + steps):
            batch = tm.runtime.get_batch(tokens, tc, i, sharding)
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch)
            losses.append(float(metrics["loss"]))  # waits for the step
            times.append(time.perf_counter() - t0)
        out["chip_peak"] = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        if fill:  # what the step really needs on the chip, for the memory model
            box, state, metrics = [state], None, None
            out["chip_need"], state = chip_need(
                compiled, box, batch, lambda: tm.init_state(cfg, tc, mesh, jax.random.key(tc.seed)))
        if profile is not None:
            profile_steps(compiled, state, batch, profile / f"{run['config']}_{run['variant']}.trace.json.gz")
    timed = sorted(times[WARMUP:])
    step_s = timed[len(timed) // 2]  # the median step
    per_token = tm.MODEL_FLOPS[tc.model].per_token(tc.seq)
    out.update(step_s=step_s, tokens_per_s=tc.batch * tc.seq / step_s, losses=losses,
               model_flops_per_token=per_token, mfu=per_token * tc.batch * tc.seq / step_s / peak)
    return out


def _measure_config(root: Path, config: str, steps: int, results: Path, profile: str = "",
                    fill: bool = False, variant: str | None = None) -> None:
    """Every build of one config (or its build `variant`), in this process (one chip holder), each
    result appended. The plan says the peak and the XLA figure (a GPU plan: its own)."""
    plan = json.loads((root / "plan.json").read_text())
    peak, xla_peak = plan.get("peak_flops", PEAK), plan.get("xla_memory", "peak") == "peak"
    runs = [r for r in plan["runs"] if r["config"] == config and variant in (None, r["variant"])]
    for run in runs:
        began = time.perf_counter()
        try:
            where = Path(profile) if profile else None
            r = measure(str(root), run, steps, where, fill, peak, xla_peak)
        except Exception as exc:  # noqa: BLE001 - one build failing must not hide the others
            r = {"config": config, "variant": run["variant"], "error": f"{type(exc).__name__}: {exc}"[:400]}
        r["wall_s"] = round(time.perf_counter() - began, 1)
        with results.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(_line(r), flush=True)
        import gc

        gc.collect()


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['config']:10s} {r['variant']:10s} ERROR {r['error'][:300]}"
    chip = "".join(f"{what} {r[k] / 2**30:5.2f} GiB  " for k, what in
                   (("chip_need", "chip needs"), ("chip_peak", "chip peak")) if r.get(k))
    return (f"{r['config']:10s} {r['variant']:10s} {r['tokens_per_s']:9.0f} tok/s  MFU {r['mfu']:6.1%}  "
            f"step {r['step_s'] * 1e3:7.1f} ms  XLA {r['xla_bytes'] / 2**30:5.2f} GiB  {chip}"
            f"analytic {r['analytic_bytes'] / 2**30:5.2f} GiB  compile {r['compile_s']} s  "
            f"loss {r['losses'][0]:.3f}->{r['losses'][-1]:.3f}")


def run(root: Path, only: list[str], steps: int, results: Path, timeout: int, profile: str = "",
        fill: bool = False, per_build: bool = False, budget: float | None = None,
        together: int = 1, report: Callable[[Path], None] | None = None) -> int:
    """Each config (with `per_build`, each build) in a fresh process, `together` at a time (one on
    a chip; more on a dry run's CPU cores), then the table (`report`). With a `budget` in seconds
    for them all, a process may take up to twice its share of what is left. The plan's `env` is
    set for them (a GPU plan's: XLA's memory pool)."""
    plan = json.loads((root / "plan.json").read_text())
    picked = [r for r in plan["runs"] if not only or r["config"] in only]
    units = list(dict.fromkeys((r["config"], r["variant"] if per_build else None) for r in picked))
    env = os.environ | plan.get("env", {})

    def start(config: str, variant: str | None) -> subprocess.Popen:
        code = (f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import tpu_bench; "
                f"from pathlib import Path; tpu_bench._measure_config(Path({str(root)!r}), {config!r}, "
                f"{steps}, Path({str(results)!r}), {profile!r}, {fill!r}, {variant!r})")
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

    began = time.perf_counter()
    started: list[subprocess.Popen] = []
    for i, (config, variant) in enumerate(units):
        started += [start(*unit) for unit in units[len(started):i + together]]
        limit = timeout
        if budget is not None:
            left = budget - (time.perf_counter() - began)
            limit = int(max(min(timeout, 2 * left / (len(units) - i)), 1))
        name = f"{config} {variant or ''}".strip()
        print(f"[{time.perf_counter() - began:5.0f} s] {name}: up to {limit} s", flush=True)
        proc = started[i]
        try:
            said, err = proc.communicate(timeout=limit)
            failed = f"exited {proc.returncode}: {err[-1500:]}" if proc.returncode else ""
        except subprocess.TimeoutExpired:
            proc.kill()
            said, _ = proc.communicate()
            failed = f"over {limit} s, stopped"
        print(said, end="", flush=True)
        if failed:
            print(f"{name}: {failed}", flush=True)
            if variant is not None:  # the build's row says why it has no figures
                row = {"config": config, "variant": variant, "error": failed[-400:]}
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    (report or table)(results)
    return 0


def table(results: Path) -> None:
    """The markdown table of every result line."""
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    print("\n| config | schedule | tokens/s | MFU | step | XLA memory | analytic | analytic/XLA |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['config']} | {r['variant']} | - | - | - | {r['error'][:120]} | - | - |")
            continue
        print(f"| {r['config']} | {r['variant']} ({r.get('remat')}) | {r['tokens_per_s']:,.0f} | "
              f"{r['mfu']:.1%} | {r['step_s'] * 1e3:.0f} ms | "
              f"{r['xla_bytes'] / 2**30:.2f} GiB | {r['analytic_bytes'] / 2**30:.2f} GiB | "
              f"{r['analytic_bytes'] / r['xla_bytes'] - 1:+.0%} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", nargs="?", choices=("prepare", "run"), help="prepare here, run on the TPU")
    p.add_argument("dir", nargs="?", type=Path, help="the prepared directory")
    p.add_argument("--variants", action="store_true", help="prepare: also each schedule of VARIANTS")
    p.add_argument("--only", nargs="*", default=[], help="run: these configs only")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps per build")
    p.add_argument("--results", type=Path, help="run: JSON lines out (default DIR/results.jsonl)")
    p.add_argument("--timeout", type=int, default=300, help="run: seconds per config's process")
    p.add_argument("--profile", default="", help="run: also trace two steps per build into this folder")
    p.add_argument("--fill", action="store_true",
                   help="run: also find the HBM each step really needs (a filler array, bisected)")
    p.add_argument("--dry-run", action="store_true", help="prepare and run tiny cpu builds here")
    args = p.parse_args(argv)
    if args.dry_run:
        tmp = Path(tempfile.mkdtemp(prefix="tpu_bench_"))
        try:
            prepare(tmp, variants=False, dry=True)
            return run(tmp, args.only, 2, tmp / "results.jsonl", args.timeout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.stage is None or args.dir is None:
        p.error("give prepare DIR or run DIR, or --dry-run")
    if args.stage == "prepare":
        plan = prepare(args.dir, args.variants, dry=False)
        for r in plan["runs"]:
            print(f"{r['config']:10s} {r['variant']:10s} remat {r['remat']:10s} analytic "
                  f"{r['analytic_bytes'] / 2**30:.2f} GiB")
        return 0
    return run(args.dir, args.only, args.steps, args.results or args.dir / "results.jsonl", args.timeout,
               str(args.profile), args.fill)


if __name__ == "__main__":
    sys.exit(main())
