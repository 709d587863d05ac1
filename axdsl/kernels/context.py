"""Context parallelism: attention whose sequence is split over a mesh axis (`seq`), run inside
jax.shard_map, and the zig-zag order that balances its causal work.

- zigzag_order / zigzag_inverse / shard_positions: the load-balanced causal layout of MaxText and
  torchtitan. The sequence is cut into 2 * shards chunks and shard i holds chunks i and
  2 * shards - 1 - i, so every shard has the same number of (query, key) pairs to compute.
- local_positions: inside shard_map, the original positions of this shard's tokens.
- context_order, context_parallel: what a generated model calls. context_order is the order its
  layers run a sequence in (zig-zag over the mesh's `seq` shards when balanced);
  context_parallel runs one of the two attentions above on each shard's slice inside
  jax.shard_map.
- context_attention_all_gather: keys and values are gathered once; this shard's queries attend to
  all of them (MaxText's default). The masks come from the tokens' original positions, so it is
  right in either order.
- context_attention_ring: key/value blocks travel around the ring by ppermute and an online
  softmax (float32 running max and sum) accumulates them, RING_KEY_BLOCK keys at a time, so
  memory per chip stays flat in the sequence length. Its backward (a custom VJP) runs the ring
  again, the key/value gradients travelling with their blocks; (query half, key block) pairs the
  mask drops whole are skipped.

Shapes: q [B, S_local, heads, head_dim], k [B, S_local, kv_heads, head_dim], v [B, S_local,
kv_heads, v_head_dim] (kv_heads divides heads: query head h reads kv head h // (heads //
kv_heads)); segment_ids [B, S_local]; positions [S_local] or [B, S_local]. Copied into generated
models by codegen like the other kernel modules; this module imports only jax, numpy and the
standard library.
"""

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from axdsl.kernels.mesh import dividing_axes

CONTEXT_BATCH_AXES = ("stage", "data", "fsdp")  # mesh axes context_parallel splits the batch over
CONTEXT_HEAD_AXES = ("model",)  # mesh axes it splits the heads over
CONTEXT_MASKED = -0.7 * float(np.finfo(np.float32).max)  # a masked logit: finite, no inf - inf
RING_KEY_BLOCK = 512  # keys the ring's online softmax folds in at a time (_ring_key_block)


def zigzag_order(seq: int, shards: int) -> np.ndarray:
    """The balanced order of `seq` positions over `shards` shards: order[j] is the original
    position placed at slot j (x_balanced = x[:, order]). The sequence is cut into 2 * shards
    equal chunks; shard i's slots hold chunk i then chunk 2 * shards - 1 - i, an early and a late
    chunk, so each shard has the same causal work (sum of its queries' visible keys)."""
    chunks = 2 * shards
    if seq % chunks:
        raise ValueError(f"a zig-zag order over {shards} shards needs a multiple of {chunks}")
    size = seq // chunks
    picked = [c for i in range(shards) for c in (i, chunks - 1 - i)]
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in picked])


def zigzag_inverse(seq: int, shards: int) -> np.ndarray:
    """The inverse of zigzag_order: x == x_balanced[:, zigzag_inverse(seq, shards)]."""
    return np.argsort(zigzag_order(seq, shards))


