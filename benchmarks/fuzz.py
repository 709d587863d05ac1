"""Fuzz the front end and build with thousands of cases; print cases/s, failures and their seeds.

The cases and the oracle are tests/test_fuzz.py's (`make_case(seed)`, `failure(case, dir)`): a
mutated spec or random bytes must build or fail with located errors, in under 2 s of CPU time.
With --train-blocks, the cases are tests/test_fuzz_cli.py's train blocks instead (1-4 settings
from a table of right and wrong values, `train_block_case(seed)`) under its two-sided oracle:
`axdsl check` exits 0 exactly when every value is right, else 1 with every error located in the
spec, and never a traceback (no case may exit 0 while wrong).
With --names, the cases are tests/test_injection.py's (`names_case(seed)`, `injection_failure`):
a spec and the file it imports named with shell and Python payloads, newlines, quotes and bytes
that are not UTF-8, and train-block strings holding them; each is built, and nothing it names may
reach model.py, train.py or slurm.sh as code (about 1 s a case).

    python benchmarks/fuzz.py [--cases 3000] [--start 0] [--train-blocks | --names]

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
from test_fuzz_cli import LOCATED, run_main, train_block_case  # noqa: E402
from test_injection import injection_failure, names_case  # noqa: E402


def train_block_failure(seed: int, folder: Path) -> str | None:
    """None when `axdsl check` judged train_block_case(seed) right, else what went wrong."""
    text, valid = train_block_case(seed)
    spec = folder / "m.axl"
    spec.write_text(text)
    o = run_main(["check", str(spec)])
    if o.rc == 70 or "Traceback" in o.err + o.out:
        return f"crash: exit {o.rc}: {o.err.strip().splitlines()[-1:]}"
    if valid and o.rc != 0:
        return f"a right train block was refused: {o.err.strip()[:300]}"
    if not valid and o.rc == 0:
        return "a wrong train block passed (exit 0): " + " ".join(text.split("train {")[1].split())
    files = [m.group(1) for m in LOCATED.finditer(o.err)]
    if not valid and not (files and all(f == str(spec) for f in files)):
        return f"an error not located in the spec: {o.err.strip()[:300]}"
    return None


def main_train_blocks(args: argparse.Namespace) -> int:
    failures = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="axdsl-fuzz-") as tmp:
        for seed in range(args.start, args.start + args.cases):
            problem = train_block_failure(seed, Path(tmp))
            if problem:
                failures += 1
                print(f"seed {seed}: {problem}", flush=True)
    spent = time.perf_counter() - start
    print(
        f"{args.cases} train blocks in {spent:.1f} s ({args.cases / spent:.1f} cases/s), "
        f"{failures} failure{'s' if failures != 1 else ''}"
    )
    return 1 if failures else 0


def main_names(args: argparse.Namespace) -> int:
    failures = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="axdsl-fuzz-names-") as tmp:
        for seed in range(args.start, args.start + args.cases):
            case = names_case(seed)
            problem = injection_failure(case, Path(tmp) / "case")
            if problem:
                failures += 1
                print(f"seed {seed}: {case!r:.300}: {problem}", flush=True)
    spent = time.perf_counter() - start
    print(
        f"{args.cases} named builds in {spent:.1f} s ({args.cases / spent:.2f} cases/s), "
        f"{failures} failure{'s' if failures != 1 else ''}"
    )
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument(
        "--train-blocks", action="store_true", help="fuzz train blocks (two-sided) instead"
    )
    p.add_argument(
        "--names", action="store_true", help="fuzz file names and train-block strings instead"
    )
    args = p.parse_args()
    if args.names:
        return main_names(args)
    if args.train_blocks:
        return main_train_blocks(args)
    failures: list[tuple[int, str, str]] = []
    kinds: Counter[str] = Counter()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="axdsl-fuzz-") as tmp:
        for seed in range(args.start, args.start + args.cases):
            case = make_case(seed)
            problem = failure(case, Path(tmp))
            origin = case.origin
            kinds[origin.split(" + ")[0] if "bytes" not in origin else "random bytes"] += 1
            if problem:
                failures.append((seed, case.origin, problem))
                print(f"seed {seed}: {case.origin} [{case.target}]: {problem}", flush=True)
    spent = time.perf_counter() - start
    print(
        f"{args.cases} cases in {spent:.1f} s ({args.cases / spent:.1f} cases/s), "
        f"{len(failures)} failure{'s' if len(failures) != 1 else ''}"
    )
    if failures:
        print("failing seeds:", " ".join(str(s) for s, _, _ in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
