"""Splash attention, the TPU Pallas flash-attention kernel, and how it is sharded under a mesh.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel,
    splash_attention_mask,
)
from jax.sharding import PartitionSpec as P

from axdsl.kernels.context import context_layout
from axdsl.kernels.mesh import dividing_axes

PALLAS_INTERPRET = False  # True runs Pallas kernels in interpret mode (CPU tests, debugging)
SPLASH_BATCH_AXES = ("stage", "data", "fsdp")  # mesh axes splash attention splits the batch over
SPLASH_HEAD_AXES = ("model",)  # mesh axes it splits the heads over
SPLASH_FUSED_DQ_BYTES = 4 << 30  # the most the fused backward's per-key-tile dq copies may take


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    causal: bool,
    window: int | None,
    scale: float | None = None,
    softcap: float | None = None,
    segment_ids: jax.Array | None = None,
    staged: bool = False,
) -> jax.Array:
    """Splash attention, the TPU Pallas flash-attention kernel, on q [B, S, heads, head_dim].

    k is [B, S, kv_heads, head_dim] and v [B, S, kv_heads, v_head_dim] (kv_heads divides heads:
    query head h reads kv head h // (heads // kv_heads)). The logits are q.k * scale (None:
    1 / sqrt(head_dim)), soft-capped to softcap * tanh(logits / softcap) when softcap is set;
    segment_ids [B, S] keep each query to the keys of its own packed sequence. Same result as
    jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=(window - 1, 0) if
    window else None). Under a mesh it runs in jax.shard_map (Pallas TPU kernels compile only
    there): the batch split over SPLASH_BATCH_AXES, the heads over SPLASH_HEAD_AXES, each as far
    as they divide evenly. `staged`: the call runs inside pipeline()'s vmap over the `stage`
    axis, which holds that axis, so the batch splits over the others.
    """
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if seq % 128:
        raise ValueError(f"splash attention needs a sequence length divisible by 128, got {seq}")
    q = q * (1.0 / math.sqrt(head_dim) if scale is None else scale)  # the kernel does not scale
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # the kernel's [B, heads, S, head_dim]
    run = functools.partial(_splash_per_device, causal=causal, window=window, softcap=softcap)
    args: tuple[jax.Array, ...] = (q, k, v) if segment_ids is None else (q, k, v, segment_ids)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = run(*args)
    else:
        axes = tuple(a for a in SPLASH_BATCH_AXES if not (staged and a == "stage"))
        batch_axes = dividing_axes(mesh, axes, batch)
        head_axes = dividing_axes(mesh, SPLASH_HEAD_AXES, heads)
        if kv_heads % math.prod(mesh.shape[a] for a in head_axes):
            # Fewer kv heads than head shards: give every query head its own copy.
            k, v = (jnp.repeat(x, heads // kv_heads, axis=1) for x in (k, v))
            args = (q, k, v) + args[3:]
        spec = P(batch_axes, head_axes, None, None)
        specs = (spec, spec, spec) + ((P(batch_axes, None),) if segment_ids is not None else ())
        out = jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)(*args)
    return jnp.swapaxes(out, 1, 2)  # [B, S, heads, v_head_dim]


def _splash_per_device(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    causal: bool,
    window: int | None,
    softcap: float | None,
) -> jax.Array:
    """The kernel on one device's q [B, heads, S, head_dim], k and v [B, kv_heads, S, head_dim]."""
    heads, seq = q.shape[1], q.shape[2]
    mask: splash_attention_mask.Mask
    if window:
        mask = splash_attention_mask.LocalMask((seq, seq), window_size=(window - 1, 0), offset=0)
    elif causal:
        mask = splash_attention_mask.CausalMask((seq, seq))
    else:
        mask = splash_attention_mask.FullMask((seq, seq))
    kernel = splash_attention_kernel.make_splash_mha(
        splash_attention_mask.MultiHeadMask([mask] * heads),
        block_sizes=splash_block_sizes(seq, q.shape[3], q.size * q.dtype.itemsize),
        head_shards=1,
        q_seq_shards=1,
        attn_logits_soft_cap=softcap or None,
        interpret=PALLAS_INTERPRET,
    )
    if segment_ids is None:  # the kernel takes one sequence: map it over the batch
        return jax.vmap(kernel)(q, k, v)
    ids = splash_attention_kernel.SegmentIds(q=segment_ids, kv=segment_ids)
    return jax.vmap(kernel)(q, k, v, ids)


