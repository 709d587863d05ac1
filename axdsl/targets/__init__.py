"""Hardware targets: profiles shipped as data, looked up by name (`cpu`, `gpu-h100-8`, ...)."""

from __future__ import annotations

import re

from axdsl.errors import did_you_mean

KNOWN_TARGETS = ("cpu",)


class UnknownTarget(ValueError):
    pass


def parse_target(name: str) -> tuple[str, int | None]:
    """`gpu-h100-8` -> ("gpu-h100", 8); `cpu` -> ("cpu", None). Raise UnknownTarget for others."""
    m = re.fullmatch(r"(.+?)(?:-(\d+))?", name)
    base, count = m.group(1), m.group(2)
    if base not in KNOWN_TARGETS:
        hint = did_you_mean(base, KNOWN_TARGETS)
        raise UnknownTarget(f"unknown target `{name}`; known targets: {', '.join(KNOWN_TARGETS)}"
                            + (f" ({hint})" if hint else ""))
    return base, int(count) if count else None


def target_dir_name(name: str) -> str:
    return name.replace("-", "_")
