"""Format generated code with black and check it with libcst before anything is written.

The check enforces the allowed shape of generated code (checker.py): it parses; it imports only
jax, numpy, optax, orbax, tqdm, tokenizers and tensorboardX (issue 13), the standard library and
sibling generated files (never axdsl); every import is used; and it calls none of the builtins
that run or load arbitrary code. A failure is a compiler bug.

`format_code` and `check_generated` always run the tools (the tests use them). The build uses
`formatted` and `checked`, which look the result up in the build cache (cache.py) first: black
and libcst are imported only when some text is new, which keeps a warm build well under a second.
"""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from pathlib import Path

from axdsl.codegen import cache

LINE_LENGTH = 100
CHECKED = "ok\n"  # the cache entry of a file that passed the check


class GeneratedCodeError(Exception):
    """Generated code broke a rule: always a compiler bug, never a user mistake."""


def format_code(source: str) -> str:
    """`source` formatted by black (line length 100, Python 3.11)."""
    import black  # about 0.35 s to import: only when something is formatted

    mode = black.Mode(line_length=LINE_LENGTH, target_versions={black.TargetVersion.PY311})
    try:
        return black.format_str(source, mode=mode)
    except black.InvalidInput as exc:  # a compiler bug: show the offending source
        raise GeneratedCodeError(f"generated code does not parse: {exc}\n{source}") from None


def check_generated(source: str, path: str) -> None:
    """Raise GeneratedCodeError naming `path` when `source` breaks a rule of checker.py."""
    from axdsl.codegen import checker  # imports libcst, about 0.6 s

    if problems := checker.problems(source):
        raise GeneratedCodeError(f"{path}: " + "; ".join(problems))


def formatted(source: str) -> str:
    """format_code(source), from the build cache when this text was formatted before."""
    name = cache.key("format", _tools(), source)
    if (text := cache.get("format", name)) is None:
        text = format_code(source)
        cache.put("format", name, text)
    return text


def checked(source: str, path: str) -> None:
    """check_generated(source, path), skipped when this text already passed under this name.
    Only passes are cached: a failing file is checked (and reported) every time."""
    name = cache.key("check", _tools(), path, source)
    if cache.get("check", name) != CHECKED:
        check_generated(source, path)
        cache.put("check", name, CHECKED)


@functools.cache
def _tools() -> str:
    """What formatting and checking depend on besides the text: tool and Python versions, the
    line length, and the source of the rules (so an edited checker.py invalidates its entries)."""
    versions = [importlib.metadata.version(tool) for tool in ("black", "libcst")]
    rules = (Path(__file__).parent / "checker.py").read_text(encoding="utf-8")
    return cache.key(*versions, sys.version, str(LINE_LENGTH), rules)
