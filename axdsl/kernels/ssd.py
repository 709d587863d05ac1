"""Mamba-2's state-space dual (SSD) scan, chunk by chunk (Dao & Gu 2024; see primitives/ssd.py).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import jax
import jax.numpy as jnp


def segment_sum(a: jax.Array) -> jax.Array:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, -inf above the diagonal.

    A cumulative sum of masked copies rather than a difference of cumulative sums: no
    cancellation between large partial sums (transformers' `segment_sum`).
    """
    n = a.shape[-1]
    x = jnp.broadcast_to(a[..., :, None], (*a.shape, n))  # x[..., i, j] = a[i]
    x = jnp.where(jnp.tril(jnp.ones((n, n), bool), -1), x, 0.0)
    x = jnp.cumsum(x, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((n, n), bool)), x, -jnp.inf)


def ssd(
    x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, chunk: int
) -> jax.Array:
    """Mamba-2's selective scan, chunked: x [B, S, H, P], dt [B, S, H], a [H], b and c [B, S, G, N]
    -> y [B, S, H, P] in float32, with state[t] = exp(dt a) state[t-1] + dt x b^T and y = state c.
    """
    batch, seq, heads, head_dim = x.shape
    groups = b.shape[2]
    x, dt, a, b, c = (t.astype(jnp.float32) for t in (x, dt, a, b, c))
    b = jnp.repeat(b, heads // groups, axis=2)  # [B, S, H, N]: one group per heads // groups heads
    c = jnp.repeat(c, heads // groups, axis=2)

    pad = -seq % chunk  # zero steps at the end: dt = 0 leaves the state as it is
    if pad:
        x, dt, b, c = (
            jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2)) for t in (x, dt, b, c)
        )
    x = x * dt[..., None]  # discretized input
    log_decay = a * dt  # [B, S, H]: log of each step's decay

    # [B, n, L, ...]: n chunks of L = chunk positions
    x, log_decay, b, c = (t.reshape(batch, -1, chunk, *t.shape[2:]) for t in (x, log_decay, b, c))
    log_decay = log_decay.transpose(0, 3, 1, 2)  # [B, H, n, L]
    cum = jnp.cumsum(log_decay, axis=-1)

    # 1. within each chunk: y[l] = sum_{s <= l} (c[l] . b[s]) exp(cum[l] - cum[s]) x[s]
    decay = jnp.exp(segment_sum(log_decay))  # [B, H, n, L, L]
    scores = jnp.einsum("bclhn,bcshn->bhcls", c, b) * decay
    y_diag = jnp.einsum("bhcls,bcshp->bclhp", scores, x)

    # 2. each chunk's own contribution to the state at its end
    to_end = jnp.exp(cum[..., -1:] - cum)  # [B, H, n, L]
    chunk_states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", b, to_end, x)

    # 3. across chunks: the state entering each chunk
    def step(state, inputs):
        chunk_decay, new = inputs  # [B, H], [B, H, P, N]
        return state * chunk_decay[..., None, None] + new, state

    start = jnp.zeros_like(chunk_states[:, 0])
    _, entering = jax.lax.scan(
        step,
        start,
        (jnp.exp(cum[..., -1]).transpose(2, 0, 1), chunk_states.transpose(1, 0, 2, 3, 4)),
    )
    entering = entering.transpose(1, 0, 2, 3, 4)  # [B, n, H, P, N]

    # 4. the entering state read out at each position, decayed to it
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", c, entering, jnp.exp(cum))
    y = (y_diag + y_off).reshape(batch, -1, heads, head_dim)
    return y[:, :seq]
