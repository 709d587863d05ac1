"""The cut of a decoder LM's root at its output head, for the fused cross-entropy of `loss_fn`.

The next-token loss does not need the float32 logits [B, S, vocab] all at once (4.2 GB per
8192-token sequence at Llama 3's vocabulary, and as much again for their gradient). The generated
`loss_fn` runs the model up to its head (`<root>_hidden`, ending at the final norm), then the head
and the cross-entropy a chunk of positions at a time (`fused_cross_entropy` in templates/model.py.j2),
taking each chunk's gradient as it goes. The pass that finds the cut is axdsl/passes/split_head.py;
this module holds what it records (`Model.head`).
"""

from __future__ import annotations

from dataclasses import dataclass

from axdsl.ir import nodes as ir

# Positions per chunk of the fused cross-entropy without a target (a target's is its profile's
# loss_chunk): the generated LOSS_CHUNK, and axdsl aot's.
LOSS_CHUNK = 512


@dataclass(frozen=True)
class HeadSplit:
    """The root cut in two: `body` returns the hidden state, `head` maps it to the logits."""

    body: ir.Instance  # the root's forward up to the head, returning `hidden`
    head: ir.Instance  # forward(hidden) -> logits: the tail of the root's statements
    hidden: str  # the value the head reads, its one argument
    params: tuple[str, ...]  # the top-level keys of the parameter tree the head reads
    chunk: int = LOSS_CHUNK  # positions per chunk of the fused cross-entropy on this target


def has_lm_signature(root: ir.Instance) -> bool:
    """tokens [B, S] -> logits [B, S, vocab]: the next-token objective's model."""
    f = root.forward
    return len(f.args) == 1 and len(f.args[0].dims) == 2 and len(f.result) == 3
