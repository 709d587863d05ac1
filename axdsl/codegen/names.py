"""Naming in generated code: snake_case function names, einsum letters, safe literals."""

from __future__ import annotations

from axdsl.ir.expr import Expr, field_of
from axdsl.ir.names import snake as snake  # re-exported: codegen names things with it too


def py_str(s: str) -> str:
    """A Python string literal for `s` that cannot break out of its quotes."""
    return repr(str(s))


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
