"""Positions within packed rows: each token's place in its run of equal segment ids.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import jax
import jax.numpy as jnp
import numpy as np


def segment_positions(segments: jax.Array, order=None) -> jax.Array:
    """Each token's position in its run of equal segment ids along the last dim: 0, 1, ...
    restarting where the id changes (a packed row's examples, and the padding after them).
    `order` (numpy [S]): the segments are in that order (context parallelism's zig-zag), so the
    runs are counted in the original order and the positions given back in `order`."""
    if order is not None:
        original = segments[..., np.argsort(order)]
        return segment_positions(original)[..., order]
    idx = jnp.arange(segments.shape[-1], dtype=jnp.int32)
    first = jnp.ones_like(segments[..., :1], dtype=bool)
    starts = jnp.concatenate([first, segments[..., 1:] != segments[..., :-1]], axis=-1)
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=segments.ndim - 1)
