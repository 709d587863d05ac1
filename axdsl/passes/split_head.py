"""split_head: cut a decoder LM's root at its output head, for the fused cross-entropy.

    model lm > / : DecoderLM                      ->    head: x [B, S, dim=64] -> logits
      forward(tokens: [B, S]) -> [B, S, vocab]           reads (head), 512 positions a chunk
        ... x = final_norm(x)
        logits = (x @ head)

The generated `loss_fn` runs the model up to the cut (`<root>_hidden`) and the head with the
cross-entropy a chunk of positions at a time. The logits are the same numbers either way, so
that is the same loss, but only when the head is position-wise: one position's logits read that
position's hidden state and nothing else. `head_of` (axdsl/analysis/head.py) finds the longest
tail of the root's statements that is, reading one earlier value [B, S, ...]; a model without
one, or whose objective is not next-token prediction, keeps the plain loss over the full logits
(no `head`).
The chunk is the target profile's `loss_chunk`.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.analysis.head import loss_chunk, loss_split
from axdsl.ir import nodes as ir
from axdsl.objectives import objective_name


def split_head(module: ir.Module) -> ir.Module:
    objective = objective_name(module)
    chunk = loss_chunk(module.schedule)
    models = []
    for model in module.models:
        split = loss_split(model.root, objective)
        models.append(replace(model, head=replace(split, chunk=chunk) if split else None))
    return replace(module, models=tuple(models))
