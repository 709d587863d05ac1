"""The `axdsl` command line. User mistakes print located errors and exit 1, never a traceback;
a missing, unknown or conflicting argument exits 2, as argparse does. --target defaults to cpu
everywhere; --out always names what the command writes.

    axdsl build SPEC [--target T] [--out ROOT]  generate code (atomically)
    axdsl build --check [SPEC --target T]       fail with a diff if generated/ drifted
    axdsl check SPEC...                         static checks only
    axdsl dump SPEC [--target T] [--after PASS] print the IR (and the target's resolved schedule)
    axdsl diff SPEC --target A --target B       unified diff between two targets' generated code
    axdsl aot SPEC [--target T]                 per-chip memory and FLOPs; exit 3 if it does not fit
    axdsl stats SPEC [--target T]               parameters (total, active), FLOPs, memory per chip
    axdsl import-hf SPEC HF_DIR                 Hugging Face safetensors -> orbax params checkpoint
    axdsl export-hf SPEC CKPT_DIR --out HF_DIR  orbax params checkpoint -> Hugging Face safetensors
    axdsl export-lora SPEC RUN --out DIR [--merge]  a LoRA run's adapters alone, or merged weights
    axdsl train SPEC [--target T] [--out RUN]   build, then train (rerunning resumes)
    axdsl plot RUN_DIR                          loss, eval, lr and throughput PNG (matplotlib)
    axdsl sample RUN_DIR [PROMPT] [--chat]      text, or a chat answer, from the latest checkpoint
    axdsl eval RUN --task FILE [--task FILE]    multiple choice, perplexity, exact match
    axdsl fmt [--check] [--diff] FILE...        format .axl files in the canonical layout
    axdsl lsp                                   the language server for editors (stdio)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from axdsl import __version__
from axdsl.editor.commands import add_fmt, add_lsp
from axdsl.errors import CompileError, shorten_words

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 1
EXIT_USAGE = 2  # as argparse exits for a missing or unknown argument
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in axdsl, not a user mistake
EXIT_INTERRUPTED = 130  # Ctrl-C


def _path(text: str) -> Path:
    """A path argument; an empty one is refused (Path("") would be the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; give a file or directory")
    return Path(text)


def main(argv: list[str] | None = None) -> int:
    _tolerant_output()
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except CompileError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_ERROR
    except _user_errors() as exc:
        print(f"axdsl: error: {shorten_words(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except _UsageError as exc:  # as argparse: a missing, unknown or conflicting argument exits 2
        print(f"axdsl: error: {shorten_words(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path the user gave: missing, unreadable, read-only
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"axdsl: error: {shorten_words(where + str(exc.strerror or exc))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("axdsl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - every user mistake is handled above: this is a bug
        return _internal_error(exc)


def _tolerant_output() -> None:
    """Never fail on printing what the user gave: a spec path or an argument that is not UTF-8
    (`check $'\\xff'.axl`) reaches Python as lone surrogates, which a strict UTF-8 stdout (the
    default under an en_US.UTF-8 locale) cannot encode: `ok` became an internal error, exit 70.
    Both streams show such characters escaped, as stderr already does by default."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def _user_errors() -> tuple[type[Exception], ...]:
    """Exceptions the library raises for user mistakes, printed as `axdsl: error: ...`."""
    from axdsl.build import OutputError
    from axdsl.runs import RunError

    return (OutputError, RunError)


def _internal_error(exc: Exception) -> int:
    """One line that says it is a bug and where the full traceback was written; exit 70."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    with tempfile.NamedTemporaryFile("w", prefix="axdsl-bug-", suffix=".txt", delete=False) as f:
        f.write(f"axdsl {__version__}\nargv: {sys.argv}\n\n{text}")
    message = str(exc).splitlines()[0][:200] if str(exc) else ""
    print(
        "axdsl: internal error (a bug in axdsl, please report it): "
        f"{type(exc).__name__}: {message}\n"
        f"  the traceback is in {f.name}",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


class _UsageError(Exception):
    pass


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that shows every option's default: appended unless the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.default is False:
            return f"{text} (default: off)"
        return text if action.default is None else f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    """The command line: one `_add_<command>` per subcommand."""
    p = argparse.ArgumentParser(
        prog="axdsl",
        description="Compile .axl model specs into readable JAX model and training code.",
        formatter_class=_Help,
    )
    p.add_argument("--version", action="version", version=f"axdsl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_SubParser)
    for add in (
        _add_build,
        _add_check,
        _add_dump,
        _add_diff,
        _add_aot,
        _add_stats,
        _add_import_hf,
        _add_export_hf,
        _add_export_lora,
        _add_train,
        _add_plot,
        _add_sample,
        _add_eval,
        add_fmt,
        add_lsp,
    ):
        add(sub)
    return p


class _SubParser(argparse.ArgumentParser):
    """Every subcommand's parser shows defaults in its help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


SPEC_HELP = "the .axl spec"
MODEL_HELP = "model of the spec (default: the first model)"


def _add_target(p: argparse.ArgumentParser) -> None:
    """--target is the same option, with the same default, in every command that takes one."""
    p.add_argument(
        "--target", "-t", default="cpu", help="target name, e.g. cpu, gpu-h100-8 or tpu-v5e-16"
    )


def _add_build(sub) -> None:
    b = sub.add_parser(
        "build",
        help="generate code for a spec and target",
        description="Generate generated/<spec>/<target>/ from a spec. With --check, "
        "compare instead of writing and exit 1 with a diff on drift.",
    )
    b.add_argument(
        "spec",
        nargs="?",
        type=_path,
        help="the .axl spec (default with --check: every committed output)",
    )
    _add_target(b)
    b.add_argument(
        "--out",
        type=_path,
        default=Path("generated"),
        metavar="ROOT",
        help="output root: writes ROOT/<spec>/<target>/ and ROOT/runtime.py",
    )
    b.add_argument("--check", action="store_true", help="check committed output instead of writing")
    b.add_argument(
        "--force", action="store_true", help="replace a train.py you have edited (else kept)"
    )
    b.set_defaults(run=_cmd_build)


def _add_check(sub) -> None:
    c = sub.add_parser(
        "check",
        help="run the static checks on specs",
        description="Parse and check specs; write nothing.",
    )
    c.add_argument("specs", nargs="+", type=_path, help="one or more .axl specs")
    _add_target(c)
    c.set_defaults(run=_cmd_check)


def _add_dump(sub) -> None:
    d = sub.add_parser(
        "dump", help="print the IR of a spec", description="Print the canonical IR text."
    )
    d.add_argument("spec", type=_path, help=SPEC_HELP)
    _add_target(d)
    d.add_argument("--after", default=None, help="stop after this pass (default: after every pass)")
    d.set_defaults(run=_cmd_dump)


def _add_diff(sub) -> None:
    df = sub.add_parser(
        "diff",
        help="diff the generated code of two targets",
        description="Print the unified diff between two targets' generated code.",
    )
    df.add_argument("spec", type=_path, help=SPEC_HELP)
    df.add_argument(
        "--target",
        "-t",
        action="append",
        required=True,
        help="give exactly two, e.g. -t cpu -t gpu-h100 (no default)",
    )
    df.set_defaults(run=_cmd_diff)


def _add_aot(sub) -> None:
    a = sub.add_parser(
        "aot",
        help="ahead-of-time fit report for a target",
        description="Lower the generated train step for the target on this machine and "
        "report per-chip memory and FLOPs. Exit 0 if it fits, 3 if not.",
    )
    a.add_argument("spec", type=_path, help=SPEC_HELP)
    _add_target(a)
    a.add_argument("--model", default=None, help=MODEL_HELP)
    a.add_argument(
        "--batch", type=int, default=None, help="global batch (default: the train block's)"
    )
    a.add_argument(
        "--seq", type=int, default=None, help="sequence length (default: the train block's)"
    )
    a.add_argument(
        "--compile", action="store_true", help="also compile on this CPU and show XLA's figures"
    )
    a.set_defaults(run=_cmd_aot)


def _add_stats(sub) -> None:
    st = sub.add_parser(
        "stats",
        help="parameters, FLOPs and memory per chip",
        description="Count parameters (total and active), model FLOPs per token and per "
        "step, and per-chip memory for the target, from the IR alone.",
    )
    st.add_argument("spec", type=_path, help=SPEC_HELP)
    _add_target(st)
    st.add_argument("--model", default=None, help=MODEL_HELP)
    st.set_defaults(run=_cmd_stats)


def _add_import_hf(sub) -> None:
    hi = sub.add_parser(
        "import-hf",
        help="convert Hugging Face weights to an orbax checkpoint",
        description="Read config.json and *.safetensors and write an orbax params "
        "checkpoint for the spec's model.",
    )
    hi.add_argument("spec", type=_path, help=SPEC_HELP)
    hi.add_argument(
        "hf_dir", type=_path, help="a Hugging Face model directory (config.json, *.safetensors)"
    )
    hi.add_argument("--model", default=None, help=MODEL_HELP)
    hi.add_argument(
        "--out",
        type=_path,
        default=None,
        help="the checkpoint directory to write (default: runs/<spec>-hf/params)",
    )
    hi.set_defaults(run=_cmd_import_hf)


def _add_export_hf(sub) -> None:
    he = sub.add_parser(
        "export-hf",
        help="convert an orbax checkpoint to Hugging Face weights",
        description="Write config.json and model.safetensors from a params checkpoint or a "
        "run (its newest intact step). The same form as import-hf: "
        "SPEC SOURCE --out DEST.",
    )
    he.add_argument("spec", type=_path, help=SPEC_HELP)
    he.add_argument(
        "ckpt_dir",
        type=_path,
        help="a params checkpoint, a run directory, its checkpoints/ or one step",
    )
    he.add_argument("legacy_out", nargs="?", type=_path, default=None, help=argparse.SUPPRESS)
    he.add_argument(
        "--out",
        type=_path,
        default=None,
        help="the Hugging Face directory to write (required; no default)",
    )
    he.add_argument("--model", default=None, help=MODEL_HELP)
    he.set_defaults(run=_cmd_export_hf)


def _add_export_lora(sub) -> None:
    el = sub.add_parser(
        "export-lora",
        help="write a LoRA run's adapters alone, or merged into the weights",
        description="Read a run trained with lora(...) (its newest intact checkpoint, or one "
        "step) and write an orbax checkpoint of its adapters (with lora.json), "
        "or with --merge its weights W + (alpha / rank) * A @ B.",
    )
    el.add_argument("spec", type=_path, help="the spec the run was trained from")
    el.add_argument("ckpt_dir", type=_path, help="a run directory, its checkpoints/ or one step")
    el.add_argument("legacy_out", nargs="?", type=_path, default=None, help=argparse.SUPPRESS)
    el.add_argument(
        "--out",
        type=_path,
        default=None,
        help="the new checkpoint's directory, which must not exist or be empty "
        "(required; no default)",
    )
    el.add_argument(
        "--merge",
        action="store_true",
        help="write merged weights, a params checkpoint as import-hf writes "
        "(default: adapters alone)",
    )
    el.set_defaults(run=_cmd_export_lora)


TRAIN_OVERRIDES = {"steps": int, "batch": int, "seq": int, "lr": float, "checkpoint_every": int}


def _check_train_flags(args) -> None:
    """Each train flag in the range the same key has in a train block, before anything is built
    or started: `--steps 0` or `--lr nan` used to build, start train.py and import jax before it
    refused (and, before that check, --lr -1 trained by gradient ascent with exit 0)."""
    from axdsl.ir.dtypes import INT32_MAX
    from axdsl.passes.configure_train import INT_KEYS

    least = {name: INT_KEYS[name][1] for name in ("steps", "batch", "seq")}
    least["checkpoint_every"] = 0  # checkpoint(every = 0): only at the end
    for name, low in least.items():
        value = getattr(args, name)
        if value is not None and not low <= value <= INT32_MAX:
            raise _UsageError(
                f"argument --{name.replace('_', '-')}: must be an integer from {low} to "
                f"2**31 - 1, got {value}"
            )
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise _UsageError(f"argument --lr: must be a finite learning rate above 0, got {args.lr}")
    for name in ("data", "model"):
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise _UsageError(f"argument --{name}: needs a value, got {getattr(args, name)!r}")


def _add_train(sub) -> None:
    tr = sub.add_parser(
        "train",
        help="build and train (rerunning resumes)",
        description="Build generated/<spec>/<target>/ and run its train.py. The options "
        "below are passed on to it (python -m generated.<spec>.<target>.train "
        "--help lists every one).",
    )
    tr.add_argument("spec", type=_path, help=SPEC_HELP)
    _add_target(tr)
    tr.add_argument(
        "--model",
        default=None,
        help="the spec's model to train (default: its first); its own run directory",
    )
    tr.add_argument(
        "--out",
        type=_path,
        default=None,
        help="run directory (default: runs/<spec>-<target>, or runs/<spec>-<target>-<model>)",
    )
    tr.add_argument(
        "--steps", type=int, default=None, help="total optimizer steps (default: the train block's)"
    )
    tr.add_argument(
        "--batch", type=int, default=None, help="global batch (default: the train block's)"
    )
    tr.add_argument(
        "--seq", type=int, default=None, help="sequence length (default: the train block's)"
    )
    tr.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (default: the train block's)"
    )
    tr.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="steps between checkpoints (default: the train block's)",
    )
    tr.add_argument(
        "--data",
        default=None,
        help='"default", a token file (.bin) or a text file/directory; '
        "seq2seq: SOURCE.bin,TARGET.bin; "
        "classify: a .npz of images and labels (default: the train block's data)",
    )
    tr.add_argument(
        "--init-from",
        type=_path,
        default=None,
        help="start a new run from these parameters: a Hugging Face model directory (imported "
        "into RUN/hf_params), a params checkpoint or a run (default: the train block's init_from)",
    )
    tr.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the check that the state fits this machine's memory and a checkpoint its disk",
    )
    tr.add_argument(
        "--force-resume",
        action="store_true",
        help="resume a run although this command differs from what made it (run.json records it)",
    )
    tr.set_defaults(run=_cmd_train)


def _add_plot(sub) -> None:
    pl = sub.add_parser(
        "plot",
        help="plot a run's loss, eval loss, learning rate and throughput",
        description="Plot RUN_DIR/metrics.jsonl with matplotlib.",
    )
    pl.add_argument("run_dir", type=_path, help="a run directory (holding metrics.jsonl)")
    pl.add_argument("--out", type=_path, default=None, help="PNG path (default: RUN_DIR/loss.png)")
    pl.set_defaults(run=_cmd_plot)


def _add_sample(sub) -> None:
    sm = sub.add_parser(
        "sample",
        help="generate text from a run's latest checkpoint",
        description="Generate text from the newest intact checkpoint of RUN_DIR (a run, or "
        "a checkpoint import-hf wrote), streaming it as it comes.",
    )
    sm.add_argument("run_dir", type=_path, help="a run directory or an imported params checkpoint")
    sm.add_argument(
        "prompt", nargs="?", default=None, help='the prompt (default: "\\n"; or give --prompt)'
    )
    sm.add_argument(
        "--prompt",
        dest="prompt_flag",
        default=None,
        metavar="TEXT",
        help="the prompt, as an option (default: the positional prompt)",
    )
    sm.add_argument("--max-tokens", type=int, default=200, help="tokens to generate")
    sm.add_argument("--temperature", type=float, default=0.8, help="0 is greedy")
    sm.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample among the k most likely tokens (default: all)",
    )
    sm.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample among the most likely tokens whose probability reaches p (default 1.0: all)",
    )
    sm.add_argument(
        "--eos",
        type=int,
        default=None,
        help="stop after this token id (default: a seq2seq run's eos, "
        "an imported model's eos_token_id, else none)",
    )
    sm.add_argument("--seed", type=int, default=0, help="sampling seed")
    sm.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="run one full forward per token instead of the KV-cache decode path (default: "
        "the cache, where the model has one); greedy output is the same",
    )
    sm.add_argument(
        "--chat",
        nargs="?",
        const="",
        default=None,
        metavar="MESSAGE",
        help="a user's message (or the prompt given otherwise): render it with the chat template "
        "the run trained with and the assistant's turn header, print only the answer, stop at "
        "the end of the turn (default: plain text, no template)",
    )
    sm.add_argument(
        "--system",
        default=None,
        metavar="TEXT",
        help="with --chat: a system message before the user's (default: none)",
    )
    sm.set_defaults(run=_cmd_sample)


def _add_eval(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="score a run's latest checkpoint on task files",
        description="Score the newest intact checkpoint of RUN (a run, an import-hf output or its "
        "params checkpoint) on task files: multiple choice by log-likelihood (.jsonl with "
        "context, choices, gold), perplexity and bits per byte (.txt), greedy generation by exact "
        "match (.jsonl with prompt, answer). Prints a table and writes RUN/evals/<task>.json "
        "(docs/eval.md).",
    )
    ev.add_argument(
        "run_dir",
        metavar="RUN",
        type=_path,
        help="a run directory, an import-hf output or its params",
    )
    ev.add_argument(
        "--task",
        dest="tasks",
        type=_path,
        action="append",
        required=True,
        metavar="FILE",
        help="a task file (repeat for several; required, no default)",
    )
    ev.add_argument(
        "--tokenizer",
        type=_path,
        default=None,
        help="a tokenizer.json or a directory holding one (default: the run's own)",
    )
    ev.add_argument("--batch", type=int, default=8, help="rows per scoring forward")
    ev.add_argument(
        "--max-tokens", type=int, default=64, help="most tokens generated per generation item"
    )
    ev.set_defaults(run=_cmd_eval)


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
    root = args.out or Path("generated")
    files = build.build_files(args.spec, target, build.root_package(root))
    out = build.default_out_dir(args.spec, target, root)
    edits = ""
    if not args.force:  # a train.py the user edited is never overwritten unasked
        files, edits = build.keep_edits(out, files)
    build.write_atomic(out, files, make_packages=True, force=args.force)
    if edits:
        sys.stdout.write(edits)
        print(
            f"kept your edited {out}/train.py; the diff above goes from it to a fresh build: merge "
            "what you want by hand, or rebuild with --force to replace it",
            file=sys.stderr,
        )
    ms = (time.perf_counter() - start) * 1000
    print(f"built {out}/ ({', '.join(sorted(files))}) in {ms:.0f} ms")
    return EXIT_OK


def _check_drift(args) -> int:
    from axdsl import build

    if args.spec is not None:
        target = _target(args.target)
        jobs = [
            (
                build.default_out_dir(args.spec, target, args.out or Path("generated")),
                args.spec,
                target,
            )
        ]
    else:
        jobs = build.committed_outputs()
        if not jobs:
            raise _UsageError("no committed output found under generated/")
    drift = 0
    runtimes = set()
    for out, spec, target in jobs:
        files = build.build_files(spec, target, out.parent.parent.resolve().name)
        diff = build.diff_against(out, files, runtime=False)
        if diff:
            drift += 1
            sys.stdout.write(diff)
            print(
                f"{out}: out of date with {spec}; run `axdsl build {spec} --target {target}`",
                file=sys.stderr,
            )
        if "train.py" in files:
            runtimes.add(build.runtime_path(out))
    for path in sorted(runtimes):  # one runtime.py serves every output under its root
        diff = build.diff_runtime(path)
        if diff:
            drift += 1
            sys.stdout.write(diff)
            print(
                f"{path}: out of date with axdsl; "
                "run `axdsl build` for any spec with a train block",
                file=sys.stderr,
            )
    if not args.spec:
        for spec in sorted(Path("specs").glob("*.axl")):
            if not any(s == spec for _, s, _ in jobs):
                drift += 1
                print(
                    f"{spec}: has no committed output; run `axdsl build {spec} --target cpu`",
                    file=sys.stderr,
                )
    if drift:
        return EXIT_DRIFT
    print(f"generated/ is in sync ({len(jobs)} output{'s' if len(jobs) != 1 else ''} checked)")
    return EXIT_OK


def _cmd_check(args) -> int:
    from axdsl.codegen.emit import shared_functions
    from axdsl.datacheck import data_problems
    from axdsl.pipeline import run_passes
    from axdsl.syntax.loader import load

    target = _target(args.target)
    errors = []
    for spec in args.specs:
        try:
            program = None
            program = load(spec)
            module = run_passes(program, target)
            shared_functions(module)  # the models of a spec share one generated code
            if problems := data_problems(module, spec):  # data that exists and cannot train
                raise CompileError(problems, program.sources)
            print(f"{spec}: ok ({', '.join(m.name for m in module.models)})")
        except CompileError as exc:
            sources = exc.sources or (program.sources if program else {})
            errors.append(CompileError(exc.diagnostics, sources).render())
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


def _cmd_diff(args) -> int:
    from axdsl import build

    if len(args.target) != 2:
        raise _UsageError("diff needs exactly two --target options")
    a, b = (_target(t) for t in args.target)
    sys.stdout.write(build.diff_targets(args.spec, a, b))
    return EXIT_OK


def _cmd_aot(args) -> int:
    from axdsl import aot
    from axdsl.ir.dtypes import INT32_MAX

    for name, low in (("batch", 1), ("seq", 2)):  # as train's flags: --batch 0 reported a fit
        value = getattr(args, name)
        if value is not None and not low <= value <= INT32_MAX:
            raise _UsageError(
                f"argument --{name}: must be an integer from {low} to 2**31 - 1, got {value}"
            )
    return aot.run(
        args.spec, _target(args.target), args.model, args.batch, args.seq, compile=args.compile
    )


def _cmd_stats(args) -> int:
    from axdsl import stats

    return stats.run(args.spec, _target(args.target), args.model)


def _host_jax() -> None:
    """A command that converts weights runs its jax on this machine's CPU, whatever accelerator
    plugins are installed: with jax's CUDA plugin or libtpu here for `axdsl aot` and no such
    chip, starting them printed their errors. A JAX_PLATFORMS you set wins."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _cmd_import_hf(args) -> int:
    from axdsl import hf

    _host_jax()
    return hf.import_hf(args.spec, args.hf_dir, args.model, args.out)


def _cmd_export_hf(args) -> int:
    from axdsl import hf

    _host_jax()
    out = _out_dir(args)
    return hf.export_hf(args.spec, args.ckpt_dir, out, args.model)


def _cmd_export_lora(args) -> int:
    from axdsl.hf.lora_merge import export_lora

    _host_jax()
    return export_lora(args.spec, args.ckpt_dir, _out_dir(args), args.merge)


def _out_dir(args) -> Path:
    """--out DEST, or the older third positional DEST (kept so scripts keep working); no
    default, since beside a checkpoint step would be inside the run's checkpoints/."""
    if args.out is not None and args.legacy_out is not None and args.out != args.legacy_out:
        raise _UsageError(
            f"two output directories given ({args.legacy_out} and --out {args.out}): "
            "give --out only"
        )
    out = args.out or args.legacy_out
    if out is None:
        raise _UsageError(
            f"{args.command} needs --out DIR, the directory to write "
            "(it must not exist or be empty)"
        )
    return out


def _cmd_train(args) -> int:
    from axdsl import runs

    _check_train_flags(args)
    target = _target(args.target)
    overrides = {
        name: getattr(args, name) for name in TRAIN_OVERRIDES if getattr(args, name) is not None
    }
    if args.data is not None:
        overrides["data"] = args.data
    out = args.out
    if args.model is not None:  # train.py checks the name against the spec's models
        overrides["model"] = args.model
        out = out or runs.default_run_dir(args.spec, target, args.model)
    return runs.train(
        args.spec,
        target,
        out,
        init_from=args.init_from,
        overrides=overrides,
        force_resume=args.force_resume,
        no_preflight=args.no_preflight,
    )


def _cmd_plot(args) -> int:
    from axdsl import runs

    return runs.plot(args.run_dir, args.out)


def _cmd_sample(args) -> int:
    from axdsl import sampling

    if args.prompt is not None and args.prompt_flag is not None and args.prompt != args.prompt_flag:
        raise _UsageError("two prompts given (a positional one and --prompt): give one")
    given = next((p for p in (args.prompt, args.prompt_flag) if p is not None), None)
    if args.system is not None and args.chat is None:
        raise _UsageError("--system is a chat prompt's system message: give it with --chat")
    if args.chat is not None:
        if args.chat and given is not None and args.chat != given:
            raise _UsageError("two prompts given (--chat MESSAGE and another): give one")
        given = args.chat or given
        if given is None:
            raise _UsageError('--chat needs the user\'s message: axdsl sample RUN --chat "..."')
        stop = sampling.Sampling(args.temperature, args.top_k, args.top_p, args.eos, args.cache)
        return sampling.sample_chat(
            args.run_dir, given, args.system, args.max_tokens, stop, args.seed
        )
    prompt = "\n" if given is None else given
    return sampling.sample(
        args.run_dir,
        prompt,
        args.max_tokens,
        args.temperature,
        args.top_k,
        args.seed,
        args.top_p,
        args.eos,
        args.cache,
    )


def _cmd_eval(args) -> int:
    from axdsl.evaluation import evaluate

    return evaluate(args.run_dir, args.tasks, args.tokenizer, args.batch, args.max_tokens)


if __name__ == "__main__":
    sys.exit(main())
