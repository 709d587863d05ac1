"""The one error Hugging Face interop reports, and how the two commands turn errors into exit
codes."""

from __future__ import annotations

import sys
from collections.abc import Callable

from axdsl.errors import CompileError
from axdsl.hf.facts import Arch, Facts


class HFError(Exception):
    """A user-facing problem: a message and the details (one per line)."""

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []

    def render(self) -> str:
        return "\n".join([f"axdsl: error: {self.message}"] + [f"  - {d}" for d in self.details])


def exit_code(command: Callable[..., None], *args) -> int:
    """Run `command(*args)`: 0, or 1 after printing its CompileError or HFError to stderr."""
    try:
        command(*args)
    except CompileError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except HFError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    return 0


def warn_capacity(arch: Arch[Facts], family: str) -> None:
    """A spec MoE that drops tokens over capacity computes other logits than the HF model."""
    capacity = arch.facts.get("capacity_factor")  # a MoE's (MoeFacts)
    if (capacity or 0.0) > 0:
        print(
            f"warning: `{arch.name}` drops tokens over expert capacity (capacity_factor = "
            f"{capacity}); {family} does not, so logits can differ",
            file=sys.stderr,
        )
