"""The train block's fine-tuning settings: where a new run's parameters come from, and which of
them training leaves as they are.

    train {
      init_from = "../runs/tiny_llama-hf/params"   # a params checkpoint (axdsl import-hf) or a run
      freeze = "embed/table, blocks/attn/*"        # comma-separated globs over parameter paths
    }

`init_from` is relative to the spec's directory (as data paths are) and is read by train.py when a
run starts with no checkpoint of its own; a resumed run reads its own checkpoints. A frozen
parameter gets no update and no optimizer state (optax.multi_transform with set_to_zero), so the
optimizer's memory drops. Every `freeze` pattern must match a parameter of the first model (a
pattern that matches nothing is a typo), and some parameter must stay trainable.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from axdsl.errors import Diagnostics, Span, did_you_mean
from axdsl.ir import nodes as ir

KEYS = ("init_from", "freeze")


def check(name: str, value: Any, span: Span, diags: Diagnostics) -> str | None:
    """`init_from` is a non-empty path string; `freeze` a string of globs."""
    if not isinstance(value, str) or not value.strip():
        example = (
            'init_from = "runs/tiny_llama-hf/params"'
            if name == "init_from"
            else 'freeze = "embed/*"'
        )
        diags.error(span, f"`{name}` takes a non-empty string", f"for example {example}")
        return None
    return value.strip()


def patterns(freeze: str) -> list[str]:
    """The globs of a `freeze` setting, in order."""
    return [g.strip() for g in freeze.split(",") if g.strip()]


def param_paths(root: ir.Instance) -> list[str]:
    """Every parameter's path as train.py's freeze labels see it (`blocks/attn/wq`)."""
    out: list[str] = []
    for inst in root.walk():
        base = [p for p in inst.path.split("/") if p]
        out.extend("/".join(base + [p.name]) for p in inst.params)
    return out


def cross_check(values: dict[str, ir.Choice], module: ir.Module, diags: Diagnostics) -> None:
    """Every `freeze` glob matches a parameter of the first model, and not every parameter is
    frozen."""
    if "freeze" not in values:
        return
    choice = values["freeze"]
    span = module.report_at(choice.origin.span)
    paths = param_paths(module.models[0].root)
    frozen = set()
    for glob in patterns(choice.value):
        hits = [p for p in paths if fnmatch.fnmatchcase(p, glob)]
        if not hits:
            near = did_you_mean(glob, paths)
            diags.error(
                span,
                f"freeze pattern `{glob}` matches no parameter of {module.models[0].name}",
                near
                or f"its parameters: {', '.join(paths[:8])}{', ...' if len(paths) > 8 else ''}",
            )
        frozen.update(hits)
    if paths and frozen == set(paths):
        diags.error(
            span,
            f"`freeze` covers every parameter of {module.models[0].name}: nothing would train",
            "name only the parameters to keep as they are",
        )
