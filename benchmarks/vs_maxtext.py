"""axdsl's generated train step against MaxText's, side by side, on the same model and machine.

    python benchmarks/vs_maxtext.py                  # both, alternating, 2 rounds (~15 min on 2 cores)
    python benchmarks/vs_maxtext.py --axdsl-only     # without the peer: axdsl and the matmul peak

The model is MaxText's reference config in shared/bench/maxtext-bench.sh: a Llama-2 block, vocab
32000, dim 512, 8 layers, 8 heads, mlp 1408, seq 512, batch 8, float32, AdamW. This script writes
it as a spec, builds it for cpu with each remat setting (`remat(none)`, `remat(full)`,
`remat(save_dots)`) into a temporary directory, and runs every measurement in a fresh process,
alternating the two sides round by round so that both see the same machine. MaxText runs its
matching settings (`remat_policy=none`, `full`, and `minimal`, which saves the projections'
outputs as save_dots does). Each side's figure is its best remat setting's median step after the
compiling ones: axdsl's timed the way benchmarks/train_speed.py times them, MaxText's as it
reports them itself (Tokens/s/device).

It also measures the f32 matmul peak of this machine (the best of square jnp.dot sizes) before
and after each round, and inside each axdsl run's process just before and just after its timed
steps, and prints axdsl's model FLOP/s (train.py's MODEL_FLOPS, MaxText's formula) two ways: as a
fraction of the highest reading of the whole run, and each run against the higher of the two
readings taken around it. The readings move by +-20% within minutes on a shared machine, so the
first divides a median over minutes by the best burst of any minute; the second compares numbers
taken in the same minutes.

MaxText runs from the script shared/bench/maxtext-bench.sh (found next to the repository, or set
MAXTEXT_BENCH), which installs it on first use into a Python 3.12 virtualenv ($MAXTEXT_VENV,
default $TMPDIR/mt): that needs python3.12 and the network. Without it this script says how to
install it and exits 2; `--axdsl-only` still measures our side. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SPEC = """# MaxText's reference config of shared/bench/maxtext-bench.sh, written by benchmarks/vs_maxtext.py.
import "std/transformer.axl"

model maxtext_ref = DecoderLM {
  vocab = 32000  dim = 512  layers = 8  heads = 8  kv_heads = 8  ffn = 1408
  rope_theta = 10000.0  max_seq = 512
  norm = RMSNorm(eps = 1e-5)
  dtype = f32  param_dtype = f32
}

train {
  batch = 8  seq = 512  steps = 100
  optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1)
}

target "cpu" { remat(REMAT) }
"""
# axdsl's remat settings and MaxText's remat_policy for the same trade-off, measured side by side
REMATS = {"none": "none", "full": "full", "save_dots": "minimal"}


def bench_script() -> Path | None:
    """shared/bench/maxtext-bench.sh: $MAXTEXT_BENCH, else beside or above the repository."""
    if os.environ.get("MAXTEXT_BENCH"):
        return Path(os.environ["MAXTEXT_BENCH"])
    for base in (REPO, REPO.parent):
        path = base / "shared" / "bench" / "maxtext-bench.sh"
        if path.is_file():
            return path
    return None


def peer_installed() -> bool:
    venv = Path(os.environ.get("MAXTEXT_VENV", Path(os.environ.get("TMPDIR", "/tmp")) / "mt"))
    return (venv / "bin" / "python").is_file()


def build(root: Path) -> None:
    """The reference model built for cpu once per remat setting: <root>/ax_<remat>/maxtext_ref/cpu/."""
    for remat in REMATS:
        spec = root / f"spec_{remat}" / "maxtext_ref.axl"
        spec.parent.mkdir(parents=True)
        spec.write_text(SPEC.replace("REMAT", remat))
        out = root / f"ax_{remat}"
        subprocess.run([sys.executable, "-m", "axdsl", "build", str(spec), "--target", "cpu", "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        (out / "__init__.py").touch()


def measure_axdsl(root: Path, remat: str, steps: int) -> dict:
    """One fresh process: train_speed.measure on the built module, with the matmul peak measured
    in the same process just before and just after it; its JSON line."""
    code = (f"import sys, json; sys.path[:0] = [{str(root)!r}, {str(REPO / 'benchmarks')!r}]\n"
            f"{PEAK_CODE}\nbefore = matmul_peak()\n"
            f"import train_speed; r = train_speed.measure('maxtext_ref', {steps}, 2, None, None, "
            f"package='ax_{remat}')\nr['peaks'] = [before, matmul_peak()]; print(json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_maxtext(script: Path, remat: str, steps: int) -> list[float]:
    """MaxText's own tokens/s per step, without the first two (compilation)."""
    env = {**os.environ, "REMAT": remat}
    out = subprocess.run(["bash", str(script), "float32", str(steps)], env=env, capture_output=True,
                         text=True).stdout
    rates = [float(m) for m in re.findall(r"Tokens/s/device: ([0-9.]+)", out)]
    return rates[2:] if len(rates) > 2 else rates


