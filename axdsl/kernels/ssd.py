"""Mamba-2's state-space dual (SSD) scan, chunk by chunk (Dao & Gu 2024; see primitives/ssd.py).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import functools

import jax
import jax.numpy as jnp


def ssd(
    x: jax.Array, dt: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, chunk: int
) -> jax.Array:
    """Mamba-2's selective scan, chunked: x [B, S, H, P], dt [B, S, H], a [H], b and c [B, S, G, N]
    -> y [B, S, H, P] in float32, with state[t] = exp(dt a) state[t-1] + dt x b^T and y = state c.

    As mamba_ssm's kernels compute it: C.B once per group (not per head), each decay a difference
    of one cumulative sum per chunk, and every product with its operands in x's dtype,
    accumulated in float32 (float32 models stay float32 throughout; a TPU's default precision
    rounds float32 operands to bfloat16 anyway). On one TPU v5e, Mamba-2 2.7B's layer at 4 x
    2048 took 38.1 ms forward and backward with transformers' form (a masked [L, L] cumulative
    sum per chunk, B and C repeated per head, float32 operands), 11.6 ms this way.
    """
    batch, seq, heads, head_dim = x.shape
    groups, state = b.shape[2], b.shape[3]
    per = heads // groups  # heads per group of B and C
    dtype, f32 = x.dtype, jnp.float32
    pad = -seq % chunk  # zero steps at the end: dt = 0 leaves the state as it is
    if pad:
        x, dt, b, c = (
            jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2)) for t in (x, dt, b, c)
        )
    n = (seq + pad) // chunk
    dt = dt.astype(f32)
    xdt = x.astype(f32) * dt[..., None]  # discretized input
    # [B, n, L, G, ...]: n chunks of L = chunk positions, the heads split into their groups
    xdt = xdt.reshape(batch, n, chunk, groups, per, head_dim)
    b, c = (t.reshape(batch, n, chunk, groups, state).astype(dtype) for t in (b, c))
    log_decay = (a.astype(f32) * dt).reshape(batch, n, chunk, groups, per)
    cum = jnp.cumsum(log_decay.transpose(0, 3, 4, 1, 2), axis=-1)  # [B, G, h, n, L]
    dot = functools.partial(jnp.einsum, preferred_element_type=f32)

    # 1. within each chunk: y[l] = sum_{s <= l} (c[l] . b[s]) exp(cum[l] - cum[s]) x[s]
    causal = jnp.tril(jnp.ones((chunk, chunk), bool))
    decay = jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    scores = dot("bclgn,bcsgn->bgcls", c, b)[:, :, None] * decay  # [B, G, h, n, L, L]
    y_diag = dot("bghcls,bcsghp->bclghp", scores.astype(dtype), xdt.astype(dtype))

    # 2. each chunk's own contribution to the state at its end
    to_end = jnp.exp(cum[..., -1:] - cum).transpose(0, 3, 4, 1, 2)  # [B, n, L, G, h]
    chunk_states = dot("bclgn,bclghp->bcghpn", b, (xdt * to_end[..., None]).astype(dtype))

    # 3. across chunks: the state entering each chunk
    def step(carry, inputs):
        chunk_decay, new = inputs  # [B, G, h], [B, G, h, P, N]
        return carry * chunk_decay[..., None, None] + new, carry

    chunk_decay = jnp.exp(cum[..., -1]).transpose(3, 0, 1, 2)  # [n, B, G, h]
    start = jnp.zeros_like(chunk_states[:, 0])
    _, entering = jax.lax.scan(step, start, (chunk_decay, jnp.moveaxis(chunk_states, 1, 0)))

    # 4. the entering state read out at each position, decayed to it
    from_start = jnp.exp(cum).transpose(0, 3, 4, 1, 2)  # [B, n, L, G, h]
    y_off = dot("bclgn,cbghpn->bclghp", c, entering.astype(dtype)) * from_start[..., None]
    y = (y_diag + y_off).reshape(batch, n * chunk, heads, head_dim)
    return y[:, :seq]
