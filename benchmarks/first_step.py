"""How long `axdsl train specs/tiny_llama.axl --target cpu` takes to reach its first step.

Targets (issue 14): <= 8 s cold and <= 4 s rerun with the compile cache, on a quiet 2-core machine.

In a fresh temporary directory (a copy of specs/, no generated/ yet), it times the two processes
that `axdsl train` runs, as a user starts them:
- build: `python -m axdsl build SPEC --target cpu` (Python start, imports, parse, passes, render,
  format, write);
- train: the generated train.py's `main()`, driven in a subprocess that wraps `init_state` and the
  first call of the train step, to split the time into imports (jax, optax, orbax, the generated
  files), setup (mesh, data, run.json, checkpoint manager, abstract state), init (the initial train
  state, ready on the device) and step (the first step, compile included, until its result is
  ready).

"cold": an empty JAX compile cache. "rerun": a second run directory sharing the first one's compile
cache (`--compile-cache`), as a restarted or repeated run finds it. The build cache (black and
libcst output, see axdsl/codegen/format.py) is used as the user's machine has it; pass --cold-build
to give the build an empty one. Each figure is the median of --repeats runs.

    python benchmarks/first_step.py [--repeats 3] [--cold-build]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = "specs/tiny_llama.axl"
PACKAGE = "generated.tiny_llama.cpu.train"
PHASES = ("build", "imports", "setup", "init", "step", "total")

# Runs in the child: main() of the generated train.py with init_state and the first step timed.
DRIVER = r"""
import importlib, json, sys, time
began = time.perf_counter()
train = importlib.import_module(sys.argv[1])
import jax
times = {"imports": time.perf_counter() - began}

def timed_init(*args, **kwargs):
    start = time.perf_counter()
    state = jax.block_until_ready(real_init(*args, **kwargs))
    times["init"] = time.perf_counter() - start
    return state

def timed_make(*args, **kwargs):
    step = real_make(*args, **kwargs)
    def first(*call):
        start = time.perf_counter()
        out = jax.block_until_ready(step(*call))
        times["step"] = time.perf_counter() - start
        times["done_at"] = time.time()
        times["setup"] = time.perf_counter() - began - sum(times[k] for k in ("imports", "init", "step"))
        print("FIRST_STEP " + json.dumps(times), flush=True)
        return out
    return first

real_init, real_make = train.init_state, train.make_train_steps
train.init_state, train.make_train_steps = timed_init, timed_make
train.main(sys.argv[2:])
"""


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the run's own --compile-cache decides
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(cmd[:4])} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return out


def first_step(work: Path, run_dir: str, cache: Path) -> dict[str, float]:
    """One `axdsl train`-like start in `work`: build, then train.py to its first step."""
    start = time.time()
    run([sys.executable, "-m", "axdsl", "build", SPEC, "--target", "cpu", "--force"], work)
    build = time.time() - start
    args = ["--out", str(work / run_dir), "--steps", "1", "--compile-cache", str(cache), "--no-progress"]
    out = run([sys.executable, "-c", DRIVER, PACKAGE, *args], work)
    line = next(l for l in out.stdout.splitlines() if l.startswith("FIRST_STEP "))
    times = json.loads(line.removeprefix("FIRST_STEP "))
    return {"build": build, **{k: times[k] for k in PHASES[1:5]}, "total": times.pop("done_at") - start}


def measure(repeats: int, cold_build: bool) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"cold": [], "rerun": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="axdsl-first-step-") as tmp:
            work = Path(tmp)
            shutil.copytree(ROOT / "specs", work / "specs")
            if cold_build:
                os.environ["AXDSL_CACHE_DIR"] = str(work / "build_cache")
            cache = work / "compile_cache"
            results["cold"].append(first_step(work, "run_cold", cache))
            results["rerun"].append(first_step(work, "run_rerun", cache))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold-build", action="store_true", help="an empty build cache for each repeat")
    args = parser.parse_args()
    results = measure(args.repeats, args.cold_build)
    print(f"{SPEC} --target cpu, median of {args.repeats} (seconds; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'':<8}" + "".join(f"{p:>9}" for p in PHASES))
    for kind, runs in results.items():
        print(f"{kind:<8}" + "".join(f"{statistics.median(r[p] for r in runs):>9.2f}" for p in PHASES))


if __name__ == "__main__":
    main()
