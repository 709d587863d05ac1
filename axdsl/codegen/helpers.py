"""Small helper functions copied into generated code only when a primitive needs them."""

from __future__ import annotations

APPLY_ROPE = '''def apply_rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding on x [B, S, heads, head_dim] (Llama's half-split layout)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))  # [head_dim / 2]
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freqs  # [S, head_dim / 2]
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)'''

DROPOUT = '''def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity when `rng` is None (evaluation)."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _fold(rng: jax.Array | None, i) -> jax.Array | None:
    """A distinct key per dropout site and layer; None stays None."""
    return None if rng is None else jax.random.fold_in(rng, i)'''

HELPERS = {"apply_rope": APPLY_ROPE, "dropout": DROPOUT}
