"""The generated tpu-v5e code on a real TPU v5e chip: splash attention against XLA's, int8 against
bf16 training, tokens/s, MFU and peak memory against `axdsl aot`.

    python benchmarks/tpu_check.py prepare DIR    # here (needs axdsl, not jax): build, aot, plan.json
    python benchmarks/tpu_check.py run DIR        # on the TPU machine (jax, optax, orbax, tqdm only)
    python benchmarks/tpu_check.py --dry-run      # both on this CPU, with cpu builds of tiny_llama

`prepare` builds tpu-v5e-1 code for Llama 3.2 1B (specs/llama3_2_1b.axl) cut to LAYERS layers, with 16
heads of 128 (splash tiles head_dim by 128; the real model has 32 of 64), at
seq SEQ, batch BATCH, so that its float32 master weights and AdamW state fit one 16 GiB chip: once
as the target schedules it (splash attention, int8 matmuls), once without quantization ("bf16")
and once with XLA's attention instead of splash ("xla"). It writes plan.json with `axdsl aot`'s
analytic peak memory of each. `run` needs nothing of axdsl: generated code imports jax, numpy,
optax, orbax and tqdm only. On the chip it
1. compares the forward logits of the unquantized build (splash attention) with the xla build
   from the same parameters:
   bound: max |splash - xla| <= ATTN_BOUND x max |xla|;
2. trains STEPS steps of the bf16 and the int8 builds from the same initial state and data and
   compares the loss curves: bound: the mean of the last 10 losses within INT8_BOUND (relative);
3. prints tokens/s and MFU (train.py's MODEL_FLOPS against the profile's bf16 peak) of each, the
   int8 / bf16 speed-up, and the chip's peak memory next to aot's analytic total.
It prints a markdown table for benchmarks/RESULTS.md and exits 1 when a bound fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

LAYERS, SEQ, BATCH, STEPS = 4, 2048, 4, 30
ATTN_BOUND, INT8_BOUND = 2e-2, 0.02
TARGET = "tpu-v5e-1"
CUT = """# llama3_2_1b (specs/llama3_2_1b.axl) cut to {layers} layers to fit one TPU v5e chip, by
# benchmarks/tpu_check.py.
import "std/transformer.axl"

model llama3_2_1b_cut = DecoderLM {{
  vocab = 128256  dim = 2048  layers = {layers}  heads = 16  kv_heads = 8  ffn = 8192  tied = true
  rope_theta = 500000.0  max_seq = {seq}
  norm = RMSNorm(eps = 1e-5)
  dtype = bf16  param_dtype = f32
}}

train {{
  batch = {batch}  seq = {seq}  steps = {steps}
  optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1)
  schedule = cosine(warmup = 5, final = 0.1)
}}

target "*" {{ {schedule} }}
"""
# name -> the schedule lines that differ: the target's own, unquantized, XLA attention
SCHEDULES = {"int8": "", "bf16": "quantize(none)", "xla": "quantize(none) kernels(attention = xla)"}


def prepare(out: Path, dry: bool) -> dict:
    """Build every variant into `out` (a package root), run aot on each; write and return plan.json."""
    from gpu_check import analytic_total, build

    out.mkdir(parents=True, exist_ok=True)
    plan = {"target": "cpu" if dry else TARGET, "runs": {}}
    for name, schedule in SCHEDULES.items():
        if dry:  # tiny_llama for cpu, the same three schedules (int8 is emulated on CPU)
            specs = shutil.copytree(REPO / "specs", out / f"spec_{name}", dirs_exist_ok=True)
            spec = specs / "tiny_llama.axl"
            spec.write_text(spec.read_text() + f'\ntarget "cpu" {{ {schedule or "quantize(int8)"} }}\n')
            batch, seq = 8, 128
        else:
            spec = out / f"spec_{name}" / "llama3_2_1b_cut.axl"
            spec.parent.mkdir(parents=True, exist_ok=True)
            spec.write_text(CUT.format(layers=LAYERS, seq=SEQ, batch=BATCH, steps=STEPS, schedule=schedule))
            batch, seq = BATCH, SEQ
        gen = build(spec, plan["target"], out / f"gen_{name}")
        module = f"gen_{name}.{gen.parent.name}.{gen.name}"
        plan["runs"][name] = {"module": module, "aot_bytes": analytic_total(spec, plan["target"], batch, seq)}
    plan["steps"] = 6 if dry else STEPS
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


def logits_check(root: Path, splash: str, xla: str) -> float:
    """max |splash - xla| / max |xla| of the two builds' forward logits, from the same parameters
    and one sequence of tokens (computed on the device: the logits never leave it)."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(root))
    a, b = (importlib.import_module(f"{m}.model") for m in (splash, xla))
    ta = importlib.import_module(f"{splash}.train")
    tc = ta.TRAIN
    cfg = ta.CONFIGS[tc.model]
    with jax.set_mesh(ta.make_mesh()):
        params = jax.jit(lambda key: a.init_params(cfg, key))(jax.random.key(0))
        tokens = jax.random.randint(jax.random.key(1), (1, tc.seq), 0, cfg.vocab)

        @jax.jit
        def error(params, tokens):
            got, want = a.forward(cfg, params, tokens), b.forward(cfg, params, tokens)
            return jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))

        return float(error(params, tokens))


