"""Diagnostics: every user mistake becomes `file:line:col: error: message`, the line, a caret,
a hint.

Passes collect diagnostics in a `Diagnostics` bag and raise `CompileError` once at the end of a
stage, so one run reports every independent mistake together (as sqlglot does).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar


@dataclass(frozen=True)
class Span:
    """A position in a source file (1-based line and column) and the text of that file."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_SPAN = Span("<unknown>", 0, 0)


def is_library(span: Span | None) -> bool:
    """Whether `span` is in a standard-library file (std/...), not in the user's spec."""
    return span is not None and span.file.startswith("std/")


@dataclass(frozen=True)
class Note:
    """A secondary location shown under an error: the library line an error arose in."""

    span: Span
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """One error with its location, an optional hint that says how to fix it, and notes."""

    span: Span
    message: str
    hint: str | None = None
    notes: tuple[Note, ...] = ()

    def render(self, sources: dict[str, str]) -> str:
        lines = [
            f"{shorten_words(str(self.span))}: error: {shorten_words(self.message)}",
            *_excerpt(self.span, sources),
        ]
        if self.hint:
            lines.append(f"  hint: {shorten_words(self.hint)}")
        for note in self.notes:
            lines.append(f"{shorten_words(str(note.span))}: note: {shorten_words(note.message)}")
            lines.extend(_excerpt(note.span, sources))
        return "\n".join(lines)


def _excerpt(span: Span, sources: dict[str, str]) -> list[str]:
    """The source line of `span` and a caret under it (nothing when the text is unknown)."""
    text = sources.get(span.file)
    if text is None or span.line <= 0:
        return []
    src_lines = text.splitlines()
    if span.line > len(src_lines):
        return []
    width = 1
    if span.end_line == span.line and span.end_col > span.col:
        width = span.end_col - span.col
    src, col, width = clip(src_lines[span.line - 1], span.col, width)
    return [f"  {src}", "  " + " " * (col - 1) + "^" * max(1, width)]


def relocated(
    span: Span, message: str, hint: str | None, user: Span | None, where: str
) -> Diagnostic:
    """An error raised in a library line, shown at the user's line `user` with a note for the
    library line; unchanged when there is no user line to point at."""
    if user is None or not is_library(span):
        return Diagnostic(span, message, hint)
    return Diagnostic(user, message, hint, (Note(span, f"raised here, {where}"),))


SHOWN_COLUMNS = 100  # a source line longer than this is shown clipped around the caret


def clip(line: str, col: int, width: int, limit: int = SHOWN_COLUMNS) -> tuple[str, int, int]:
    """`line` cut to about `limit` columns around the caret at `col` (1-based), with `...` where
    text was left out; returns the shown text and the caret's column and width in it."""
    if len(line) <= limit:
        return line, col, width
    width = min(width, limit // 2)
    start = max(0, min(col - 1 - limit // 3, len(line) - limit))
    shown = line[start : start + limit]
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + limit < len(line) else ""
    return prefix + shown + suffix, col - start + len(prefix), width


LONGEST_WORD = 80  # a longer run of non-blank characters in a message is shown shortened


def shorten_words(text: str, limit: int = LONGEST_WORD) -> str:
    """`text` with every word (run of non-blank characters) longer than `limit` cut in the
    middle, saying how long it was, so that a 5 MB name or path never floods the terminal.

    >>> shorten_words("name " + "x" * 100, limit=10)
    'name xxxxxx...xx (a word of 100 characters, shortened)'
    """
    if len(text) <= limit:
        return text
    return re.sub(rf"\S{{{limit + 1},}}", lambda m: _shortened(m.group(), limit), text)


def _shortened(word: str, limit: int) -> str:
    head, tail = word[: limit // 2 + 1], word[-(limit // 4) :]
    return f"{head}...{tail} (a word of {len(word)} characters, shortened)"


class CompileError(Exception):
    """Raised with all diagnostics of a stage; the CLI prints them and exits 1."""

    def __init__(self, diagnostics: list[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics = sorted(
            diagnostics, key=lambda d: (d.span.file, d.span.line, d.span.col, d.message)
        )
        self.sources = sources or {}
        super().__init__(self.render())

    def render(self) -> str:
        body = "\n".join(d.render(self.sources) for d in self.diagnostics)
        n = len(self.diagnostics)
        return f"{body}\n{n} error{'s' if n != 1 else ''} generated."


class InternalError(AssertionError):
    """A compiler bug, not a user error: an invariant an earlier stage establishes does not hold,
    such as a field a pass fills read before that pass ran (see the IR's typed views)."""


@dataclass
class Diagnostics:
    """A bag of diagnostics collected by one stage."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        self.add(Diagnostic(span, message, hint))

    def add(self, diag: Diagnostic) -> None:
        """Record `diag` unless the same error is already there (one user line behind two library
        lines, such as rope on q and on k, is reported once, with the first note)."""
        if not any(
            (d.span, d.message, d.hint) == (diag.span, diag.message, diag.hint) for d in self.items
        ):
            self.items.append(diag)

    def raise_if_any(self, sources: dict[str, str] | None = None) -> None:
        if self.items:
            raise CompileError(list(self.items), sources)

    def __bool__(self) -> bool:
        return bool(self.items)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, or None when nothing is close."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


_T = TypeVar("_T")


def filled(value: _T | None, what: str, by: str) -> _T:
    """`value`, which the stage `by` sets; an InternalError (a compiler bug) when it is None."""
    if value is None:
        raise InternalError(f"{what} is read before {by} set it")
    return value
