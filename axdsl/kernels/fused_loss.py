"""The next-token loss without the full logits: fused_cross_entropy (split_head's cut).

The head runs a chunk of positions at a time, and under jax.grad the forward pass also takes each
chunk's gradient, so the float32 logits [B, S, vocab] never exist at once (axdsl/ir/head.py).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a `Source` names); the copies import only what the helper's `imports` list, so a
definition here uses nothing else."""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4, 5))
def fused_cross_entropy(
    head,
    params: dict,
    x: jax.Array,
    labels: jax.Array,
    z_loss: float,
    chunk: int,
    weights: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(mean cross-entropy + z_loss * mean(logsumexp ** 2), mean cross-entropy) of the logits
    head(params, x) [B, S, vocab] against integer labels [B, S], `chunk` positions at a time.
    `weights` [B, S] (1: taken, 0: not; chat data's assistant turns): the means are over the
    positions it marks (a loss of 0 when it marks none); None: over every position.

    At most one chunk's float32 logits [B, chunk, vocab] exist at once. Under jax.grad the
    forward pass also takes each chunk's gradient (softmax - one-hot, through the head), so the
    backward pass only scales what the forward kept: the gradients of x and of params."""
    return _chunked_cross_entropy(head, params, x, labels, z_loss, chunk, weights, False)[0]


def _chunked_cross_entropy(head, params, x, labels, z_loss, chunk, weights, grads):
    """((loss, ce), gradients of loss and of ce w.r.t. (params, x), or None without grads)."""
    b, s = labels.shape
    c = min(chunk, s)
    n = -(-s // c)  # chunks; the last one's padding weighs nothing
    pad = [(0, 0), (0, n * c - s)]
    xs = jnp.pad(x, pad + [(0, 0)] * (x.ndim - 2)).reshape(b, n, c, *x.shape[2:]).swapaxes(0, 1)
    ys = jnp.pad(labels, pad).reshape(b, n, c).swapaxes(0, 1)  # [n, B, c]
    if weights is None:
        weight = (jnp.arange(n * c) < s).reshape(n, 1, c) / (b * s)  # mean over the positions
    else:  # mean over the marked positions
        weights = weights.astype(jnp.float32) / jnp.maximum(jnp.sum(weights), 1.0)
        weight = jnp.pad(weights, pad).reshape(b, n, c).swapaxes(0, 1)  # [n, B, c]

    def step(acc, chunk_in):
        x_c, y_c, w_c = chunk_in
        logits, head_vjp = jax.vjp(head, params, x_c)  # [B, c, vocab]
        lse = jax.nn.logsumexp(logits, axis=-1)  # [B, c]
        ce = lse - jnp.take_along_axis(logits, y_c[..., None], axis=-1)[..., 0]  # [B, c]
        if not grads:
            return acc, (ce, lse, None)
        probs = jnp.exp(logits - lse[..., None])  # softmax, from the one logsumexp
        is_label = jnp.arange(logits.shape[-1]) == y_c[..., None]  # one-hot, never materialized
        d_ce = (probs - is_label) * w_c[..., None]
        gp, gx = head_vjp(d_ce)
        if z_loss:  # the gradient of z_loss * mean(lse ** 2), kept apart: the ce output has none
            gp_z, gx_z = head_vjp(probs * (2.0 * z_loss * lse * w_c)[..., None])
            gp, gx = (gp, gp_z), (gx, gx_z)
        return jax.tree.map(jnp.add, acc, gp), (ce, lse, gx)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.result_type(p)), params)
    acc = ((zeros, zeros) if z_loss else zeros) if grads else None
    acc, (ce, lse, gx) = jax.lax.scan(step, acc, (xs, ys, weight))
    unchunk = lambda a: a.swapaxes(0, 1).reshape(b, n * c, *a.shape[3:])[:, :s]  # noqa: E731
    mean = jnp.mean if weights is None else lambda a: jnp.sum(a * weights)
    ce_mean = mean(unchunk(ce))
    loss = ce_mean + z_loss * mean(unchunk(lse) ** 2) if z_loss else ce_mean
    return (loss, ce_mean), (acc, jax.tree.map(unchunk, gx)) if grads else None


def _fused_cross_entropy_fwd(head, params, x, labels, z_loss, chunk, weights=None):
    return _chunked_cross_entropy(head, params, x, labels, z_loss, chunk, weights, True)


def _fused_cross_entropy_bwd(head, z_loss, chunk, res, cotangents):
    (gp, gx), (g_loss, g_ce) = res, cotangents
    if not z_loss:  # loss == ce
        scale = lambda a: ((g_loss + g_ce) * a).astype(a.dtype)  # noqa: E731
        return jax.tree.map(scale, gp), scale(gx), None, None
    # d loss = d ce + d z-loss, and d ce alone for the ce output
    both = lambda a, z: ((g_loss + g_ce) * a + g_loss * z).astype(a.dtype)  # noqa: E731
    return jax.tree.map(both, *gp), both(*gx), None, None


fused_cross_entropy.defvjp(_fused_cross_entropy_fwd, _fused_cross_entropy_bwd)
