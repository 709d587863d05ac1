"""The GPU check of issue 14, for one H200: what benchmarks/gpu_check.sh runs (under 8 minutes).

    bash benchmarks/gpu_check.sh              # on a machine with one NVIDIA H200
    bash benchmarks/gpu_check.sh --dry-run    # anywhere: builds everything, runs the checks on CPU

On the GPU it
1. builds gpu-h200-1 code for tiny_llama and for a llama3_8b-shaped stack cut to fit one chip
   (LAYERS layers, seq 8192, batch 1), once unquantized and once with fp8 matmuls;
2. compares cuDNN attention with XLA's on llama3_8b's attention shape (bf16, causal, GQA):
   bound: max |cudnn - xla| <= ATTN_BOUND x max |xla|;
3. trains STEPS steps of the cut stack in bf16 and in fp8 from the same initial state and data and
   compares the loss curves: bound: the mean of the last 10 losses within FP8_BOUND (relative);
4. prints tokens/s and MFU (train.py's MODEL_FLOPS against the profile's bf16 peak) of each, the
   fp8 / bf16 speed-up, and the device's peak memory next to `axdsl aot`'s analytic total.
It prints a markdown table for benchmarks/RESULTS.md and exits 1 when a bound fails.

--dry-run builds the same gpu-h200-1 code (the build never needs jax) and runs `axdsl aot` on it,
then runs the same checks on this CPU, where cuDNN does not exist: tiny_llama built for cpu with and
without `quantize(fp8)`, a few steps each, and XLA's attention against a plain einsum reference. It
exercises every line of the harness except the GPU kernels themselves.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LAYERS, SEQ, STEPS = 4, 8192, 50
ATTN_BOUND, FP8_BOUND = 2e-2, 0.02
CUT = """# llama3_8b (specs/llama3_8b.axl) cut to {layers} layers to fit one chip, by benchmarks/gpu_check.py.
import "std/transformer.axl"

model llama3_8b_cut = DecoderLM {{
  vocab = 128256  dim = 4096  layers = {layers}  heads = 32  kv_heads = 8  ffn = 14336
  rope_theta = 500000.0  max_seq = {seq}
  norm = RMSNorm(eps = 1e-5)
  dtype = bf16  param_dtype = f32
}}

train {{
  batch = 1  seq = {seq}  steps = {steps}
  optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1)
  schedule = cosine(warmup = 5, final = 0.1)
}}

target "*" {{ quantize({quant}) }}
"""


def build(spec: Path, target: str, out: Path) -> Path:
    """`axdsl build` into `out`; the directory of the generated train.py."""
    subprocess.run([sys.executable, "-m", "axdsl", "build", str(spec), "--target", target, "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    (out / "__init__.py").touch()
    return next(p.parent for p in out.glob(f"{spec.stem}/*/train.py"))


def cut_specs(tmp: Path, layers: int, seq: int, steps: int) -> dict[str, Path]:
    """The cut stack unquantized ("bf16") and with fp8 matmuls ("fp8")."""
    out = {}
    for name, quant in (("bf16", "none"), ("fp8", "fp8")):
        path = tmp / f"spec_{name}" / "llama3_8b_cut.axl"
        path.parent.mkdir(parents=True)
        path.write_text(CUT.format(layers=layers, seq=seq, steps=steps, quant=quant))
        out[name] = path
    return out


def attention_check(dry: bool) -> tuple[float, str]:
    """(max error relative to the reference's max, what was compared)."""
    import jax
    import jax.numpy as jnp

    shape = (1, 256, 4, 64) if dry else (1, SEQ, 32, 128)
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, shape, jnp.bfloat16)
    k = jax.random.normal(kk, (*shape[:2], shape[2] // 4, shape[3]), jnp.bfloat16)
    v = jax.random.normal(kv, k.shape, jnp.bfloat16)
    xla = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"))
    want = xla(q, k, v).astype(jnp.float32)
    if dry:  # no cuDNN here: XLA against a float32 einsum, to check the harness
        got, what = _einsum_attention(q, k, v), f"XLA vs float32 einsum, {shape}"
    else:
        cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                     implementation="cudnn"))
        got, what = cudnn(q, k, v).astype(jnp.float32), f"cuDNN vs XLA, bf16 {shape}"
    return float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))), what


def _einsum_attention(q, k, v):
    import jax
    import jax.numpy as jnp

    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    n = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def train_run(package_root: Path, module: str, steps: int) -> dict:
    """`steps` train steps of a generated train.py: losses, tokens/s after the first 3, MFU, peak memory."""
    import jax

    sys.path.insert(0, str(package_root))
    tm = importlib.import_module(module)
    tc = tm.TRAIN
    cfg = tm.CONFIGS[tc.model]
    mesh = tm.make_mesh()
    tokens, _ = tm.runtime.split(tm.runtime.stdlib_bytes(8 << 20))
    losses, times = [], []
    with jax.set_mesh(mesh):
        sharding = tm.batch_sharding(mesh)
        state = tm.init_state(cfg, tc, mesh, jax.random.key(tc.seed))
        step = tm.make_train_step(cfg, tc, mesh)
        for i in range(steps):
            batch = tm.runtime.get_batch(tokens, tc, i, sharding)
            began = time.perf_counter()
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))  # waits for the step
            times.append(time.perf_counter() - began)
    timed = times[3:] or times
    tokens_per_s = tc.batch * tc.seq * len(timed) / sum(timed)
    flops = tm.MODEL_FLOPS[tc.model].per_token(tc.seq) * tokens_per_s / jax.device_count()
    stats = jax.devices()[0].memory_stats() or {}
    return {"losses": losses, "tokens_per_s": tokens_per_s, "mfu": flops / tm.PEAK_FLOPS_PER_CHIP,
            "peak_bytes": stats.get("peak_bytes_in_use")}


