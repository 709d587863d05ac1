"""Inverted dropout and the per-layer fold of its key.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import jax
import jax.numpy as jnp


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity when `rng` is None (evaluation)."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _fold(rng: jax.Array | None, i) -> jax.Array | None:
    """A distinct key per dropout site and layer; None stays None."""
    return None if rng is None else jax.random.fold_in(rng, i)
