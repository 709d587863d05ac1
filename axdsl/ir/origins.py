"""Where a resolved value came from: `Origin`, and `Choice` (a value with its origin)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from axdsl.errors import Span, is_library


class OriginKind(Enum):
    """Where a resolved value came from."""

    SET = "set"  # written in the spec (a model setting, a constructor argument, a train key)
    INHERITED = "inherited"  # taken from the nearest enclosing layer with the same name
    DEFAULT = "default"  # the declaration's or the compiler's default
    PROFILE = "profile"  # a hardware profile's default (targets/profiles.toml)
    TARGET_BLOCK = "target"  # a directive in a matching `target "pattern" { }` block
    FIT = "fit"  # chosen by a pass from the memory model; `where` says who asked (fit_remat)


@dataclass(frozen=True)
class Origin:
    """Where a value came from, printed by `axdsl dump` and in generated comments.

    `where` is the owner's path (INHERITED), the profile name (PROFILE) or the block's pattern
    (TARGET_BLOCK); `note` says why a default was adjusted.
    """

    kind: OriginKind
    span: Span | None = None
    where: str = ""
    note: str = ""

    def __str__(self) -> str:
        match self.kind:
            case OriginKind.SET:
                return f"set at {self.span or '?'}"
            case OriginKind.INHERITED:
                return f"inherited from {self.where}"
            case OriginKind.PROFILE:
                return f"profile {self.where}"
            case OriginKind.TARGET_BLOCK:
                return f'target "{self.where}" at {self.span}'
            case OriginKind.FIT:
                return f"fit_remat, for {self.where}"
        return f"default ({self.note})" if self.note else "default"

    @property
    def is_default(self) -> bool:
        return self.kind is OriginKind.DEFAULT

    @property
    def from_spec(self) -> bool:
        """Written by the user: a setting or a target block directive."""
        return self.kind in (OriginKind.SET, OriginKind.TARGET_BLOCK)


def set_at(span: Span) -> Origin:
    return Origin(OriginKind.SET, span)


DEFAULT = Origin(OriginKind.DEFAULT)


@dataclass(frozen=True)
class Choice:
    """One resolved setting and where it came from (a default, a profile, a spec line)."""

    value: Any
    origin: Origin = DEFAULT

    @property
    def span(self) -> Span | None:
        return self.origin.span


def user_line(names: Iterable[str], origins_of: Callable[[str], Iterable[Origin]]) -> Span | None:
    """The user's line behind an error in a library layer: where the user set one of `names`.

    `origins_of(name)` yields the origins of `name` from the failing instance outwards: an
    inherited value yields its owner's origin next. The first name the user set in their own
    spec wins; a default or a library line ends that name's chain.
    """
    for name in names:
        for origin in origins_of(name):
            if origin.kind is OriginKind.INHERITED:
                continue
            if origin.from_spec and origin.span is not None and not is_library(origin.span):
                return origin.span
            break
    return None
