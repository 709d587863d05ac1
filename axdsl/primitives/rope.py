"""Rotary position embedding on [B, S, heads, head_dim] (Llama's half-split layout)."""

from __future__ import annotations

from axdsl.primitives.base import Helper, Primitive, Signature, Static, StaticKind, linear_memory
from axdsl.primitives.reductions import ir_fmt

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


def _rope_shape(ctx, prim, args):
    dims = args[0].type.dims
    if len(dims) != 4 or any(d.is_ellipsis for d in dims):
        ctx.fail(prim.span, f"`rope` needs [B, S, heads, head_dim], got {ir_fmt(dims)}")
    if dims[-1].size is None or dims[-1].size % 2:
        ctx.fail(prim.span, f"`rope` needs an even head_dim, got `{dims[-1]}`")
    return dims


def _emit(ctx, prim, args: list[str], precs: list[int]) -> str:
    ctx.use_helper("apply_rope")
    return f"apply_rope({args[0]}, theta={prim.attr('theta').code})"


PRIMITIVES = (
    Primitive("rope", Signature(("x",), (Static("theta", StaticKind.FLOAT, 10000.0),),
                                doc="rotary embedding on [B, S, H, D]"),
              emit=_emit, shape=_rope_shape, helpers=(Helper("apply_rope", APPLY_ROPE),),
              memory=linear_memory),
)
