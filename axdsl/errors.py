"""Diagnostics: every user mistake becomes `file:line:col: error: message`, the line, a caret, a hint.

Passes collect diagnostics in a `Diagnostics` bag and raise `CompileError` once at the end of a
stage, so one run reports every independent mistake together (as sqlglot does).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass(frozen=True)
class Diagnostic:
    """One error with its location and an optional hint that says how to fix it."""

    span: Span
    message: str
    hint: str | None = None

    def render(self, sources: dict[str, str]) -> str:
        lines = [f"{self.span}: error: {self.message}"]
        text = sources.get(self.span.file)
        if text is not None and self.span.line > 0:
            src_lines = text.splitlines()
            if self.span.line <= len(src_lines):
                width = 1
                if self.span.end_line == self.span.line and self.span.end_col > self.span.col:
                    width = self.span.end_col - self.span.col
                src, col, width = clip(src_lines[self.span.line - 1], self.span.col, width)
                lines.append(f"  {src}")
                lines.append("  " + " " * (col - 1) + "^" * max(1, width))
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


SHOWN_COLUMNS = 100  # a source line longer than this is shown clipped around the caret


def clip(line: str, col: int, width: int, limit: int = SHOWN_COLUMNS) -> tuple[str, int, int]:
    """`line` cut to about `limit` columns around the caret at `col` (1-based), with `...` where
    text was left out; returns the shown text and the caret's column and width in it."""
    if len(line) <= limit:
        return line, col, width
    width = min(width, limit // 2)
    start = max(0, min(col - 1 - limit // 3, len(line) - limit))
    shown = line[start:start + limit]
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + limit < len(line) else ""
    return prefix + shown + suffix, col - start + len(prefix), width


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


@dataclass
class Diagnostics:
    """A bag of diagnostics collected by one stage."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        diag = Diagnostic(span, message, hint)
        if diag not in self.items:
            self.items.append(diag)

    def raise_if_any(self, sources: dict[str, str] | None = None) -> None:
        if self.items:
            raise CompileError(list(self.items), sources)

    def __bool__(self) -> bool:
        return bool(self.items)


def did_you_mean(name: str, candidates: list[str] | set[str] | tuple[str, ...]) -> str | None:
    """A hint naming the closest candidate, or None when nothing is close."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8")
