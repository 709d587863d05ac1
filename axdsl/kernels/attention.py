"""Attention written out in einsums: einsum_attention (what jax.nn.dot_product_attention cannot
express), vjp_attention (the same with a blockwise backward of its own: the `vjp` kernel) and
cached_attention (the decode path's attention over a KV cache).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import functools

import jax
import jax.numpy as jnp

from axdsl.kernels.vjp_blocks import _vjp_attention_blocks


def einsum_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Attention written out, for what jax.nn.dot_product_attention cannot express.

    q [B, S, heads, head_dim], k [B, S, kv_heads, head_dim], v [B, S, kv_heads, v_head_dim]
    -> [B, S, heads, v_head_dim]; query head h reads kv head h // (heads // kv_heads). The
    logits q.k * scale (scale None: 1 / sqrt(head_dim)) are soft-capped to
    softcap * tanh(logits / softcap) when softcap > 0 (Gemma 2), and `bias` is added; then causal,
    the sliding window (each query sees its last `window` keys, itself included) and `mask`
    (True: attend) drop keys. bias and mask broadcast to [B, heads, S, S]; the softmax runs in
    float32, like jax.nn.dot_product_attention's.
    """
    batch, seq, heads, head_dim = q.shape
    kv_seq, kv_heads = k.shape[1], k.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    group = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", group, k, preferred_element_type=jnp.float32)
    logits = logits.reshape(batch, heads, seq, kv_seq) * scale  # [B, heads, S, S]
    if softcap:
        logits = softcap * jnp.tanh(logits / softcap)
    if bias is not None:
        logits = logits + bias
    query_pos, key_pos = jnp.arange(seq)[:, None], jnp.arange(kv_seq)[None, :]
    keep = jnp.ones((seq, kv_seq), dtype=bool)
    if causal:
        keep = keep & (key_pos <= query_pos)
    if window:
        keep = keep & (key_pos > query_pos - window)
    if mask is not None:
        keep = keep & mask
    logits = jnp.where(keep, logits, -0.7 * jnp.finfo(jnp.float32).max)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    probs = probs.reshape(batch, kv_heads, heads // kv_heads, seq, kv_seq)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
    return out.reshape(batch, seq, heads, v.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def vjp_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Attention as einsums over [B, kv_heads, group, S, head_dim], with its backward written
    out (the `vjp` attention kernel of select_kernels).

    q [B, S, heads, head_dim], k [B, S, kv_heads, head_dim], v [B, S, kv_heads, v_head_dim]
    -> [B, S, heads, v_head_dim]; query head h reads kv head h // (heads // kv_heads). The
    logits q.k * scale (None: 1 / sqrt(head_dim)) drop keys by causal, the sliding `window` and
    `mask` (True: attend; broadcasts to [B, heads, S, S]); the softmax runs in float32. The same
    values as jax.nn.dot_product_attention. The backward keeps the probabilities and takes the
    softmax's row term from the output (rowsum(dy * y)), so XLA:CPU runs no [S, S] reduction
    fused into a matmul and no transposed copies of the [B, heads, S, S] tensors.

    Causal or windowed attention runs a block of queries at a time over only the keys that
    block can see (_vjp_attention_blocks): the blocks above the diagonal, all masked, are never
    computed (at 4 blocks, 10 of 16 remain). A query whose keys `mask` drops entirely averages
    the values of its block's keys rather than of all keys; no other output changes.
    """
    return _vjp_attention_fwd(q, k, v, causal, window, scale, mask)[0]


def _vjp_attention_fwd(q, k, v, causal, window, scale, mask):
    batch, seq, heads, head_dim = q.shape
    kv_seq, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    qg = q.reshape(batch, seq, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, kv_heads, S_kv, d]
    if (
        mask is not None
    ):  # [B | 1, heads | 1, S | 1, S_kv | 1] -> [B | 1, kv_heads | 1, group | 1, S, S_kv]
        grouped = (kv_heads, group) if mask.shape[1] == heads else (1, 1)
        mask = jnp.broadcast_to(mask, (*mask.shape[:2], seq, kv_seq))
        mask = mask.reshape(mask.shape[0], *grouped, seq, kv_seq)
    outs, probs = [], []
    for start, end, first, last in _vjp_attention_blocks(seq, kv_seq, causal, window):
        q_block, k_block = qg[:, :, :, start:end], kt[:, :, first:last]
        logits = jnp.einsum(
            "bkgqd,bksd->bkgqs", q_block, k_block, preferred_element_type=jnp.float32
        )
        query_pos, key_pos = jnp.arange(start, end)[:, None], jnp.arange(first, last)[None, :]
        keep = jnp.ones((end - start, last - first), dtype=bool)
        if causal:
            keep = keep & (key_pos <= query_pos)
        if window:
            keep = keep & (key_pos > query_pos - window)
        if mask is not None:
            keep = keep & mask[:, :, :, start:end, first:last]
        logits = jnp.where(keep, logits * scale, -0.7 * jnp.finfo(jnp.float32).max)
        probs.append(jax.nn.softmax(logits, axis=-1).astype(v.dtype))  # [B, kv_heads, group, q, k]
        outs.append(jnp.einsum("bkgqs,bksd->bkgqd", probs[-1], vt[:, :, first:last]))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
    y = out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, v.shape[-1])
    return y, (qg, kt, vt, probs, out)


def _vjp_attention_bwd(causal, window, scale, res, dy):
    qg, kt, vt, probs, out = res
    batch, kv_heads, group, seq, head_dim = qg.shape
    kv_seq = kt.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    d_out = dy.reshape(batch, seq, kv_heads, group, -1).transpose(0, 2, 3, 1, 4)
    row = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_q, d_k, d_v = [], 0, 0
    blocks = _vjp_attention_blocks(seq, kv_seq, causal, window)
    for (start, end, first, last), p in zip(blocks, probs, strict=True):
        d_block, q_block = d_out[:, :, :, start:end], qg[:, :, :, start:end]
        keys = ((0, 0), (0, 0), (first, kv_seq - last), (0, 0))  # this block's keys among all
        # the key-side gradients come out [.., S_kv, d], so that their sum over the blocks and
        # the transpose to [B, S_kv, kv_heads, d] (fused with what follows) read whole rows of d
        d_v = d_v + jnp.pad(jnp.einsum("bkgqd,bkgqs->bksd", d_block, p), keys)
        d_probs = jnp.einsum(
            "bkgqd,bksd->bkgqs", d_block, vt[:, :, first:last], preferred_element_type=jnp.float32
        )
        d_logits = p.astype(jnp.float32) * (d_probs - row[:, :, :, start:end]) * scale
        d_logits = d_logits.astype(qg.dtype)
        d_q.append(jnp.einsum("bkgqs,bksd->bkgqd", d_logits, kt[:, :, first:last]))
        d_k = d_k + jnp.pad(jnp.einsum("bkgqd,bkgqs->bksd", q_block, d_logits), keys)
    d_q = d_q[0] if len(d_q) == 1 else jnp.concatenate(d_q, axis=3)
    d_q = d_q.transpose(0, 3, 1, 2, 4).reshape(batch, seq, kv_heads * group, head_dim)
    return d_q, d_k.transpose(0, 2, 1, 3), d_v.transpose(0, 2, 1, 3), None


vjp_attention.defvjp(_vjp_attention_fwd, _vjp_attention_bwd)


def cached_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cache_k: jax.Array,
    cache_v: jax.Array,
    pos: jax.Array,
    window: int | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Causal attention of new tokens over a KV cache, for decoding.

    q [B, T, heads, head_dim], k and v [B, T, kv_heads, ...] are T new tokens at positions
    pos .. pos + T - 1. Their keys and values are written into cache_k, cache_v [B, L, kv_heads,
    ...] at pos, then each query attends to the cached keys at or before its own position (and
    within the sliding `window`): what einsum_attention computes over the whole sequence.
    Returns (out [B, T, heads, v_head_dim], cache_k, cache_v).
    """
    cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, k.astype(cache_k.dtype), pos, axis=1)
    cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, v.astype(cache_v.dtype), pos, axis=1)
    query_pos = pos + jnp.arange(q.shape[1])[:, None]  # [T, 1]
    key_pos = jnp.arange(cache_k.shape[1])[None, :]  # [1, L]
    seen = key_pos <= query_pos  # later slots are not written yet
    if window:
        seen = seen & (key_pos > query_pos - window)
    out = einsum_attention(
        q, cache_k, cache_v, causal=False, scale=scale, softcap=softcap, mask=seen
    )
    return out, cache_k, cache_v
