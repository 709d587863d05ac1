"""Mesh arithmetic the sharded kernels share (splash attention, context parallelism).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import math


def dividing_axes(mesh, names: tuple[str, ...], size: int) -> tuple[str, ...]:
    """The mesh axes of `names`, in order, whose product of sizes divides `size`: how far a dim
    of `size` splits over them evenly."""
    axes: list[str] = []
    for name in names:
        if name in mesh.axis_names:
            if size % (math.prod(mesh.shape[a] for a in axes) * mesh.shape[name]) == 0:
                axes.append(name)
    return tuple(axes)
