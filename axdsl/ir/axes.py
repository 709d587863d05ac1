"""The logical axis of each named dim: what sharding rules, the decode cache and the memory
model read for an activation's dims."""

from __future__ import annotations

from axdsl.ir import nodes as ir

# Free dims of activations by convention: the spec writes [B, S, ...] for batch and sequence.
FREE_DIM_AXES = {"B": "batch", "S": "seq"}


def dim_axes(root: ir.Instance) -> dict[str, str]:
    """Logical axis of each named dim, read off the parameters (`dim` -> embed), plus B and S."""
    out = dict(FREE_DIM_AXES)
    for inst in root.walk():
        for p in inst.params:
            for d, a in zip(p.dims, p.axes, strict=True):
                out.setdefault(d.name, a)
    return out