def splash_context_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    positions: np.ndarray | None = None,
    segment_ids: jax.Array | None = None,
    mesh_axis: str = "seq",
    staged: bool = False,
) -> jax.Array:
    """Splash attention with the sequence split over `mesh_axis` (context parallelism's
    all_gather strategy): each shard gathers the keys and values once and runs the kernel on its
    own queries, inside jax.shard_map (context_layout splits the batch and heads).

    Splash's masks are static, so the kernel is built once over the whole sequence, as MaxText
    does: its rows are the queries in the order they run, each row's mask computed from its
    original position (`positions` [S], a numpy array: context_order's zig-zag order, or None for
    0, 1, ...), its columns the keys back in their original order. The kernel's mask metadata is
    cut into one piece of rows per shard (q_seq_shards, manual_sharding_spec), so each shard's
    kernel skips exactly the blocks its own queries never see. Shapes and the other arguments as
    splash_attention's; the sequence each shard holds must be a multiple of 128.
    """
    batch, seq, heads, head_dim = q.shape
    positions = np.arange(seq) if positions is None else np.asarray(positions)
    mesh, spec, segment_spec = context_layout(q, k, mesh_axis, staged)
    shards, head_axes = mesh.shape[mesh_axis], _spec_axes(spec[2])
    if seq % (128 * shards):
        raise ValueError(
            f"splash attention over {shards} shards needs a sequence length divisible by "
            f"{128 * shards}, got {seq}"
        )
    mask = _splash_context_mask(seq, causal, window, positions)
    split = math.prod(mesh.shape[a] for part in spec for a in _spec_axes(part))
    q_bytes = q.size * q.dtype.itemsize // split  # one device's q
    kernel = splash_attention_kernel.make_splash_mha(
        splash_attention_mask.MultiHeadMask([mask] * heads),
        block_sizes=splash_block_sizes(seq // shards, head_dim, q_bytes),
        head_shards=math.prod(mesh.shape[a] for a in head_axes),
        q_seq_shards=shards,
        attn_logits_soft_cap=softcap or None,
        interpret=PALLAS_INTERPRET,
    )
    rows = jax.sharding.NamedSharding(mesh, P(spec[2], mesh_axis))  # [heads, query blocks]
    restore = np.argsort(positions)  # the gathered keys, back in their original order

    def local(kernel, q, k, v, segment_ids=None):
        gather = functools.partial(jax.lax.all_gather, axis_name=mesh_axis, axis=1, tiled=True)
        k, v = gather(k)[:, restore], gather(v)[:, restore]
        q = q * (1.0 / math.sqrt(head_dim) if scale is None else scale)  # the kernel does not scale
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # the kernel's [B, heads, S, d]
        if segment_ids is None:
            return jnp.swapaxes(jax.vmap(kernel)(q, k, v), 1, 2)
        ids = splash_attention_kernel.SegmentIds(q=segment_ids, kv=gather(segment_ids)[:, restore])
        return jnp.swapaxes(jax.vmap(kernel)(q, k, v, ids), 1, 2)

    args: tuple = (kernel, q, k, v) + (() if segment_ids is None else (segment_ids,))
    specs: tuple = (kernel.manual_sharding_spec(rows), spec, spec, spec)
    specs += () if segment_ids is None else (segment_spec,)
    run = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
    return run(*args)


def _spec_axes(part: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (P keeps a 1-tuple as the bare name)."""
    return () if part is None else (part,) if isinstance(part, str) else tuple(part)


def _splash_context_mask(
    seq: int, causal: bool, window: int | None, positions: np.ndarray
) -> splash_attention_mask.Mask:
    """The [S, S] mask of queries in run order over keys in original order: a query's row is
    the causal (or sliding-window) mask's row at its original position. Splash's computable
    masks read a row's position from their `q_sequence`, in the kernel too, so it is set to the
    queries' original positions."""
    if not causal and not window:
        return splash_attention_mask.FullMask((seq, seq))
    mask: splash_attention_mask.LocalMask | splash_attention_mask.CausalMask
    if window:
        mask = splash_attention_mask.LocalMask((seq, seq), window_size=(window - 1, 0), offset=0)
    else:
        mask = splash_attention_mask.CausalMask((seq, seq))
    mask.q_sequence = np.asarray(positions, np.int32)
    return mask


def splash_block_sizes(
    seq: int, head_dim: int, q_bytes: int = 0
) -> splash_attention_kernel.BlockSizes:
    """Splash's tiles for one sequence length: the fastest measured on one TPU v5e that fit VMEM.

    Forward and backward of one causal layer (axdsl's benchmarks/tpu_kernels.py splash):
    Llama 3.2 1B's 4 x 32 heads of 64 x 2048 took 8.60 ms with tiles of 512 and the two
    backward kernels, 6.64 ms with tiles of 1024 and the fused backward kernel (dq, dk and dv in
    one pass over the blocks); 16 heads of 128 x 32,768 took 162.3 ms, 104.8 ms with query tiles
    of 2048, key tiles of 1024 computed 512 at a time. Tiles of 2048 x 2048 ran out of VMEM.
    Wide heads (head_dim over 128) and other lengths, not measured, take one tile of 512 (or the
    largest of 256 and 128 that divides) and the two backward kernels.

    The fused backward writes dq once per key tile before summing them: seq / 1024 copies of q
    (`q_bytes`, one device's q), 4 GiB at 32,768 tokens of 16 heads of 128. Past
    SPLASH_FUSED_DQ_BYTES it keeps the two backward kernels (124.8 ms at 32k, tiles of 1024).
    """
    if seq % 1024 or head_dim > 128:  # shapes not measured: one tile, the two backward kernels
        block = next(b for b in (512, 256, 128) if seq % b == 0)
        block_q, block_kv, compute, fused = block, block, block, False
    elif seq // 1024 * q_bytes > SPLASH_FUSED_DQ_BYTES:
        block_q, block_kv, compute, fused = 1024, 1024, 512, False
    elif seq % 2048 == 0 and seq >= 8192:
        block_q, block_kv, compute, fused = 2048, 1024, 512, True
    else:
        block_q, block_kv, compute, fused = 1024, 1024, 1024, True
    return splash_attention_kernel.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=compute,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=compute,
        block_q_dq=None if fused else block_q,  # the fused kernel computes dq with dk and dv
        block_kv_dq=None if fused else block_kv,
        use_fused_bwd_kernel=fused,
    )