def _start_isolated(package_root: Path, module: str, steps: int) -> subprocess.Popen:
    """train_run in a fresh process (each run its own device memory and compile)."""
    code = (f"import json, sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import gpu_check; "
            f"print(json.dumps(gpu_check.train_run(gpu_check.Path({str(package_root)!r}), {module!r}, {steps})))")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    """What a _start_isolated process printed: its train_run figures."""
    import json

    out, err = proc.communicate()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    return json.loads(out.strip().splitlines()[-1])


def _run_all(package_root: Path, modules: dict[str, str], steps: int, together: bool) -> dict[str, dict]:
    """train_run for each module in its own process: one after another on the device (each run
    alone on the chip, so its tokens/s and peak memory are its own), side by side on CPU for the
    dry run (it checks the harness, and its figures mean nothing)."""
    if together:
        procs = {name: _start_isolated(package_root, m, steps) for name, m in modules.items()}
        return {name: _result(proc) for name, proc in procs.items()}
    return {name: _result(_start_isolated(package_root, m, steps)) for name, m in modules.items()}


def analytic_total(spec: Path, target: str, batch: int, seq: int) -> int:
    from axdsl.aot import analyze

    return analyze(spec, target, batch=batch, seq=seq, lower=False).estimate.total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="build and lower everything; run the checks on CPU")
    args = p.parse_args(argv)
    dry = args.dry_run
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    failed = []
    try:
        cut = cut_specs(tmp, LAYERS, SEQ, STEPS)
        began = time.perf_counter()
        build(REPO / "specs" / "tiny_llama.axl", "gpu-h200-1", tmp / "gen_tiny")
        gpu_dirs = {name: build(spec, "gpu-h200-1", tmp / f"gen_{name}") for name, spec in cut.items()}
        print(f"built gpu-h200-1 code for tiny_llama and llama3_8b_cut ({LAYERS} layers, seq {SEQ}; bf16 and "
              f"fp8) in {time.perf_counter() - began:.1f} s", flush=True)
        analytic = {name: analytic_total(spec, "gpu-h200-1", 1, SEQ) for name, spec in cut.items()}
        print(f"axdsl aot llama3_8b_cut on gpu-h200-1, batch 1 x seq {SEQ}: "
              + ", ".join(f"{name} {a / 2**30:.2f} GiB" for name, a in analytic.items()) + " per chip")

        err, what = attention_check(dry)
        ok = err <= ATTN_BOUND
        failed += [] if ok else ["attention"]
        print(f"attention, {what}: max error {err:.2e} of the max (bound {ATTN_BOUND:g}) {'ok' if ok else 'FAIL'}")

        if dry:  # the same harness on this CPU: tiny_llama with and without fp8 matmuls
            steps = 6
            tiny = {}
            for name, quant in (("bf16", "none"), ("fp8", "fp8")):
                specs = shutil.copytree(REPO / "specs", tmp / f"tiny_{name}")  # tiny_llama imports llama3_8b
                spec = specs / "tiny_llama.axl"
                spec.write_text(spec.read_text() + f'\ntarget "cpu" {{ quantize({quant}) }}\n')
                tiny[name] = build(spec, "cpu", tmp / f"cpu_{name}")
            dirs = tiny
        else:
            steps, dirs = STEPS, gpu_dirs
        modules = {name: f"{d.parent.parent.name}.{d.parent.name}.{d.name}.train" for name, d in dirs.items()}
        runs = _run_all(tmp, modules, steps, together=dry)
        b, f = runs["bf16"], runs["fp8"]
        tail = min(10, steps)
        mean = lambda xs: sum(xs[-tail:]) / tail  # noqa: E731
        drift = abs(mean(f["losses"]) - mean(b["losses"])) / mean(b["losses"])
        ok = drift <= FP8_BOUND
        failed += [] if ok else ["fp8 loss"]
        print(f"loss over {steps} steps: bf16 {b['losses'][0]:.4f} -> {b['losses'][-1]:.4f}, fp8 {f['losses'][0]:.4f} "
              f"-> {f['losses'][-1]:.4f}; last-{tail} means differ by {drift:.2%} (bound {FP8_BOUND:.0%}) "
              f"{'ok' if ok else 'FAIL'}")
        where = "tiny_llama on this CPU" if dry else f"llama3_8b_cut on one H200, batch 1 x seq {SEQ}"
        print(f"\n{where}:\n| run | tokens/s | MFU | peak memory | aot analytic (gpu-h200-1 cut) |\n"
              "|---|---|---|---|---|")
        for name, r in runs.items():
            peak = f"{r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] else "n/a"
            print(f"| {name} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | {peak} | "
                  f"{analytic[name] / 2**30:.2f} GiB |")
        print(f"\nfp8 / bf16 tokens/s: {f['tokens_per_s'] / b['tokens_per_s']:.2f}x"
              + (" (on CPU: fp8 is emulated, this figure means nothing)" if dry else ""))
    except subprocess.CalledProcessError as e:  # its own stderr has said why
        print(f"FAILED: {' '.join(map(str, e.cmd))[:200]} exited {e.returncode}\n{(e.stderr or '')[-2000:]}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    print("dry run passed" if dry else "gpu check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
