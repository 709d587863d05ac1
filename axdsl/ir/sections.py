"""Sections as written: `train { }` and `target "pattern" { }` blocks with typed values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from axdsl.errors import Span, filled


@dataclass(frozen=True)
class NameValue:
    """A bare name in a section, kept for the pass that knows what names mean there (`fp8`)."""

    id: str


@dataclass(frozen=True)
class CallValue:
    """`adamw(lr = 3e-4)` in a section: a function name with positional and keyword values."""

    fn: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


# A section value: a literal (int, float, bool, str), a NameValue, a CallValue, or a tuple (a list).
SectionValue = Any


@dataclass(frozen=True)
class Setting:
    """`name = value` in a section."""

    name: str
    value: SectionValue
    span: Span


@dataclass(frozen=True)
class DirectiveArg:
    """One argument of a directive: `name` is None for a positional one."""

    name: str | None
    value: SectionValue
    span: Span

    @property
    def key(self) -> str:
        """The name of a keyword argument (every one in `Directive.kwargs` has one)."""
        return filled(self.name, "the name of a keyword argument", "the parser")


@dataclass(frozen=True)
class Directive:
    """`mesh(data = -1, fsdp = 8)` in a section: positional and keyword values, each with its
    span."""

    name: str
    args: tuple[DirectiveArg, ...]
    kwargs: tuple[DirectiveArg, ...]
    span: Span


class SectionKind(Enum):
    TRAIN = "train"
    TARGET = "target"


@dataclass(frozen=True)
class Section:
    """A `train { }` or `target "pattern" { }` block: settings and directives, values resolved.

    Values stay close to the syntax (see `SectionValue`); the passes that read a section
    (configure_train, configure_target) check its keys and values.
    """

    kind: SectionKind
    pattern: str | None
    settings: tuple[Setting, ...]
    directives: tuple[Directive, ...]
    span: Span
