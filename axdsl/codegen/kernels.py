"""Code for the attention kernel that select_kernels chose: one call, no backend branching.

    xla, cudnn   jax.nn.dot_product_attention(q, k, v, is_causal=..., implementation="cudnn")
    splash       splash_attention(q, k, v, causal=..., window=...), a helper copied into the model
                 that runs the TPU Pallas kernel from jax.experimental.pallas.ops.tpu.splash_attention

The splash helper computes exactly what the dot_product_attention call computes (tests compare
them on the CPU with `PALLAS_INTERPRET = True`); the constraints that make it applicable are
checked at build time by axdsl/passes/select_kernels.py.
"""

from __future__ import annotations

SPLASH_ATTENTION = '''PALLAS_INTERPRET = False  # True runs Pallas kernels in interpret mode (CPU tests, debugging)
SPLASH_BATCH_AXES = ("data", "fsdp")  # mesh axes splash attention splits the batch over
SPLASH_HEAD_AXES = ("model",)  # mesh axes it splits the heads over


def splash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, window: int | None
) -> jax.Array:
    """Splash attention, the TPU Pallas flash-attention kernel, on q [B, S, heads, head_dim].

    k and v are [B, S, kv_heads, head_dim] (kv_heads divides heads: query head h reads kv head
    h // (heads // kv_heads)). Same result as jax.nn.dot_product_attention(q, k, v,
    is_causal=causal, local_window_size=(window - 1, 0) if window else None). Under a mesh it
    runs in jax.shard_map (Pallas TPU kernels compile only there): the batch split over
    SPLASH_BATCH_AXES, the heads over SPLASH_HEAD_AXES, each as far as they divide evenly.
    """
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if seq % 128:
        raise ValueError(f"splash attention needs a sequence length divisible by 128, got {seq}")
    q = q * (1.0 / math.sqrt(head_dim))  # the kernel does not scale the logits
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # the kernel's [B, heads, S, head_dim]
    run = functools.partial(_splash_per_device, causal=causal, window=window)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = run(q, k, v)
    else:
        batch_axes = _dividing_axes(mesh, SPLASH_BATCH_AXES, batch)
        head_axes = _dividing_axes(mesh, SPLASH_HEAD_AXES, heads)
        if kv_heads % math.prod(mesh.shape[a] for a in head_axes):
            # Fewer kv heads than head shards: give every query head its own copy.
            k, v = (jnp.repeat(x, heads // kv_heads, axis=1) for x in (k, v))
        spec = P(batch_axes, head_axes, None, None)
        out = jax.shard_map(
            run, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False
        )(q, k, v)
    return jnp.swapaxes(out, 1, 2)  # [B, S, heads, head_dim]


def _dividing_axes(mesh, names: tuple[str, ...], size: int) -> tuple[str, ...]:
    """The mesh axes of `names`, in order, whose product of sizes divides `size`."""
    axes = []
    for name in names:
        if name in mesh.axis_names:
            if size % (math.prod(mesh.shape[a] for a in axes) * mesh.shape[name]) == 0:
                axes.append(name)
    return tuple(axes)


def _splash_per_device(
    q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, window: int | None
) -> jax.Array:
    """The kernel on one device's q [B, heads, S, head_dim], k and v [B, kv_heads, S, head_dim]."""
    heads, seq = q.shape[1], q.shape[2]
    if window:
        mask = splash_attention_mask.LocalMask((seq, seq), window_size=(window - 1, 0), offset=0)
    elif causal:
        mask = splash_attention_mask.CausalMask((seq, seq))
    else:
        mask = splash_attention_mask.FullMask((seq, seq))
    block = next(b for b in (512, 256, 128) if seq % b == 0)  # tiles of the sequence
    kernel = splash_attention_kernel.make_splash_mha(
        splash_attention_mask.MultiHeadMask([mask] * heads),
        block_sizes=splash_attention_kernel.BlockSizes(
            block_q=block,
            block_kv=block,
            block_kv_compute=block,
            block_q_dkv=block,
            block_kv_dkv=block,
            block_kv_dkv_compute=block,
            block_q_dq=block,
            block_kv_dq=block,
        ),
        head_shards=1,
        q_seq_shards=1,
        interpret=PALLAS_INTERPRET,
    )
    return jax.vmap(kernel)(q, k, v)  # the kernel takes one sequence: map it over the batch'''


def emit_attention(kernel: str, q: str, k: str, v: str, mask: str | None, causal: str,
                   window: str | None, note: str) -> tuple[str, str]:
    """(expression, comment) for one attention call; the comment says why others were not used."""
    note = f"attention: {note}" if note else ""
    if kernel == "splash":
        if mask is not None:  # select_kernels never picks splash for an explicit mask
            raise AssertionError("splash attention takes no explicit mask")
        return f"splash_attention({q}, {k}, {v}, causal={causal}, window={window})", note
    kwargs = [f"is_causal={causal}"]
    if mask is not None:
        kwargs.append(f"mask={mask}")
    if window is not None:
        kwargs.append(f"local_window_size=({window} - 1, 0)")
    kwargs.append(f'implementation="{kernel}"')
    return f"jax.nn.dot_product_attention({q}, {k}, {v}, {', '.join(kwargs)})", note

# The import lines the splash helper needs (helpers.py adds them with its source).
IMPORTS: tuple[str, ...] = (
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask",
)
