"""Two or more builds of one spec's cpu train step against each other, in alternating fresh processes.

    python benchmarks/ab_steps.py OUT_A OUT_B --spec maxtext_ref --rounds 4

Each OUT is a directory that `axdsl build SPEC --target cpu --out OUT` wrote (edit its model.py or
train.py to try a change by hand). Every round runs each build once, in order, in a fresh process
(benchmarks/train_speed.py's measurement: 2 compiling steps, then --steps timed), and prints its
tokens/s; at the end, each build's median and its per-round ratio to the first build.

Why fresh processes: steps alternating inside one process, with every build's program and state
loaded at once, favoured whatever used less memory (2026-12-06: save_dots 6-8% ahead of remat none
there, 16% behind in fresh processes; a Python loop over the layers 7% behind there, 9% ahead in
fresh processes). vs_maxtext.py measures in fresh processes too. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def measure(out: Path, spec: str, steps: int) -> float:
    """tokens/s of the build under `out`, measured in a fresh process."""
    if not (out / spec / "cpu" / "train.py").is_file():
        sys.exit(f"{out}/{spec}/cpu/train.py not found: build it with "
                 f"`axdsl build SPEC --target cpu --out {out}`")
    (out / "__init__.py").touch()
    code = (f"import sys, json; sys.path[:0] = [{str(out.parent)!r}, {str(BENCH)!r}]; "
            f"import train_speed; r = train_speed.measure({spec!r}, {steps}, 2, None, None, "
            f"package={out.name!r}); print(json.dumps(r))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{out}: the measurement failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outs", nargs="+", type=Path, help="build output directories (at least two)")
    p.add_argument("--spec", required=True, help="the spec's name (its directory under each OUT)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="timed steps per run (default 4)")
    args = p.parse_args(argv)
    if len(args.outs) < 2:
        p.error("give at least two build directories")
    outs = [o.resolve() for o in args.outs]
    if len({o.name for o in outs}) < len(outs):
        p.error("the build directories need distinct names (each is imported as a package)")
    rates: dict[Path, list[float]] = {o: [] for o in outs}
    for i in range(args.rounds):
        for o in outs:
            rates[o].append(measure(o, args.spec, args.steps))
        print(f"round {i + 1}: " + "  ".join(f"{o.name} {rates[o][-1]:.1f}" for o in outs), flush=True)
    base = rates[outs[0]]
    for o in outs:
        ratios = [b / a for a, b in zip(base, rates[o])]
        print(f"{o.name:<20} median {statistics.median(rates[o]):8.1f} tokens/s, against "
              f"{outs[0].name}: {' '.join(f'{r:.3f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
