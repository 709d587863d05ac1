"""Naming in generated code: snake_case function names, einsum letters, safe literals.

Every name, path or string a user wrote (a spec or imported file's path, a data file, a target
pattern, a run directory) reaches generated code through one function per place it lands:
`py_str` in Python code, `py_comment` in a Python `#` comment, `py_doc` in a docstring, and `sh`
in slurm.sh (code and comments alike). Each is the identity on a plain name, so outputs of plain
specs read as before; none lets a value end its literal, comment or docstring. The templates reach
them as the filters `pystr`, `py_comment`, `py_doc` and `sh` (codegen/emit.py registers them).
"""

from __future__ import annotations

import shlex

from axdsl.ir.expr import Expr, field_of
from axdsl.ir.names import snake as snake  # re-exported: codegen names things with it too


def py_str(s: str) -> str:
    """A Python string literal for `s` that cannot break out of its quotes."""
    return repr(str(s))


def _escaped(c: str) -> str:
    """A character that is not printable as a backslash escape: `\\n`, `\\x00`, `\\u2028`,
    `\\udcff` (a byte of a file name that is not UTF-8)."""
    return repr(c)[1:-1]


def py_comment(s: str) -> str:
    """`s` as text that cannot end a Python `#` comment: backslashes doubled, and every character
    that is not printable (newline, carriage return, form feed, NUL, U+2028, a lone surrogate,
    a bidirectional control) as its escape. A comment ends only at a line break."""
    s = str(s)
    if s.isprintable() and "\\" not in s:
        return s
    return "".join(c if c.isprintable() and c != "\\" else _escaped(c) for c in s)


def py_doc(s: str) -> str:
    """`s` as text inside a `\"\"\"` docstring: as `py_comment`, and `"` as `\\"`, so that
    it can neither close the docstring nor make an escape Python rejects (`\\N`)."""
    return py_comment(s).replace('"', '\\"')


def sh(s: str) -> str:
    """`s` as one bash word that expands to exactly `s`, and holds no line break, so it is safe
    in a comment too: shlex.quote, or `$'...'` with escapes where `s` has a character that is not
    printable (a byte of a file name that is not UTF-8 becomes that byte, `\\xff`)."""
    s = str(s)
    if s.isprintable():
        return shlex.quote(s)
    return "$'" + "".join(_sh_char(c) for c in s) + "'"


def _sh_char(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if c.isprintable():
        return c
    raw = c.encode("utf-8", "surrogateescape")
    return "".join(f"\\x{b:02x}" for b in raw)


def dim_label(name: str, size: Expr | None = None) -> str:
    """How generated comments name a dim: its Config field when its size is exactly `cfg.<field>`
    (a layer's `hidden` that is `cfg.ffn` at the root reads `ffn`), else its own name (head_dim)."""
    return field_of(size) or name


def distinct_labels(keys: list[str]) -> list[str]:
    """Prime repeated keys (dim, dim -> dim, dim') so two dims of one einsum never share a
    letter."""
    out: list[str] = []
    for k in keys:
        while k in out:
            k += "'"
        out.append(k)
    return out


class EinsumLetters:
    """One einsum letter per dim label for a whole model, assigned on first use and never reused.

    A label prefers its own first letter (`heads` -> h), then its other letters, then the
    alphabet; `head_dim` after `heads` gets e. d is kept for `dim`, the model width every layer
    reads, whichever label comes first. Two different dims with one label in one expression
    (x [B, S, dim] @ w [dim, dim]) take the label and the label with a prime.
    """

    def __init__(self) -> None:
        self.letters: dict[str, str] = {}

    def __getitem__(self, key: str) -> str:
        if key not in self.letters:
            used = set(self.letters.values())
            base = key.rstrip("'")
            for c in (base[0].lower(), *base[1:].lower(), *"abcdefghijklmnopqrstuvwxyz"):
                if c.isalpha() and c.islower() and c not in used and (c != "d" or base == "dim"):
                    self.letters[key] = c
                    break
            else:
                raise AssertionError("ran out of einsum letters")
        return self.letters[key]

    def legend(self) -> str:
        """`b=B s=S d=dim ...` in the order the letters were assigned."""
        return " ".join(f"{c}={k}" for k, c in self.letters.items())


def spec_text(spec: tuple[tuple[str, ...], ...]) -> str:
    """A PartitionSpec as Python: P(None, "fsdp", ("data", "fsdp"))."""
    parts = []
    for axes in spec:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(f'"{axes[0]}"')
        else:
            parts.append("(" + ", ".join(f'"{a}"' for a in axes) + ")")
    while parts and parts[-1] == "None":
        parts.pop()
    return f"P({', '.join(parts)})"
