"""How long `axdsl build` takes, per spec, for the cpu target (target: well under a second).

Runs the whole in-memory build (parse, passes, render, black, libcst check) several times after
one warm-up, and a cold run in a fresh process (imports included), and prints the figures.
Also confirms the build path never imports jax.

    python benchmarks/build_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def warm(spec: Path, repeats: int = 5) -> list[float]:
    from axdsl.build import build_files

    build_files(spec, "cpu")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_files(spec, "cpu")
        times.append(time.perf_counter() - start)
    return times


def cold(spec: Path) -> float:
    code = (
        "import sys, time; t = time.perf_counter(); from axdsl.build import build_files; "
        f"build_files(__import__('pathlib').Path({str(spec)!r}), 'cpu'); "
        "assert 'jax' not in sys.modules; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    sys.path.insert(0, str(ROOT))
    print(f"{'spec':<24}{'warm median':>14}{'warm min':>12}{'cold (imports)':>18}")
    for spec in sorted((ROOT / "specs").glob("*.axl")):
        rel = spec.relative_to(ROOT)
        times = warm(rel)
        print(f"{rel.name:<24}{statistics.median(times) * 1000:>12.0f}ms{min(times) * 1000:>10.0f}ms"
              f"{cold(rel) * 1000:>16.0f}ms")


if __name__ == "__main__":
    main()
