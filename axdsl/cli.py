"""The `axdsl` command line. User mistakes print located errors and exit 1, never a traceback.

    axdsl build SPEC --target T [--out DIR]     generate code (atomically)
    axdsl build --check [SPEC --target T]       fail with a diff if generated/ drifted
    axdsl check SPEC...                         static checks only
    axdsl dump SPEC [--target T] [--after PASS] print the IR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from axdsl import __version__
from axdsl.errors import CompileError

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_ERROR
    try:
        return args.run(args)
    except CompileError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_ERROR
    except _UsageError as exc:
        print(f"axdsl: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="axdsl",
        description="Compile .axl model specs into readable JAX model and training code.",
    )
    p.add_argument("--version", action="version", version=f"axdsl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("build", help="generate code for a spec and target",
                       description="Generate generated/<spec>/<target>/ from a spec. With --check, "
                                   "compare instead of writing and exit 1 with a diff on drift.")
    b.add_argument("spec", nargs="?", type=Path, help="the .axl spec (optional with --check)")
    b.add_argument("--target", "-t", default=None, help="target name, e.g. cpu or gpu-h100-8")
    b.add_argument("--out", type=Path, default=None, help="output dir (default generated/<spec>/<target>)")
    b.add_argument("--check", action="store_true", help="check committed output instead of writing")
    b.set_defaults(run=_cmd_build)

    c = sub.add_parser("check", help="run the static checks on specs", description="Parse and check specs; write nothing.")
    c.add_argument("specs", nargs="+", type=Path)
    c.add_argument("--target", "-t", default="cpu")
    c.set_defaults(run=_cmd_check)

    d = sub.add_parser("dump", help="print the IR of a spec", description="Print the canonical IR text.")
    d.add_argument("spec", type=Path)
    d.add_argument("--target", "-t", default="cpu")
    d.add_argument("--after", default=None, help="stop after this pass")
    d.set_defaults(run=_cmd_dump)
    return p


def _target(name: str | None) -> str:
    from axdsl.targets import UnknownTarget, parse_target

    if name is None:
        raise _UsageError("--target is required (for example --target cpu)")
    try:
        parse_target(name)
    except UnknownTarget as exc:
        raise _UsageError(str(exc)) from None
    return name


def _cmd_build(args) -> int:
    from axdsl import build

    if args.check:
        return _check_drift(args)
    if args.spec is None:
        raise _UsageError("build needs a SPEC (or --check)")
    target = _target(args.target)
    start = time.perf_counter()
    files = build.build_files(args.spec, target)
    out = args.out or build.default_out_dir(args.spec, target)
    build.write_atomic(out, files, make_packages=args.out is None)
    ms = (time.perf_counter() - start) * 1000
    print(f"built {out}/ ({', '.join(sorted(files))}) in {ms:.0f} ms")
    return EXIT_OK


def _check_drift(args) -> int:
    from axdsl import build

    if args.spec is not None:
        target = _target(args.target)
        jobs = [(args.out or build.default_out_dir(args.spec, target), args.spec, target)]
    else:
        jobs = build.committed_outputs()
        if not jobs:
            raise _UsageError("no committed output found under generated/")
    drift = 0
    for out, spec, target in jobs:
        diff = build.diff_against(out, build.build_files(spec, target))
        if diff:
            drift += 1
            sys.stdout.write(diff)
            print(f"{out}: out of date with {spec}; run `axdsl build {spec} --target {target}`", file=sys.stderr)
    if not args.spec:
        for spec in sorted(Path("specs").glob("*.axl")):
            if not any(s == spec for _, s, _ in jobs):
                drift += 1
                print(f"{spec}: has no committed output; run `axdsl build {spec} --target cpu`", file=sys.stderr)
    if drift:
        return EXIT_DRIFT
    print(f"generated/ is in sync ({len(jobs)} output{'s' if len(jobs) != 1 else ''} checked)")
    return EXIT_OK


def _cmd_check(args) -> int:
    from axdsl.pipeline import compile_spec

    target = _target(args.target)
    errors = []
    for spec in args.specs:
        try:
            module = compile_spec(spec, target)
            print(f"{spec}: ok ({', '.join(m.name for m in module.models)})")
        except CompileError as exc:
            errors.append(exc.render())
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _cmd_dump(args) -> int:
    from axdsl.ir.printer import print_module
    from axdsl.pipeline import PASS_NAMES, compile_spec

    if args.after is not None and args.after not in PASS_NAMES:
        raise _UsageError(f"unknown pass `{args.after}`; passes: {', '.join(PASS_NAMES)}")
    module = compile_spec(args.spec, _target(args.target), after=args.after)
    sys.stdout.write(print_module(module))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
