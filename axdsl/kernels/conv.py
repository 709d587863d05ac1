"""Mamba's causal depthwise convolution over the sequence.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import jax


def causal_conv1d(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """Causal depthwise conv over the sequence: x [B, S, C], w [K, C], b [C] -> [B, S, C].

    out[t] = sum_k w[k] * x[t - K + 1 + k] (+ b), zeros before the first position (Mamba's conv1d).
    """
    taps, channels = w.shape
    out = jax.lax.conv_general_dilated(
        x,
        w[:, None, :].astype(x.dtype),  # [K, 1, C]: one input channel per group
        window_strides=(1,),
        padding=[(taps - 1, 0)],  # left only: no position sees the future
        dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=channels,
    )
    return out if b is None else out + b.astype(x.dtype)