def _isolated(root: Path, call: str) -> dict | float:
    """`call` (an expression over this module) in a fresh process: each its own chip and compile."""
    code = (f"import json, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import tpu_check; "
            f"from pathlib import Path; print(json.dumps(tpu_check.{call}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{call[:80]} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_run(root: str, module: str, steps: int) -> dict:
    """gpu_check.train_run: `steps` train steps; losses, tokens/s, MFU, the device's peak memory."""
    from gpu_check import train_run as run

    return run(Path(root), f"{module}.train", steps)


def run(root: Path) -> int:
    """The checks of the module docstring over a prepared directory; 1 when a bound fails."""
    plan = json.loads((root / "plan.json").read_text())
    runs, steps, failed = plan["runs"], plan["steps"], []
    began = time.perf_counter()
    err_bf16 = _isolated(root, f"logits_check(Path({str(root)!r}), {runs['bf16']['module']!r}, "
                               f"{runs['xla']['module']!r})")
    ok = err_bf16 <= ATTN_BOUND
    failed += [] if ok else ["attention"]
    print(f"logits, the target's attention kernel vs XLA's (unquantized): max error {err_bf16:.2e} of the max "
          f"(bound {ATTN_BOUND:g}) {'ok' if ok else 'FAIL'}", flush=True)
    results = {name: _isolated(root, f"train_run({str(root)!r}, {runs[name]['module']!r}, {steps})")
               for name in ("bf16", "int8")}
    b, q = results["bf16"], results["int8"]
    tail = min(10, steps)
    mean = lambda xs: sum(xs[-tail:]) / tail  # noqa: E731
    drift = abs(mean(q["losses"]) - mean(b["losses"])) / mean(b["losses"])
    ok = drift <= INT8_BOUND
    failed += [] if ok else ["int8 loss"]
    print(f"loss over {steps} steps: bf16 {b['losses'][0]:.4f} -> {b['losses'][-1]:.4f}, int8 "
          f"{q['losses'][0]:.4f} -> {q['losses'][-1]:.4f}; last-{tail} means differ by {drift:.2%} "
          f"(bound {INT8_BOUND:.0%}) {'ok' if ok else 'FAIL'}")
    where = (f"llama3_2_1b cut to {LAYERS} layers on one TPU v5e, batch {BATCH} x seq {SEQ}"
             if plan["target"] != "cpu" else "tiny_llama on this CPU")
    print(f"\n{where}:\n| run | tokens/s | MFU | peak memory | aot analytic |\n|---|---|---|---|---|")
    for name, r in results.items():
        peak = f"{r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] else "n/a"
        print(f"| {name} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | {peak} | "
              f"{runs[name]['aot_bytes'] / 2**30:.2f} GiB |")
    print(f"\nint8 / bf16 tokens/s: {q['tokens_per_s'] / b['tokens_per_s']:.2f}x; checks took "
          f"{time.perf_counter() - began:.0f} s")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    print("tpu check passed")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", nargs="?", choices=("prepare", "run"), help="prepare here, run on the TPU")
    p.add_argument("dir", nargs="?", type=Path, help="the prepared directory")
    p.add_argument("--dry-run", action="store_true", help="prepare and run cpu builds on this CPU")
    args = p.parse_args(argv)
    if args.dry_run:
        tmp = Path(tempfile.mkdtemp(prefix="tpu_check_"))
        try:
            prepare(tmp, dry=True)
            code = run(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print("dry run passed" if code == 0 else "dry run FAILED")
        return code
    if args.stage is None or args.dir is None:
        p.error("give prepare DIR or run DIR, or --dry-run")
    if args.stage == "prepare":
        plan = prepare(args.dir, dry=False)
        print(f"prepared {args.dir}: " + ", ".join(f"{n} aot {r['aot_bytes'] / 2**30:.2f} GiB"
                                                  for n, r in plan["runs"].items()))
        return 0
    try:
        return run(args.dir)
    except RuntimeError as exc:
        print(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
