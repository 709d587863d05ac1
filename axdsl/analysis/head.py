"""Where a decoder LM's output head starts: the cut the fused cross-entropy runs over.

`head_of` finds the longest tail of the root's statements that is position-wise (one position's
logits read that position's hidden state and nothing else) and reads one earlier value
[B, S, ...]; `loss_split` applies it where the objective is next-token prediction; `loss_chunk` is
the target profile's chunk. The pass split_head records the result as `Model.head`; the memory
model asks for the same cut earlier, when fit_remat weighs the step before that pass runs.
"""

from __future__ import annotations

from dataclasses import replace

from axdsl import primitives
from axdsl.ir import nodes as ir
from axdsl.ir.head import has_lm_signature
from axdsl.ir.nodes import LOSS_CHUNK, HeadSplit, RefKind, TensorType
from axdsl.ir.rewrite import walk_expr
from axdsl.primitives.base import Decoding
from axdsl.targets import profiles


def loss_chunk(schedule: ir.Schedule | None) -> int:
    """Positions per chunk of the fused cross-entropy that `schedule`'s target runs."""
    return profiles()[schedule.profile].loss_chunk if schedule is not None else LOSS_CHUNK


def loss_split(root: ir.Instance, objective: str) -> HeadSplit | None:
    """The split the generated next-token `loss_fn` runs its fused cross-entropy over, or None
    when it computes the plain loss over the full logits (another objective, or no position-wise
    head)."""
    return head_of(root) if objective == "next_token" and has_lm_signature(root) else None


def head_of(root: ir.Instance) -> HeadSplit | None:
    """The root split at its output head, or None when no tail of its statements is a
    position-wise function of one earlier [B, S, ...] value."""
    if root.forward is None:  # a model without a forward has no head
        return None
    body = root.forward.body
    start = len(body)
    while start > 0 and _tail_statement(body[start - 1]):
        start -= 1
    for k in range(start, len(body)):
        split = _split_at(root, k)
        if split is not None:
            return split
    return None


def _split_at(root: ir.Instance, k: int) -> HeadSplit | None:
    """The split before statement `k` when the statements from `k` on read exactly one earlier
    value, a tensor [B, S, ...], and every tensor they make keeps B and S in front."""
    fwd = root.forward
    assert fwd is not None, "head_of checked the forward"
    tail = fwd.body[k:]
    defined = {s.name for s in tail if isinstance(s, ir.Let)}
    free = {
        e.name: e
        for s in tail
        for e in walk_expr(s.value)
        if isinstance(e, ir.Ref)
        and e.kind in (RefKind.LOCAL, RefKind.ARG)
        and e.name not in defined
    }
    if len(free) != 1:
        return None
    (ref,) = free.values()
    t = ref.type
    if (
        not isinstance(t, TensorType)
        or len(t.dims) < 3
        or not (t.dims[0].is_free and t.dims[1].is_free)
    ):
        return None
    b, s = t.dims[0], t.dims[1]
    if not all(_positionwise(e, b, s) for st in tail for e in walk_expr(st.value)):
        return None
    ret = ir.Ret(replace(ref, kind=RefKind.LOCAL), ref.span)
    body = replace(root, forward=replace(fwd, body=fwd.body[:k] + (ret,), result=t.dims))
    head = replace(
        root, forward=replace(fwd, args=(ir.Arg(ref.name, t.dims, ref.span),), body=tail)
    )
    keys = []
    for st in tail:
        for e in walk_expr(st.value):
            if isinstance(e, ir.Ref) and e.kind in (RefKind.PARAM, RefKind.CHILD_PARAM):
                key = e.name if e.kind is RefKind.PARAM else e.owner
                if key not in keys:
                    keys.append(key)
    return HeadSplit(body, head, ref.name, tuple(keys))


def _tail_statement(stmt: ir.Let | ir.Ret) -> bool:
    """No child call (a child may mix positions; the head is the root's own arithmetic)."""
    return not any(isinstance(e, ir.CallChild) for e in walk_expr(stmt.value))


def _positionwise(e: ir.TExpr, b: ir.Dim, s: ir.Dim) -> bool:
    """Whether `e` computes each (batch, position) from that position alone: a tensor with the
    batch or sequence dim has them in front; a matmul contracts neither; a primitive is
    position-wise by its registry entry and takes no static over them; no runtime size is read
    (`S` would be a chunk's length inside the chunked loss)."""
    if isinstance(e, ir.Ref) and e.kind is RefKind.DIM:
        return False
    t = getattr(e, "type", None)
    if isinstance(t, TensorType) and any(d.is_free for d in t.dims):
        if len(t.dims) < 2 or not (t.dims[0].same(b) and t.dims[1].same(s)):
            return False
    if isinstance(e, ir.Bin) and e.op is ir.BinOp.MATMUL:
        right = e.right.type
        return isinstance(right, TensorType) and not any(d.is_free for d in right.dims)
    if isinstance(e, ir.Prim):
        if primitives.get(e.name).decoding is not Decoding.POSITIONWISE:
            return False
        for _, value in e.attrs:
            dim = getattr(value, "value", value)
            if isinstance(dim, ir.Dim) and (dim.same(b) or dim.same(s)):
                return False
    return True
