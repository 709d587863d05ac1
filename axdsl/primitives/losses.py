"""Losses a spec writes itself (objective = loss()): per-example softmax cross-entropy.

    ce = cross_entropy(logits, labels)     logits [..., classes], labels [...] (ids) -> [...] f32
    return mean(ce, B)                     the loss, one number (kept as [1])

ce = logsumexp(logits) - logits[label], in float32 over the last dim, which is the classes
(or the vocab). With `mean`, `sum`, `where` and comparisons this writes any weighted or masked
variant: `sum(ce * weights, S) / sum(weights, S)`.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.primitives.base import Helper, Primitive, Signature, always
from axdsl.primitives.base import Source
from axdsl.primitives.reductions import ir_fmt

CROSS_ENTROPY = Source("losses", ("cross_entropy",))
# The next-token objective's loss_fn when split_head cut the model at its head (Model.head):
# plan_functions records it for such a model; no call of `cross_entropy` needs it.
FUSED_CROSS_ENTROPY = Helper(
    "fused_cross_entropy",
    Source(
        "fused_loss",
        (
            "fused_cross_entropy",
            "_chunked_cross_entropy",
            "_fused_cross_entropy_fwd",
            "_fused_cross_entropy_bwd",
        ),
    ),
    ("import functools", "import jax", "import jax.numpy as jnp"),
)


def _shape(ctx, prim: ir.Prim, args):
    logits, labels = args[0].type.dims, args[1].type.dims
    if not logits or logits[-1].is_ellipsis or logits[-1].size is None:
        ctx.fail(
            prim.span,
            "`cross_entropy` needs logits [..., classes] with a sized last dim, "
            f"got {ir_fmt(logits)}",
        )
    lead = logits[:-1]
    if len(labels) != len(lead) or not all(a.same(b) for a, b in zip(lead, labels, strict=True)):
        ctx.fail(
            prim.span,
            f"`cross_entropy` labels {ir_fmt(labels)} do not match the logits' leading dims "
            f"{ir_fmt(lead)}",
            "labels hold one id per row of logits: logits [B, classes], labels [B]",
        )
    return labels


def _emit(ctx, prim: ir.Prim, args: list[str], precs: list[int]) -> str:
    ctx.use_helper("cross_entropy")
    return f"cross_entropy({args[0]}, {args[1]})"


def _memory(t, prim: ir.Prim, args, dims, label: str):
    """Keeps a float32 copy of the logits for the backward (softmax - one-hot is recomputed from
    it; jax 0.10's logsumexp saves its input and the max)."""
    out = t.new(dims, "f32", label, tuple(args))
    t.save(
        t.internal(ir.tensor_type(prim.args[0]).dims, "f32", f"{label} logits (f32)", (args[0],))
    )
    return out


PRIMITIVES = (
    Primitive(
        "cross_entropy",
        Signature(
            ("logits", "labels"),
            doc="softmax cross-entropy over the last dim: logits [..., C], labels [...]",
        ),
        emit=_emit,
        shape=_shape,
        memory=_memory,
        helpers=(Helper("cross_entropy", CROSS_ENTROPY), FUSED_CROSS_ENTROPY),
        needs=always("cross_entropy"),
    ),
)
