"""The `axdsl fmt` and `axdsl lsp` subcommands, registered by axdsl/cli.py.

Only argparse is imported at start-up; the formatter and the language server load when their
command runs, so the rest of the command line stays as fast as before.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_UNFORMATTED = 0, 1, 1


def add_fmt(sub) -> None:
    """`axdsl fmt [--check] [--diff] FILE...`."""
    f = sub.add_parser(
        "fmt",
        help="format .axl files in the canonical layout",
        description="Rewrite .axl files in place in the canonical layout (directories: every "
        ".axl below them; `-`: stdin to stdout). With --check, write nothing and exit 1 with a "
        "diff when a file is not formatted; with --diff, print the changes instead of writing.",
    )
    f.add_argument("files", nargs="+", help=".axl files or directories; `-` for stdin")
    f.add_argument("--check", action="store_true", help="exit 1 if a file would change")
    f.add_argument("--diff", action="store_true", help="print a unified diff, write nothing")
    f.set_defaults(run=run_fmt)


def add_lsp(sub) -> None:
    """`axdsl lsp`: the language server, over stdio."""
    lsp = sub.add_parser(
        "lsp",
        help="run the language server (stdio) for editors",
        description="Serve the Language Server Protocol over stdin/stdout: diagnostics, hover, "
        "definitions, completion, symbols, formatting. Needs `pip install axdsl[lsp]`.",
    )
    lsp.add_argument(
        "--debounce", type=float, default=0.2, help="seconds to wait after an edit before checking"
    )
    lsp.set_defaults(run=run_lsp)


def axl_files(args: list[str]) -> list[Path]:
    """The files named, with every .axl file below a named directory, in a stable order."""
    out: list[Path] = []
    for arg in args:
        path = Path(arg)
        out.extend(sorted(path.rglob("*.axl")) if path.is_dir() else [path])
    return out


def run_fmt(args: argparse.Namespace) -> int:
    """Format, check or diff every file; report unparsable files as located errors and go on."""
    from axdsl.errors import CompileError
    from axdsl.editor.fmt import format_source, unified_diff
    from axdsl.runtime.files import refuse_symlink, replace_file

    if args.files == ["-"]:
        sys.stdout.write(format_source(sys.stdin.read(), "<stdin>"))
        return EXIT_OK
    status = EXIT_OK
    for path in axl_files(args.files):
        try:
            before = path.read_bytes().decode("utf-8")
            after = format_source(before, path.as_posix())
        except CompileError as exc:
            print(exc.render(), file=sys.stderr)
            status = EXIT_ERROR
            continue
        except (OSError, UnicodeDecodeError) as exc:
            print(f"axdsl: error: {path}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            status = EXIT_ERROR
            continue
        if after == before:
            continue
        if args.check or args.diff:
            sys.stdout.write(unified_diff(before, after, path.as_posix()))
        if args.check:
            print(f"would reformat {path}", file=sys.stderr)
            status = max(status, EXIT_UNFORMATTED)
        elif not args.diff:
            try:
                refuse_symlink(path)
                replace_file(path, after)
            except OSError as exc:
                print(f"axdsl: error: {path}: {exc.strerror or exc}", file=sys.stderr)
                status = EXIT_ERROR
                continue
            print(f"reformatted {path}", file=sys.stderr)
    return status


def run_lsp(args: argparse.Namespace) -> int:
    """Serve until the client exits."""
    try:
        from axdsl.editor.lsp import serve
    except ImportError as exc:
        print(
            f"axdsl: error: the language server needs pygls ({exc}); "
            "install it with `pip install 'axdsl[lsp]'`",
            file=sys.stderr,
        )
        return EXIT_ERROR
    serve(debounce=args.debounce)
    return EXIT_OK
