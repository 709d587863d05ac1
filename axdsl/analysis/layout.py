"""How many ways each tensor is split on the mesh, and bytes per element: per-chip sizes.

Activation sizes are per chip: B over the `batch` mesh axes, S over `seq`, heads and mlp dims over
their rules, each mesh axis used once per tensor (as `annotate_sharding.activation_spec`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from axdsl.ir import nodes as ir

DTYPE_BYTES = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "i8": 1,
    "u8": 1,
    "u16": 2,
    "i32": 4,
    "u32": 4,
    "bool": 1,
}


@dataclass(frozen=True)
class Layout:
    """Mesh sizes and logical-axis rules: how many ways each tensor is split."""

    sizes: dict[str, int]
    rules: dict[str, tuple[str, ...]]
    axes_of_dim: dict[str, str]  # named dim -> logical axis (dim -> embed), plus B and S

    def shards(self, axes) -> int:
        return math.prod(self.sizes.get(a, 1) for a in axes)

    def _axes(self, logical: str | None, used: set[str]) -> tuple[str, ...]:
        if not logical:
            return ()
        return tuple(
            a for a in self.rules.get(logical, ()) if self.sizes.get(a, 1) > 1 and a not in used
        )

    def param_elements(self, p: ir.Param, exclude: tuple[str, ...] = ()) -> int:
        """Elements of `p` on one chip; `exclude` mesh axes are gathered (FSDP at compute time)."""
        used = set(exclude)
        n = 1.0
        for d, logical in zip(p.full_dims, p.full_axes, strict=True):
            axes = self._axes(logical, used)
            used.update(axes)
            n *= ir.static_size(d) / self.shards(axes)
        return int(math.ceil(n))

    def batch_axes(self) -> tuple[str, ...]:
        return self._axes("batch", set())

    def elements(
        self, dims: tuple[ir.Dim, ...], batch: int, seq: int, weight: bool = False
    ) -> float:
        """Elements of an activation on one chip; `weight`: a gathered weight (batch axes
        unused)."""
        used: set[str] = set(self.batch_axes()) if weight else set()
        n = 1.0
        logical: str | None
        for d in dims:
            if d.name == "B" and d.size is None:
                size, logical = batch, "batch"
            elif d.name == "S" and d.size is None:
                size, logical = seq, "seq"
            else:
                size, logical = (d.size or 1), self.axes_of_dim.get(d.name)
            axes = self._axes(logical, used)
            used.update(axes)
            n *= size / self.shards(axes)
        return n
