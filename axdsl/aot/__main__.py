"""`python -m axdsl.aot`: the `axdsl aot` command, and with `--lower` the lowering subprocess.

The parent process (`lower.lower_step`) runs `--lower` when its own jax has too few host devices;
the result comes back as one JSON line after `RESULT_TAG`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from axdsl.aot import run
from axdsl.aot.lower import RESULT_TAG, lower_here, request_devices, schedule_flags


def _main(argv: list[str] | None = None) -> int:
    """`axdsl aot`'s arguments; with `--lower`, only lower here and print the result."""
    p = argparse.ArgumentParser(prog="python -m axdsl.aot")
    p.add_argument("spec", type=Path)
    p.add_argument("--target", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument(
        "--lower", action="store_true", help="only lower; print the result as one JSON line"
    )
    args = p.parse_args(argv)
    if not args.lower:
        return run(args.spec, args.target, args.model, args.batch, args.seq, compile=args.compile)
    from axdsl.build import build_files
    from axdsl.pipeline import compile_spec

    module = compile_spec(args.spec, args.target)
    train = module.train
    sched = module.target
    files = build_files(args.spec, args.target)
    request_devices(sched.chips, schedule_flags(sched))
    result = lower_here(
        files,
        args.model or module.models[0].name,
        args.batch or train.get("batch"),
        args.seq or train.get("seq"),
        sched.chips,
        sched.kind,
        args.compile,
    )
    print(RESULT_TAG + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
