"""Naming in generated code: snake_case function names, einsum letters, safe literals."""

from __future__ import annotations

import re


def snake(name: str) -> str:
    """`DecoderLM` -> `decoder_lm`, `RMSNorm` -> `rms_norm`, `SwiGLU` -> `swiglu`, `MoE` -> `moe`."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()
    for word in ("swiglu", "moe"):  # names that are words, not camel-case compounds
        s = re.sub("(^|_)" + "_?".join(word) + "($|_)", lambda m: m.group(1) + word + m.group(2), s)
    return s


def einsum_letters(names: list[str]) -> dict[str, str]:
    """Give each dim name a distinct letter, preferring its own first letter (`heads` -> h)."""
    letters: dict[str, str] = {}
    used: set[str] = set()
    for n in names:
        if n in letters:
            continue
        for c in (n[0].lower(), *n[1:].lower(), *"abcdefghijklmnopqrstuvwxyz"):
            if c.isalpha() and c not in used:
                letters[n] = c
                used.add(c)
                break
    return letters


def py_str(s: str) -> str:
    """A Python string literal for `s` that cannot break out of its quotes."""
    return repr(str(s))
