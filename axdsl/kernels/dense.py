"""`dense`: a contraction of x's last dims with a weight's first dims, with a backward of its own.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import functools
import math

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
    """x's last `contract` dims times the weight w's first ones (jnp.tensordot): `x @ w`, or
    [B, S, heads, head_dim] x [heads, head_dim, dim] -> [B, S, dim] with contract=2.

    The same forward as the einsum; the backward computes w's gradient as one matmul of x
    flattened to [tokens, in], transposed, with the output's gradient [tokens, out]. Left to
    autodiff, XLA:CPU transposes the larger output gradient element by element instead."""
    return jnp.tensordot(x, w, contract)


def _dense_fwd(x, w, contract):
    return jnp.tensordot(x, w, contract), (x, w)


def _dense_bwd(contract, res, dy):
    x, w = res
    tokens = math.prod(x.shape[: x.ndim - contract])
    d_w = x.reshape(tokens, -1).T @ dy.reshape(tokens, -1)
    out_dims = tuple(range(dy.ndim - (w.ndim - contract), dy.ndim))
    d_x = jnp.tensordot(dy, w, (out_dims, tuple(range(contract, w.ndim))))
    return d_x.astype(x.dtype), d_w.reshape(w.shape).astype(w.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)