def shard_positions(seq: int, shards: int, balance: bool) -> np.ndarray:
    """[shards, seq // shards]: the original positions of each shard's tokens, in zig-zag order
    (balance) or contiguous. What causal masks, RoPE and segment ids see after a reordering."""
    if seq % shards:
        raise ValueError(f"a sequence of {seq} does not split over {shards} shards")
    order = zigzag_order(seq, shards) if balance else np.arange(seq)
    return order.reshape(shards, seq // shards)


def context_order(seq: int, mesh_axis: str = "seq") -> np.ndarray:
    """The order a balanced context-parallel model runs `seq` positions in: zig-zag over the
    `mesh_axis` shards of the mesh set by jax.set_mesh (0, 1, ... without one). A numpy constant
    when the step is traced, so the reorder, RoPE's tables and the masks cost nothing to build."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh_axis not in mesh.axis_names:
        return np.arange(seq)
    return zigzag_order(seq, mesh.shape[mesh_axis])


def context_parallel(
    attend: Callable[..., jax.Array],
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    positions: np.ndarray | None = None,
    segment_ids: jax.Array | None = None,
    mesh_axis: str = "seq",
    staged: bool = False,
) -> jax.Array:
    """attend(q, k, v, positions=, segment_ids=, mesh_axis=) on each shard's slice of the
    sequence, inside jax.shard_map over the mesh set by jax.set_mesh (context_layout says how
    q, k, v are split). `attend` is context_attention_all_gather or context_attention_ring
    with its settings bound. `staged`: the call runs inside pipeline()'s vmap over the `stage`
    axis, which holds that axis, so the batch splits over the others.
    `positions` [S]: the tokens' original positions in the order they run (None: 0, 1, ...).
    With no mesh set (tests, sampling on one device) it runs on a one-device mesh, so the same
    code computes the same values. Returns [B, S, heads, v_head_dim]."""
    mesh, spec, segment_spec = context_layout(q, k, mesh_axis, staged)
    args, specs = _context_args(q, k, v, positions, segment_ids, spec, segment_spec, mesh_axis)

    def local(q, k, v, positions, segment_ids=None):
        return attend(q, k, v, positions=positions, segment_ids=segment_ids, mesh_axis=mesh_axis)

    run = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
    return run(*args)


def context_layout(
    q: jax.Array, k: jax.Array, mesh_axis: str = "seq", staged: bool = False
) -> tuple:
    """(mesh, spec of q, k and v, spec of segment ids) for attention with the sequence split
    over `mesh_axis` of the mesh set by jax.set_mesh (a one-device mesh without one): the batch
    over CONTEXT_BATCH_AXES (less `stage` when `staged`: the pipeline's vmap holds it) and the
    heads over CONTEXT_HEAD_AXES as far as they divide evenly (heads only where the kv heads
    divide too, so every shard's query heads find their kv heads locally)."""
    mesh: Mesh | jax.sharding.AbstractMesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh_axis not in mesh.axis_names:
        mesh = Mesh(np.asarray(jax.devices()[:1]), (mesh_axis,))
    candidates = tuple(a for a in CONTEXT_BATCH_AXES if not (staged and a == "stage"))
    batch_axes = dividing_axes(mesh, candidates, q.shape[0])
    head_axes = dividing_axes(mesh, CONTEXT_HEAD_AXES, math.gcd(q.shape[2], k.shape[2]))
    spec = P(batch_axes or None, mesh_axis, head_axes or None)
    return mesh, spec, P(batch_axes or None, mesh_axis)


def _context_args(q, k, v, positions, segment_ids, spec, segment_spec, mesh_axis):
    """The shard_map operands q, k, v, positions (and segment ids) and their specs."""
    positions = np.arange(q.shape[1]) if positions is None else positions
    args: tuple = (q, k, v, jnp.asarray(positions, jnp.int32))
    specs: tuple = (spec, spec, spec, P(mesh_axis))
    if segment_ids is not None:
        args, specs = args + (segment_ids,), specs + (segment_spec,)
    return args, specs


def local_positions(local_seq: int, mesh_axis: str = "seq", balance: bool = False) -> jax.Array:
    """[local_seq]: inside shard_map over `mesh_axis`, the original positions of this shard's
    tokens (zig-zag when balance), computed from the shard's index."""
    shard, shards = jax.lax.axis_index(mesh_axis), jax.lax.axis_size(mesh_axis)
    local = jnp.arange(local_seq)
    if not balance:
        return shard * local_seq + local
    half = local_seq // 2  # chunk `shard` then chunk 2 * shards - 1 - shard
    late = (2 * shards - 1 - shard) * half + local - half
    return jnp.where(local < half, shard * half + local, late)


def _context_keep(
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None,
    k_seg: jax.Array | None,
    causal: bool,
    window: int | None,
) -> jax.Array:
    """[B | 1, Sq, Sk] True where a query may attend a key, from the original positions
    ([B | 1, S]): causal, the sliding window (the last `window` keys, the query's own included)
    and segment ids (the same packed document)."""
    q_pos, k_pos = q_pos[:, :, None], k_pos[:, None, :]
    keep = jnp.ones(jnp.broadcast_shapes(q_pos.shape, k_pos.shape), dtype=bool)
    if causal:
        keep = keep & (k_pos <= q_pos)
    if window:
        keep = keep & (k_pos > q_pos - window)
    if q_seg is not None and k_seg is not None:
        keep = keep & (q_seg[:, :, None] == k_seg[:, None, :])
    return keep


def context_attention_all_gather(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh_axis: str = "seq",
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    attend: Callable[..., jax.Array] = jax.nn.dot_product_attention,
) -> jax.Array:
    """Attention of this shard's queries over the whole sequence, inside shard_map over
    `mesh_axis`: k, v (and segment ids, positions) are all-gathered once, then
    attend(q, k, v, mask=..., scale=scale) runs locally with the mask [B | 1, 1, S_local, S]
    built from the tokens' original positions (`positions`; None: contiguous shards), so a
    zig-zag order gives the same result. `attend` is any attention taking a boolean mask (True:
    attend) and a scale: jax.nn.dot_product_attention, or einsum_attention with causal=False.
    Per device: the gathered k and v and this shard's [S_local, S] logits.
    Returns [B, S_local, heads, v_head_dim]."""
    if positions is None:
        positions = local_positions(q.shape[1], mesh_axis)
    positions, q = jax.lax.optimization_barrier((positions, q))  # see _tied: masks stay per layer
    q_pos = positions if positions.ndim == 2 else positions[None]
    gather = functools.partial(jax.lax.all_gather, axis_name=mesh_axis, axis=1, tiled=True)
    k_all, v_all, k_pos = gather(k), gather(v), gather(q_pos)
    k_seg = None if segment_ids is None else gather(segment_ids)
    keep = _context_keep(q_pos, k_pos, segment_ids, k_seg, causal, window)
    return attend(q, k_all, v_all, mask=keep[:, None], scale=scale)


def context_attention_ring(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mesh_axis: str = "seq",
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> jax.Array:
    """Ring attention, inside shard_map over `mesh_axis`: this shard's queries meet every key/value
    block as the blocks travel around the ring (jax.lax.ppermute, one hop a step), and an online
    softmax accumulates them in float32. Within a step each half of the queries folds the block
    in RING_KEY_BLOCK keys at a time (a lax.scan), so a device holds two key/value blocks (the
    one in use, the one arriving) and logits of [B, heads, S_local / 2, RING_KEY_BLOCK]: memory
    per chip grows linearly with the sequence per shard, not with its square
    (benchmarks/ring_memory.py, 4 CPU shards, 4 heads of 64 in bf16, forward and backward: 33 MiB
    of temporaries at 4k tokens and 127 MiB at 16k; 28 and 362 MiB with whole-tile logits).
    Masks come from the original positions (`positions`; None: contiguous shards), so a zig-zag
    order gives the same result, and a key block the mask drops whole (causal future, outside the
    window, other documents) is skipped: in zig-zag order every shard computes the same number.
    The backward runs the ring again (a custom VJP), block by block the same way: each block's
    key/value gradients travel with it and are home after a full turn.
    Returns [B, S_local, heads, v_head_dim]; each query must see at least one key (its own)."""
    if positions is None:
        positions = local_positions(q.shape[1], mesh_axis)
    positions = positions if positions.ndim == 2 else positions[None]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _ring_attention(q, k, v, segment_ids, positions, mesh_axis, causal, window, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _ring_attention(q, k, v, segment_ids, positions, mesh_axis, causal, window, scale):
    """context_attention_ring with scale resolved and positions [B | 1, S_local]."""
    return _ring_attention_fwd(q, k, v, segment_ids, positions, mesh_axis, causal, window, scale)[0]


def _tied(positions: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """positions and q, unchanged, but positions now depends on q for JAX. The masks of every
    ring step are functions of the positions alone: inside a scan over layers, JAX's partial
    evaluation hoisted them out of the layer loop as loop-invariant, one mask and one masked
    fill per (step, tile) broadcast to [B, kv_heads, group, S/2, S/2] and kept for all steps
    (deviceless v5p: 38 GiB of temporaries for 2 layers at 32k tokens over 8 shards, against
    1 GiB for one layer). Tied to q, they are computed where they are used."""
    return jax.lax.optimization_barrier((positions, q))


def _ring_tiles(seq: int) -> list[slice]:
    """The halves of a shard's queries the ring computes one at a time: under the zig-zag order
    a shard's two halves are an early and a late chunk, so every other shard's block is half
    skipped by each (the blocks of keys a half never sees, _ring_key_block)."""
    half = seq // 2
    return [slice(0, half), slice(half, seq)] if seq % 2 == 0 else [slice(0, seq)]


def _ring_key_block(seq: int) -> int:
    """How many keys of a travelling block one fold of the online softmax takes: the largest
    divisor of a half of the shard's sequence (the tiles of _ring_tiles) up to RING_KEY_BLOCK.
    Blocks never straddle the zig-zag order's two chunks, so a block the mask drops whole is
    skipped; the logits in memory are [B, heads, S_local / 2, block] whatever the length."""
    half = seq // 2 if seq % 2 == 0 else seq
    return max(b for b in range(1, min(half, RING_KEY_BLOCK) + 1) if half % b == 0)


def _blocks(x: jax.Array | None, size: int) -> jax.Array | None:
    """[B, S, ...] -> [S / size, B, size, ...]: what lax.scan walks over, a block a step."""
    if x is None:
        return None
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1] // size, size, *x.shape[2:]), 1, 0)


def _unblocks(x: jax.Array) -> jax.Array:
    """The inverse of _blocks: [S / size, B, size, ...] -> [B, S, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _ring_attention_fwd(q, k, v, segment_ids, positions, mesh_axis, causal, window, scale):
    positions, q = _tied(positions, q)
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    shards = jax.lax.axis_size(mesh_axis)
    ring = [(j, (j + 1) % shards) for j in range(shards)]  # each shard sends to the next
    tiles, size = _ring_tiles(seq), _ring_key_block(seq)

    def fold(q_tile, k_tile, v_tile, keep, state):  # one block of keys into the running softmax
        out, top, total = state  # [B, kv_heads, group, S/2, dv], [B, kv_heads, group, S/2] x 2
        logits = jnp.einsum("bqkgd,bskd->bkgqs", q_tile, k_tile, preferred_element_type=jnp.float32)
        logits = jnp.where(keep[:, None, None], logits * scale, CONTEXT_MASKED)
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
        probs = jnp.where(keep[:, None, None], jnp.exp(logits - new_top[..., None]), 0.0)
        fade = jnp.exp(top - new_top)
        seen = jnp.einsum(
            "bkgqs,bskd->bkgqd", probs.astype(v.dtype), v_tile, preferred_element_type=jnp.float32
        )
        return out * fade[..., None] + seen, new_top, total * fade + jnp.sum(probs, axis=-1)

    def visit(states, block):  # fold one travelling block in: each query half, key block by block
        blocks = tuple(_blocks(x, size) for x in block)  # k, v, positions, segment ids
        states = list(states)
        for i, rows in enumerate(tiles):
            q_seg = None if segment_ids is None else segment_ids[:, rows]

            def fold_block(state, key_block, rows=rows, q_seg=q_seg):
                k_blk, v_blk, k_pos, k_seg = key_block
                keep = _context_keep(positions[:, rows], k_pos, q_seg, k_seg, causal, window)
                run = functools.partial(fold, qg[:, rows], k_blk, v_blk, keep)
                return jax.lax.cond(jnp.any(keep), run, lambda s: s, state), None

            states[i], _ = jax.lax.scan(fold_block, states[i], blocks)
        return tuple(states)

    def step(carry, _):
        states, block = carry
        sent = jax.lax.ppermute(block, mesh_axis, ring)  # travels while this block is used
        return (visit(states, block), sent), None

    # *_like(q): typed as varying over the mesh axes q varies over (shard_map's check_vma),
    # like what the steps return
    states = tuple(
        (
            jnp.zeros_like(q, jnp.float32, shape=(*rows, v.shape[-1])),
            jnp.full_like(q, CONTEXT_MASKED, jnp.float32, shape=rows),
            jnp.zeros_like(q, jnp.float32, shape=rows),
        )
        for rows in [(batch, kv_heads, heads // kv_heads, t.stop - t.start) for t in tiles]
    )
    block = (k, v, positions, segment_ids)
    (states, block), _ = jax.lax.scan(step, (states, block), length=shards - 1)
    states = visit(states, block)  # the last block: nothing left to send
    out, top, total = (jnp.concatenate(parts, axis=3) for parts in zip(*states, strict=True))
    out = out / jnp.where(total > 0, total, 1.0)[..., None]
    lse = top + jnp.log(jnp.where(total > 0, total, 1.0))  # log of each row's softmax sum
    y = out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, v.shape[-1]).astype(v.dtype)
    return y, (q, k, v, segment_ids, positions, out, lse)


def _ring_attention_bwd(mesh_axis, causal, window, scale, res, dy):
    q, k, v, segment_ids, positions, out, lse = res
    positions, q = _tied(positions, q)
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    d_out = dy.reshape(batch, seq, kv_heads, heads // kv_heads, -1).transpose(0, 2, 3, 1, 4)
    d_out = d_out.astype(jnp.float32)  # [B, kv_heads, group, S, dv]
    row = jnp.sum(d_out * out, axis=-1)  # the softmax's row term: rowsum(dy * y)
    shards = jax.lax.axis_size(mesh_axis)
    ring = [(j, (j + 1) % shards) for j in range(shards)]
    tiles, size = _ring_tiles(seq), _ring_key_block(seq)

    def grads(rows, k_blk, v_blk, keep, acc):  # one (query half, key block)'s gradients
        d_q, d_k, d_v = acc
        logits = jnp.einsum(
            "bqkgd,bskd->bkgqs", qg[:, rows], k_blk, preferred_element_type=jnp.float32
        )
        probs = jnp.exp(logits * scale - lse[:, :, :, rows, None])
        probs = jnp.where(keep[:, None, None], probs, 0.0)
        d_v = d_v + jnp.einsum("bkgqs,bkgqd->bskd", probs, d_out[:, :, :, rows])
        d_probs = jnp.einsum(
            "bkgqd,bskd->bkgqs", d_out[:, :, :, rows], v_blk, preferred_element_type=jnp.float32
        )
        d_logits = probs * (d_probs - row[:, :, :, rows, None]) * scale
        d_q = d_q + jnp.einsum("bkgqs,bskd->bqkgd", d_logits, k_blk.astype(jnp.float32))
        d_k = d_k + jnp.einsum("bkgqs,bqkgd->bskd", d_logits, qg[:, rows].astype(jnp.float32))
        return d_q, d_k, d_v

    def visit(d_qs, block):  # this shard's share of one travelling block's gradients
        k_blk, v_blk, k_pos, k_seg, d_k, d_v = block
        d_qs = list(d_qs)
        for i, rows in enumerate(tiles):
            q_seg = None if segment_ids is None else segment_ids[:, rows]

            def grads_block(d_q, key_block, rows=rows, q_seg=q_seg):
                k_b, v_b, k_pos, k_seg, d_k, d_v = key_block
                keep = _context_keep(positions[:, rows], k_pos, q_seg, k_seg, causal, window)
                run = functools.partial(grads, rows, k_b, v_b, keep)
                d_q, d_k, d_v = jax.lax.cond(jnp.any(keep), run, lambda a: a, (d_q, d_k, d_v))
                return d_q, (d_k, d_v)

            blocks = tuple(_blocks(x, size) for x in (k_blk, v_blk, k_pos, k_seg, d_k, d_v))
            d_qs[i], (d_k, d_v) = jax.lax.scan(grads_block, d_qs[i], blocks)
            d_k, d_v = _unblocks(d_k), _unblocks(d_v)
        return tuple(d_qs), (k_blk, v_blk, k_pos, k_seg, d_k, d_v)

    def step(carry, _):
        d_qs, block = carry
        d_qs, block = visit(d_qs, block)
        return (d_qs, jax.lax.ppermute(block, mesh_axis, ring)), None  # a full turn: home again

    # float32 accumulators, varying like what they accumulate (shard_map's check_vma)
    d_qs = tuple(jnp.zeros_like(qg[:, t], jnp.float32) for t in tiles)
    block = (
        k,
        v,
        positions,
        segment_ids,
        jnp.zeros_like(k, jnp.float32),
        jnp.zeros_like(v, jnp.float32),
    )
    (d_qs, block), _ = jax.lax.scan(step, (d_qs, block), length=shards)
    d_q = jnp.concatenate(d_qs, axis=1)
    return (
        d_q.reshape(q.shape).astype(q.dtype),
        block[4].astype(k.dtype),
        block[5].astype(v.dtype),
        None,
        None,
    )


_ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)
