"""Matmuls in fp8 and int8 with a custom backward: fp8_einsum and int8_einsum (quantize_matmuls).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def _fp8_quantize(x: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """x ~= q * scale: q in the fp8 `dtype`, one f32 scale for the whole tensor from its amax."""
    x = x.astype(jnp.float32)
    fp8_max = float(jnp.finfo(dtype).max)  # 448 for e4m3fn, 57344 for e5m2
    scale = jnp.max(jnp.abs(x)) / fp8_max  # []
    scale = jnp.where(scale > 0, scale, 1.0)  # an all-zero tensor: avoid 0 / 0
    # Clip: x / scale can round just past fp8_max, and e4m3fn has no inf (it would become NaN).
    q = jnp.clip(x / scale, -fp8_max, fp8_max).astype(dtype)
    return q, scale


def fp8_einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """jnp.einsum(spec, x, w) computed in fp8 (_fp8_einsum), its output named for remat: a custom
    VJP hides its matmuls from jax.checkpoint_policies.dots_with_no_batch_dims_saveable, so
    REMAT_POLICY's save_dots also saves the outputs named "quantized_matmul"."""
    return checkpoint_name(_fp8_einsum(spec, x, w), "quantized_matmul")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fp8_einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """jnp.einsum(spec, x, w) computed in fp8, as on H100/B200 tensor cores.

    Forward: both operands in e4m3 (3 mantissa bits, range +-448). Backward: the incoming
    gradient in e5m2 (2 mantissa bits, range +-57344: gradients need range more than precision),
    multiplied with the e4m3 operands saved by the forward pass. Every product accumulates in f32
    and is rescaled; the result has the dtype of the einsum it replaces, the gradients those of
    x and w.

    Scaling is per tensor and *current* (just in time), the choice on Hopper: each tensor's scale
    is this step's amax / format max, computed right before it is cast. Delayed scaling
    (Transformer Engine's default) reuses an amax history from earlier steps, which saves that
    reduction but is state: a history per tensor, carried in the train state and checkpointed.
    Current scaling has none, so the train state stays params and optimizer state, a resume is
    exact with nothing more to save, and a tensor whose range jumps never overflows. Its cost is
    one amax reduction per operand (x and w forward, the gradient backward): one more read of
    each of those tensors a step.
    """
    out, _ = _fp8_einsum_fwd(spec, x, w)
    return out


def _fp8_einsum_fwd(spec: str, x: jax.Array, w: jax.Array):
    xq, x_scale = _fp8_quantize(x, jnp.float8_e4m3fn)
    wq, w_scale = _fp8_quantize(w, jnp.float8_e4m3fn)
    y = jnp.einsum(spec, xq, wq, preferred_element_type=jnp.float32) * (x_scale * w_scale)
    # The empty arrays only carry the input dtypes (residuals must be arrays).
    residuals = (xq, x_scale, wq, w_scale, jnp.zeros(0, x.dtype), jnp.zeros(0, w.dtype))
    return y.astype(jnp.result_type(x, w)), residuals


def _fp8_einsum_bwd(spec: str, residuals, g: jax.Array):
    xq, x_scale, wq, w_scale, x_like, w_like = residuals
    inputs, out = spec.split("->")
    x_spec, w_spec = inputs.split(",")  # for "ab,bc->ac": dx = "ac,bc->ab", dw = "ab,ac->bc"
    gq, g_scale = _fp8_quantize(g, jnp.float8_e5m2)
    dx = jnp.einsum(f"{out},{w_spec}->{x_spec}", gq, wq, preferred_element_type=jnp.float32)
    dw = jnp.einsum(f"{x_spec},{out}->{w_spec}", xq, gq, preferred_element_type=jnp.float32)
    dx = dx * (g_scale * w_scale)
    dw = dw * (x_scale * g_scale)
    return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


_fp8_einsum.defvjp(_fp8_einsum_fwd, _fp8_einsum_bwd)


def _int8_quantize(x: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """x ~= q * scale: q int8 in [-127, 127], one f32 scale per slice over `axes` (kept, size 1)."""
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=axes, keepdims=True) / 127.0
    scale = jnp.where(scale > 0, scale, 1.0)  # an all-zero slice: avoid 0 / 0
    q = jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8)
    return q, scale


def _summed_axes(term: str, out: str) -> tuple[int, ...]:
    """Axes of one einsum operand ("bsd", "...d") whose letter is not in the output."""
    head, _, tail = term.rpartition("...")  # letters after `...` count from the end
    return tuple(i for i, c in enumerate(head) if c not in out) + tuple(
        i - len(tail) for i, c in enumerate(tail) if c not in out
    )


def int8_einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """jnp.einsum(spec, x, w) computed in int8 (_int8_einsum), its output named for remat: a custom
    VJP hides its matmuls from jax.checkpoint_policies.dots_with_no_batch_dims_saveable, so
    REMAT_POLICY's save_dots also saves the outputs named "quantized_matmul"."""
    return checkpoint_name(_int8_einsum(spec, x, w), "quantized_matmul")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _int8_einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """jnp.einsum(spec, x, w) computed as int8 x int8 -> int32, as on TPU v5e/v5p MXUs.

    Symmetric quantization with one scale per slice of the contracted dims: per output channel
    for the parameter (w: [dim, heads, head_dim] gets scales [1, heads, head_dim]) and per row
    for the activation (x: [B, S, dim] gets [B, S, 1]). The integer product is exact; it is
    dequantized with the outer product of the two scales, which is the same einsum applied to
    the scales (their contracted dims have size 1, so it sums one term). The result has the
    dtype of the einsum it replaces.

    Backward: straight-through estimator. Rounding has zero gradient almost everywhere, so the
    gradients are those of the unquantized einsum, from the saved unquantized operands.
    """
    inputs, out = spec.split("->")
    x_spec, w_spec = inputs.split(",")
    xq, x_scale = _int8_quantize(x, _summed_axes(x_spec, out))  # e.g. x_scale: [B, S, 1]
    wq, w_scale = _int8_quantize(w, _summed_axes(w_spec, out))  # e.g. w_scale: [1, heads, head_dim]
    acc = jnp.einsum(spec, xq, wq, preferred_element_type=jnp.int32)  # exact integer sums
    scale = jnp.einsum(spec, x_scale, w_scale)  # laid out like the output
    return (acc.astype(jnp.float32) * scale).astype(jnp.result_type(x, w))


def _int8_einsum_fwd(spec: str, x: jax.Array, w: jax.Array):
    return _int8_einsum(spec, x, w), (x, w)


def _int8_einsum_bwd(spec: str, residuals, g: jax.Array):
    x, w = residuals
    _, einsum_vjp = jax.vjp(functools.partial(jnp.einsum, spec), x, w)
    return einsum_vjp(g)  # (dx, dw) of the unquantized einsum


_int8_einsum.defvjp(_int8_einsum_fwd, _int8_einsum_bwd)