PEAK_CODE = """
def matmul_peak():
    import time, jax, jax.numpy as jnp
    best = 0.0
    for n in (1024, 2048, 3072):
        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        for _ in range(3):
            t = time.perf_counter(); f(a).block_until_ready(); s = time.perf_counter() - t
            best = max(best, 2 * n ** 3 / s)
    return best
"""


def matmul_peak() -> float:
    """The best f32 jnp.dot FLOP/s of this machine over a few square sizes, in a fresh process."""
    code = PEAK_CODE + "\nprint(matmul_peak())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of both sides (default 2)")
    p.add_argument("--steps", type=int, default=8,
                   help="timed axdsl steps per run (default 8: one call of the cpu target's 8 steps)")
    p.add_argument("--maxtext-steps", type=int, default=8, help="MaxText steps per run (default 8)")
    p.add_argument("--axdsl-only", action="store_true", help="measure axdsl and the matmul peak only")
    args = p.parse_args(argv)
    script = None if args.axdsl_only else bench_script()
    if not args.axdsl_only and (script is None or not peer_installed()):
        where = script or "shared/bench/maxtext-bench.sh (not found: set MAXTEXT_BENCH)"
        print(f"MaxText is not installed. Install it once (about 2 minutes and 2.3 GB, needs python3.12 "
              f"and the network) by running\n    bash {where} float32 2\nthen rerun this script; or run it "
              f"with --axdsl-only to measure axdsl alone.", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="vs_maxtext_"))
    try:
        build(root)
        peaks = [matmul_peak()]  # measured again after every round: this machine's speed drifts
        ours: dict[str, list[dict]] = {r: [] for r in REMATS}
        theirs: dict[str, list[float]] = {r: [] for r in REMATS}
        for i in range(args.rounds):
            for remat in REMATS:
                r = measure_axdsl(root, remat, args.steps)
                ours[remat].append(r)
                print(f"round {i + 1} axdsl   remat {remat:<9} {r['tokens_per_s']:8.1f} tokens/s", flush=True)
                if script is not None:
                    rates = measure_maxtext(script, REMATS[remat], args.maxtext_steps)
                    theirs[remat] += rates
                    med = statistics.median(rates) if rates else float("nan")
                    print(f"round {i + 1} MaxText remat {REMATS[remat]:<9} {med:8.1f} tokens/s "
                          f"(median of {len(rates)})", flush=True)
            peaks.append(matmul_peak())
        peaks += [p for runs in ours.values() for r in runs for p in r["peaks"]]
        peak = max(peaks)  # the highest reading of the whole run: the most conservative fraction
        best = max(REMATS, key=lambda k: statistics.median(r["tokens_per_s"] for r in ours[k]))
        tps = statistics.median(r["tokens_per_s"] for r in ours[best])
        flops = statistics.median(r["tflops_per_device"] for r in ours[best]) * 1e12
        # each run against the higher of the two peaks measured in its own process around it
        paired = [r["tflops_per_device"] * 1e12 / max(r["peaks"]) for r in ours[best]]
        print(f"\nf32 matmul peak of this machine: {peak / 1e9:.1f} GFLOP/s (the highest of "
              f"{len(peaks)} readings, {min(peaks) / 1e9:.1f}-{peak / 1e9:.1f}: before and after each "
              f"round and around each axdsl run)")
        print(f"axdsl   best remat {best:<9}: {tps:8.1f} tokens/s, model {flops / 1e9:.1f} GFLOP/s "
              f"= {flops / peak:.1%} of the highest peak reading")
        print(f"        the same runs against the peak measured around each of them (the higher of "
              f"before and after): {statistics.median(paired):.1%} median "
              f"({', '.join(f'{x:.1%}' for x in paired)})")
        if script is not None:
            mbest = max(REMATS, key=lambda k: statistics.median(theirs[k]) if theirs[k] else 0.0)
            mtps = statistics.median(theirs[mbest]) if theirs[mbest] else float("nan")
            print(f"MaxText best remat {REMATS[mbest]:<9}: {mtps:8.1f} tokens/s")
            print(f"ratio axdsl / MaxText: {tps / mtps:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
