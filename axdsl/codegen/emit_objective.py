"""The loss of a non-next-token objective in model.py: its registry entry's text.

Each objective's loss_fn (and its helpers: masked_lm's `mask_tokens`, the `accuracy` of the
objectives with that metric) is written by the function its entry in axdsl/objectives/ names
(`Objective.loss`, in axdsl/objectives/losses.py); this module gives it the model it is written
against. next_token keeps its template in model.py.j2 (its entry has no `loss`).
"""

from __future__ import annotations

from typing import Any

from axdsl import objectives
from axdsl.ir import nodes as ir
from axdsl.objectives.losses import LossSite


def objective_doc(name: ir.ObjectiveKind | str) -> str:
    """What model.py's loss_fn computes for objective `name`, for the file's docstring."""
    return objectives.get(name).doc


def objective_code(
    name: ir.ObjectiveKind | str, args: dict[str, Any], root: ir.Instance, rng: bool, aux: bool
) -> str:
    """loss_fn (and helpers) for objective `name` with arguments `args`."""
    loss = objectives.get(name).loss
    return loss(LossSite(root, args, rng, aux)) if loss is not None else ""
