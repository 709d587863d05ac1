"""How long `axdsl build` takes, per spec, for one target (issue 14: <= 0.5 s warm for llama3_8b).

Runs the whole in-memory build (parse, passes, render, black, libcst check) several times after
one warm-up, and a cold run in a fresh process (imports included), and prints the figures.
"warm" finds black's and libcst's results in the build cache (axdsl/codegen/cache.py), as a
rebuild does; --no-cache turns that cache off (AXDSL_CACHE_DIR=off) to time the tools themselves.
Also confirms the build path never imports jax.

    python benchmarks/build_speed.py [--target gpu-h100] [--spec llama3_8b] [--no-cache]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def warm(spec: Path, target: str, repeats: int = 5) -> list[float]:
    from axdsl.build import build_files

    build_files(spec, target)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_files(spec, target)
        times.append(time.perf_counter() - start)
    return times


def cold(spec: Path, target: str) -> float:
    code = (
        "import sys, time; t = time.perf_counter(); from axdsl.build import build_files; "
        f"build_files(__import__('pathlib').Path({str(spec)!r}), {target!r}); "
        "assert 'jax' not in sys.modules; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--spec", action="append", help="a spec's name (default: every spec)")
    parser.add_argument("--no-cache", action="store_true", help="run black and libcst every time")
    args = parser.parse_args()
    if args.no_cache:
        os.environ["AXDSL_CACHE_DIR"] = "off"
    sys.path.insert(0, str(ROOT))
    print(f"target {args.target}, build cache {'off' if args.no_cache else 'on'}")
    print(f"{'spec':<24}{'warm median':>14}{'warm min':>12}{'cold (imports)':>18}")
    for spec in sorted((ROOT / "specs").glob("*.axl")):
        if args.spec and spec.stem not in args.spec:
            continue
        rel = spec.relative_to(ROOT)
        times = warm(rel, args.target)
        print(f"{rel.name:<24}{statistics.median(times) * 1000:>12.0f}ms{min(times) * 1000:>10.0f}ms"
              f"{cold(rel, args.target) * 1000:>16.0f}ms")


if __name__ == "__main__":
    main()
