"""Model FLOP utilization of generated gpu-h200-1 code on one NVIDIA H200, bf16 against fp8.

    python benchmarks/gpu_bench.py prepare bench_gpu  # here: build every config twice, plan.json
    python benchmarks/gpu_bench.py run bench_gpu [--only NAME ...] [--profile DIR]  # on the chip
    python benchmarks/gpu_bench.py --dry-run [--only NAME ...]  # tiny cpu builds, run here

The machinery is benchmarks/tpu_bench.py's (its Config, cut_spec, prepare, measure, run and
profile_steps); what differs is here: the configs, sized with the analytic memory model
(`axdsl.aot.analyze(..., lower=False)`) for the H200's pool (mem_fraction 0.90 of 140.4 GiB,
126.4 GiB), and two builds of each, a target block `quantize(none)` ("bf16") and `quantize(fp8)`
("fp8"). `prepare` prints each build's analytic memory and verdict, its remat, whether the
generated model runs fp8 matmuls and which attention kernel it calls (cudnn or xla), and writes
into plan.json what `run` reads instead of axdsl: the profile's bf16 peak (989 TFLOP/s), its
memory pool and which XLA figure to report.

`run` needs jax and optax, nothing of axdsl. Each build runs in a process of its own (XLA's
allocator given the plan's 0.90 of the chip, so `peak_bytes_in_use` is the build's own), under one
time budget for all 12 (BUDGET s; the device tool's call is 10 minutes): compile, WARMUP + STEPS
steps from the same initial state and data for both precisions, then the table: tokens/s, MFU
(MODEL_FLOPS per token x tokens/s over the bf16 peak, for fp8 too), step time, XLA's memory
(argument + temp + output - alias: XLA:GPU allocates its temporaries as one block), the chip's
peak, the analytic figure and the loss after the last step. Then each config against the goals
(the issue): bf16 MFU dense >= 55% (the 32k Llama too), MoE >= 30%, Mamba-2 >= 25%; fp8 step time
<= 0.75 x bf16's; fp8's loss within 2% of bf16's; and how many gemms of the fp8 build XLA compiled
with 8-bit operands (a quantize-dequantize can compile to a bf16 gemm). On the device tool, with
bench_gpu prepared in the repository (untracked, not ignored: it travels with the working tree):

    PYTHONUNBUFFERED=1 python benchmarks/gpu_bench.py run bench_gpu --results $OUT/results.jsonl \
        2>&1 | tee $OUT/run.log                                          # timeout_s 600
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tpu_bench  # noqa: E402
from tpu_bench import Config  # noqa: E402

TARGET = "gpu-h200-1"
GOALS = {"dense": 0.55, "long": 0.55, "moe": 0.30, "ssm": 0.25}
FP8_STEP, FP8_LOSS = 0.75, 0.02  # fp8 step time over bf16's, and loss drift, at most
WARMUP, STEPS = tpu_bench.WARMUP, 10
BUDGET = 450  # seconds for every build's process together, on the chip
PRECISIONS = {"bf16": "quantize(none)", "fp8": "quantize(fp8)"}
COLUMNS = "config|precision|tokens/s|MFU|step|XLA memory|chip peak|analytic|loss".split("|")

# Sizes checked with the analytic model for gpu-h200-1 (bf16 build; fp8 within 0.4 GiB), against
# the 126.4 GiB pool, batches held to about a second a step so that all 12 builds fit BUDGET.
CONFIGS = (
    Config(
        "llama1b", "dense", "llama3_2_1b", "llama3_2_1b", "llama3_2_tiny",
        cut="max_seq = 4096", batch=8, seq=4096,
        why="Llama 3.2 1B whole (16 layers, 32 heads of 64), f32 weights: 100.9 GiB, remat none",
    ),
    Config(
        "llama8b", "dense", "llama3_8b", "llama3_8b", "llama3_8b_tiny",
        cut="param_dtype = bf16", batch=1, seq=8192,
        why="Llama 3 8B whole (32 layers), bf16 weights and AdamW moments: 80.0 GiB; with its f32 "
        "weights it needs 132.8 GiB (the largest f32 cut is 28 layers, 119.6 GiB)",
    ),
    Config(
        "llama_32k", "long", "llama3_2_1b", "llama3_2_1b", "llama3_2_tiny",
        cut="max_seq = 32768", batch=1, seq=32768,
        why="Llama 3.2 1B whole at one sequence of 32,768 tokens, f32 weights: 94.1 GiB, remat "
        "none (the H200 holds every layer the TPU's cut dropped)",
    ),
    Config(
        "gemma2", "dense", "gemma2_2b", "gemma2_2b", "gemma2_tiny",
        cut="max_seq = 8192", batch=1, seq=8192,
        why="Gemma 2 2B whole (26 layers, local and global, head_dim 256, soft caps), f32 "
        "weights: 78.1 GiB (2 x 8192 is 110.1 GiB: too near the pool for a first visit)",
    ),
    Config(
        "qwen3_moe", "moe", "qwen3_30b_a3b", "qwen3_30b_a3b", "qwen3_30b_a3b_tiny",
        cut="layers = 4  max_seq = 4096", batch=1, seq=4096,
        why="Qwen3-30B-A3B cut to 4 of 48 layers, every one of its 128 experts (top 8 of 768 "
        "wide), f32 weights, one sequence: XLA:GPU expands each grouped matmul into a masked dot "
        "per expert (platforms.py moe_ragged_dense): 8 layers at 4 x 4096 tokens needed 281 GiB",
    ),
    Config(
        "mamba2", "ssm", "mamba2_2_7b", "mamba2_2_7b", "mamba2_tiny",
        cut="layers = 64", batch=6, seq=2048,
        why="Mamba-2 2.7B whole (64 layers, 80 heads, dim 2560), f32 weights: 68.2 GiB",
    ),
)  # fmt: skip


def precisions(config: Config, variants: bool) -> dict[str, str]:
    """Every config's two builds: the target block of each precision."""
    return dict(PRECISIONS)


