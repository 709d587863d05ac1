"""Softmax cross-entropy over integer labels, in float32.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy of logits [..., classes] against integer labels [...] -> [...]
    (float32)."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked
