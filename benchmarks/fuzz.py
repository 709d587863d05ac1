"""Fuzz the front end and build with thousands of cases; print cases/s, failures and their seeds.

The cases and the oracle are tests/test_fuzz.py's (`make_case(seed)`, `failure(case, dir)`): a
mutated spec or random bytes must build or fail with located errors, in under 2 s of CPU time.

    python benchmarks/fuzz.py [--cases 3000] [--start 0]

Exit 1 if any case failed; rerun one with `--start SEED --cases 1`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from test_fuzz import failure, make_case  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--start", type=int, default=0, help="first seed")
    args = p.parse_args()
    failures: list[tuple[int, str, str]] = []
    kinds: Counter[str] = Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="axdsl-fuzz-") as tmp:
        for seed in range(args.start, args.start + args.cases):
            case = make_case(seed)
            problem = failure(case, Path(tmp))
            kinds[case.origin.split(" + ")[0] if "bytes" not in case.origin else "random bytes"] += 1
            if problem:
                failures.append((seed, case.origin, problem))
                print(f"seed {seed}: {case.origin} [{case.target}]: {problem}", flush=True)
    spent = time.perf_counter() - start
    print(f"{args.cases} cases in {spent:.1f} s ({args.cases / spent:.1f} cases/s), "
          f"{len(failures)} failure{'s' if len(failures) != 1 else ''}")
    if failures:
        print("failing seeds:", " ".join(str(s) for s, _, _ in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