def selected(root: Path, run: dict) -> dict:
    """What the generated model runs: fp8 matmuls or not, and its attention kernels (the comments
    select_kernels writes above each call)."""
    model = root.joinpath(*run["module"].split(".")[:-1], "model.py").read_text()
    kernels = sorted(set(re.findall(r"select_kernels: (\w+),[^\n]*\battention\b", model)))
    return {"fp8": "fp8_einsum(" in model, "attention": ",".join(kernels) or "-"}


# ---------------------------------------------------------------------------- prepare (here)
def prepare(out: Path, dry: bool, only: Sequence[str] = ()) -> dict:
    """tpu_bench.prepare with this file's configs and precisions; the GPU's facts in plan.json."""
    from axdsl.targets import get_target

    configs = tuple(c for c in CONFIGS if not only or c.name in only)
    plan = tpu_bench.prepare(out, False, dry, TARGET, configs, precisions)
    profile = get_target(TARGET).profile  # the chip's bf16 peak (989 TFLOP/s) and memory pool
    plan.update(peak_flops=profile.peak_flops("bf16"), xla_memory="sum")
    pool = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{profile.mem_fraction:.2f}"}
    plan["env"] = {"JAX_PLATFORMS": "cpu"} if dry else pool  # what run's processes are given
    for run in plan["runs"]:
        run.update(selected(out, run))
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


def _plan_line(r: dict) -> str:
    return (
        f"{r['config']:10s} {r['variant']:5s} analytic {r['analytic_bytes'] / 2**30:6.2f} GiB "
        f"({'fits' if r['fits'] else 'DOES NOT FIT'})  remat {r['remat']:8s} "
        f"fp8 matmuls {'yes' if r['fp8'] else 'no ':3s}  attention {r['attention']:5s}  "
        f"{r['batch']} x {r['seq']}  {r['model_flops_per_token'] / 1e9:.3g} GFLOP/token"
    )


# ---------------------------------------------------------------------------- the table
def last_results(results: Path) -> dict[tuple[str, str], dict]:
    """Each build's last line in `results` (a rerun appends), by (config, precision)."""
    rows = {}
    for line in results.read_text().splitlines() if results.exists() else []:
        r = json.loads(line)
        rows[(r["config"], r["variant"])] = r
    return rows


def table(results: Path) -> None:
    """The table for benchmarks/RESULTS.md (each build's last result), then the goals."""
    rows = last_results(results)
    print(f"\n| {' | '.join(COLUMNS)} |\n|{'---|' * len(COLUMNS)}")
    for (config, variant), r in rows.items():
        if "error" in r:
            print(f"| {config} | {variant} | - | - | - | {r['error'][:120]} | - | - | - |")
            continue
        peak = f"{r['chip_peak'] / 2**30:.2f} GiB" if r.get("chip_peak") else "n/a"
        print(
            f"| {config} | {variant} | {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | "
            f"{r['step_s'] * 1e3:.0f} ms | {r['xla_bytes'] / 2**30:.2f} GiB | {peak} | "
            f"{r['analytic_bytes'] / 2**30:.2f} GiB | {r['losses'][-1]:.4f} |"
        )
    print("\nAgainst the goals:")
    for line in goals(rows):
        print(f"- {line}")


