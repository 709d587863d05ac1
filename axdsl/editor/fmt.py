"""`axdsl fmt`: one canonical layout for .axl files, computed from the token stream.

The layout keeps the author's line breaks and comments and decides only whitespace:

- indentation is two spaces per open `{`; a closing `}` goes back to its opener's line;
- a line that continues inside `(` or `[` aligns with the first token after the bracket
  (`layer Attention(dim: int,` / `                heads: int`); when the bracket ends its line,
  the next lines indent four spaces past the opener's line, and a closing bracket that starts a
  line goes back to the opener's line;
- a statement that continues on the next line outside brackets indents four spaces more;
- one space between tokens, none inside brackets, before `,` `:` `.` `)` `]`, after a sign, or
  between a name and its `(`; two spaces between statements or settings written on one line
  (`dim = 64  heads = 4`) and before a trailing comment;
- no trailing spaces, no tabs outside strings and comments, LF line ends, at most one blank
  line in a row, none at the start of the file or of a block, one newline at the end.

There is no column alignment (of `=` or of comments) and no line wrapping: both make a one-line
change rewrite its neighbours. Formatting is idempotent and never changes what a file means
(tests/test_fmt.py re-parses every formatted file and compares the ASTs and generated code).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from axdsl.editor.tokens import Tok, normalize, tokens

INDENT = 2  # spaces per open `{`
CONTINUATION = 4  # extra spaces for a hanging bracket or a statement continued on the next line
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = frozenset(_OPENERS.values())
_NO_SPACE_BEFORE = frozenset({")", "]", ",", ".", ":"})
_NO_SPACE_AFTER = frozenset({"(", "[", "."})
# Tokens after which `(` opens a call or an argument list, written without a space.
_CALLABLE_KINDS = frozenset({"NAME", "FORWARD", "RPAR", "RSQB"})


@dataclass
class _Open:
    """A bracket still open: its character and where the lines inside it start."""

    char: str
    inner: int  # the indentation of lines inside it
    outer: int  # the indentation of the opener's line, where its closer goes back to


@dataclass
class _Layout:
    """The state of the output while tokens are placed one by one."""

    lines: list[str] = field(default_factory=list)
    current: str = ""
    line_indent: int = 0  # the indentation of the output line being written
    stack: list[_Open] = field(default_factory=list)


def format_source(source: str, path: str) -> str:
    """`source` (the text of `path`) in the canonical layout; raises CompileError when it does
    not parse."""
    text = normalize(source)
    toks = tokens(text, path)
    if not toks:
        return ""
    out = _Layout()
    prev: Tok | None = None
    for i, tok in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if prev is None or tok.line > prev.line:
            _new_line(out, tok, prev)
        else:
            out.current += _space(prev, tok) + tok.text
        _track_brackets(out, tok, nxt)
        prev = tok
    out.lines.append(out.current)
    return "\n".join(line.rstrip() for line in out.lines) + "\n"


def _new_line(out: _Layout, tok: Tok, prev: Tok | None) -> None:
    """Start an output line for `tok`, after at most one blank line kept from the source."""
    if prev is not None:
        out.lines.append(out.current)
        opened_block = prev.text == "{" and not prev.is_comment
        if tok.line - prev.line > 1 and not opened_block and tok.text != "}":
            out.lines.append("")
    out.line_indent = _indent(out, tok)
    out.current = " " * out.line_indent + tok.text


def _indent(out: _Layout, tok: Tok) -> int:
    """Where a line that starts with `tok` starts."""
    top = out.stack[-1] if out.stack else None
    if tok.text in _CLOSERS and not tok.is_comment:
        return _closer_indent(out)
    if top is not None and top.char != "{":
        return top.inner
    base = top.inner if top is not None else 0
    if tok.starts_statement or tok.is_comment or tok.text == "else" or top is None:
        return base
    return base + CONTINUATION


def _closer_indent(out: _Layout) -> int:
    """A closing bracket that starts a line goes back to the indentation of its opener's line."""
    top = out.stack[-1] if out.stack else None
    if top is None:
        return 0
    return _block_indent(out) - INDENT if top.char == "{" else top.outer


def _block_indent(out: _Layout) -> int:
    """The indentation of statements in the innermost open block (0 at the top level)."""
    blocks = [o.inner for o in out.stack if o.char == "{"]
    return blocks[-1] if blocks else 0


def _track_brackets(out: _Layout, tok: Tok, nxt: Tok | None) -> None:
    """Open or close a bracket after `tok` has been placed."""
    if tok.is_comment:
        return
    if tok.text in _OPENERS:
        if tok.text == "{":  # blocks nest in blocks only, never inside brackets
            inner = _block_indent(out) + INDENT
        elif nxt is not None and nxt.line == tok.line and not nxt.is_comment:
            inner = len(out.current)  # visual: align with the token after the bracket
        else:
            inner = out.line_indent + CONTINUATION  # hanging
        out.stack.append(_Open(tok.text, inner, out.line_indent))
    elif tok.text in _CLOSERS and out.stack:
        out.stack.pop()


def _space(prev: Tok, tok: Tok) -> str:
    """The whitespace between two tokens on one line."""
    if tok.is_comment:
        return "  "
    if tok.starts_statement and prev.text not in ("{", "else"):
        return "  "
    if prev.text == "{" and tok.text == "}":
        return ""
    if tok.text in _NO_SPACE_BEFORE or prev.text in _NO_SPACE_AFTER or prev.is_sign:
        return ""
    if tok.text == "(" and prev.kind in _CALLABLE_KINDS:
        return ""
    return " "


def unified_diff(before: str, after: str, path: str) -> str:
    """The change fmt makes to `path`, as `diff -u` shows it."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"{path} (original)",
            f"{path} (formatted)",
        )
    )
