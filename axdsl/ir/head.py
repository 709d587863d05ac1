"""The cut of a decoder LM's root at its output head, for the fused cross-entropy of `loss_fn`.

The next-token loss does not need the float32 logits [B, S, vocab] all at once (4.2 GB per
8192-token sequence at Llama 3's vocabulary, and as much again for their gradient). The generated
`loss_fn` runs the model up to its head (`<root>_hidden`, ending at the final norm), then the head
and the cross-entropy a chunk of positions at a time (`fused_cross_entropy` in
templates/model.py.j2), taking each chunk's gradient as it goes. The pass that finds the cut is
axdsl/passes/split_head.py; what it records is `ir.HeadSplit` (`Model.head`); this module holds the
signature test.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir


def has_lm_signature(root: ir.Instance) -> bool:
    """tokens [B, S] -> logits [B, S, vocab], or (tokens, segments [B, S]) for packed rows: the
    next-token objective's model."""
    f = root.fwd
    if len(f.result) != 3 or not f.args or len(f.args[0].dims) != 2:
        return False
    return len(f.args) == 1 or (len(f.args) == 2 and takes_segments(root))


def takes_segments(root: ir.Instance) -> bool:
    """Whether the root reads `segments` [B, S] after its tokens: its rows are packed with
    several sequences (a DecoderLM with `packed = true`)."""
    f = root.fwd
    return len(f.args) == 2 and f.args[1].name == "segments" and len(f.args[1].dims) == 2