def goals(rows: dict[tuple[str, str], dict]) -> list[str]:
    """One line per config: bf16 MFU against its goal, fp8's step time and loss against bf16's."""
    kinds = {c.name: c.kind for c in CONFIGS}
    out = []
    for config in dict.fromkeys(c for c, _ in rows):
        b, f = rows.get((config, "bf16"), {}), rows.get((config, "fp8"), {})
        if "mfu" not in b:
            out.append(f"**{config}**: bf16 not measured")
            continue
        goal = GOALS[kinds.get(config, "dense")]
        line = f"**{config}**: bf16 MFU {b['mfu']:.1%} (goal {goal:.0%}: {_ok(b['mfu'] >= goal)})"
        if "mfu" in f:
            ratio = f["step_s"] / b["step_s"]
            drift = abs(f["losses"][-1] - b["losses"][-1]) / b["losses"][-1]
            line += (
                f"; fp8 step {ratio:.2f}x bf16's (goal <= {FP8_STEP}: {_ok(ratio <= FP8_STEP)}); "
                f"loss after {len(b['losses'])} steps bf16 {b['losses'][-1]:.4f}, fp8 "
                f"{f['losses'][-1]:.4f}, {drift:.2%} apart (within {FP8_LOSS:.0%}: "
                f"{_ok(drift <= FP8_LOSS)}); fp8's compiled step has {f.get('f8_gemms', '?')} f8 "
                "gemms"
            )
        out.append(line)
    return out


def _ok(met: bool) -> str:
    return "met" if met else "NOT met"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "stage", nargs="?", choices=("prepare", "run"), help="prepare here, run on the GPU"
    )
    p.add_argument(
        "dir", nargs="?", type=Path, help="the prepared directory, inside the repository"
    )
    p.add_argument("--only", nargs="*", default=[], help="these configs only")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps per build")
    p.add_argument("--results", type=Path, help="run: JSON lines out (default DIR/results.jsonl)")
    p.add_argument("--timeout", type=int, default=300, help="run: seconds a build may take")
    p.add_argument(
        "--budget", type=float, help=f"run: seconds for all builds ({BUDGET}; a dry run: none)"
    )
    p.add_argument("--profile", default="", help="run: trace two steps per build into this folder")
    p.add_argument("--dry-run", action="store_true", help="prepare and run tiny cpu builds here")
    args = p.parse_args(argv)
    if not args.dry_run and (args.stage is None or args.dir is None):
        p.error("give prepare DIR or run DIR, or --dry-run")
    if args.stage == "prepare" and not args.dry_run:
        for r in prepare(args.dir, dry=False, only=args.only)["runs"]:
            if r["variant"] == "bf16":
                print(f"{r['config']}, {r['batch']} x {r['seq']}: {r['why']}")
            print(f"  {_plan_line(r)}")
        return 0
    profile = ""
    if args.profile:  # absolute: each build's process writes its trace there
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        profile = str(Path(args.profile).resolve())
    root = Path(tempfile.mkdtemp(prefix="gpu_bench_")) if args.dry_run else args.dir.resolve()
    results = (args.results or root / "results.jsonl").resolve()
    try:
        if args.dry_run:
            for r in prepare(root, dry=True, only=args.only)["runs"]:
                print(_plan_line(r))
            print("dry run: tiny cpu builds of each config; their figures mean nothing")
        steps = 2 if args.dry_run else args.steps
        together = 2 if args.dry_run else 1  # one build at a time on the chip, two on 2 cores
        budget = args.budget or (None if args.dry_run else BUDGET)
        tpu_bench.run(root, args.only, steps, results, args.timeout, profile, per_build=True,
                      budget=budget, together=together, report=table)  # fmt: skip
        rows = last_results(results)
        failed = [f"{c} {v}" for (c, v), r in rows.items() if "error" in r] or (
            [] if rows else ["all"]
        )
        if args.dry_run:
            print(f"dry run FAILED: {', '.join(failed)}" if failed else "dry run passed")
        return 1 if failed else 0
    finally:
        if args.dry_run:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
