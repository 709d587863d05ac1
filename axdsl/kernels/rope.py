"""Rotary position embeddings: the plain one, partial and interleaved rotations, and the
frequencies of Llama 3.1's and YaRN's scalings.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import math

import jax
import jax.numpy as jnp
import numpy as np


def apply_rope(
    x: jax.Array,
    theta: float,
    offset: int | jax.Array = 0,
    positions: np.ndarray | jax.Array | None = None,
) -> jax.Array:
    """Rotary position embedding on x [B, S, heads, head_dim] (Llama's half-split layout), its
    tokens at positions offset, offset + 1, ... (a decode step's offset is its cache position),
    or at `positions`: [S] (context parallelism's zig-zag order) or [B, S] (a packed row's)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (np.arange(half, dtype=np.float32) / half))  # [head_dim / 2]
    cos, sin = rotation_tables(freqs, x.shape[1], offset, positions=positions)  # [1, S, 1, half]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rotation_tables(
    freqs: np.ndarray,
    seq: int,
    offset: int | jax.Array = 0,
    scale: float = 1.0,
    positions: np.ndarray | jax.Array | None = None,
) -> tuple[np.ndarray | jax.Array, np.ndarray | jax.Array]:
    """cos and sin [1, S, 1, len(freqs)] of the angles of positions offset, ..., offset + S - 1
    (or of `positions` when given: [S], numpy; or [B, S], a packed row's, giving [B, S, 1,
    len(freqs)]), times `scale`.

    With a Python int offset (training, prefill) they are numpy constants, computed once when the
    step is traced: built from jax ops, they would be fused into the multiplies that read them,
    and XLA would compute cos and sin again for every element of the [B, S, heads, head_dim]
    tensor it rotates. A decode step's offset is traced, so its angles are computed in jax.
    """
    known = positions is None or isinstance(positions, np.ndarray)
    xp = np if isinstance(offset, int) and known else jnp
    if positions is None:
        positions = offset + xp.arange(seq, dtype=np.float32)  # [S]
    angles = positions.astype(np.float32)[..., None] * freqs  # [S or B, S, len(freqs)]
    cos, sin = scale * xp.cos(angles), scale * xp.sin(angles)
    if angles.ndim == 3:  # a position per row and token: [B, S, 1, len(freqs)]
        return cos[:, :, None, :].astype(np.float32), sin[:, :, None, :].astype(np.float32)
    return cos[None, :, None, :].astype(np.float32), sin[None, :, None, :].astype(np.float32)


def apply_rotary(
    x: jax.Array,
    freqs: np.ndarray,
    interleaved: bool = False,
    scale: float = 1.0,
    offset: int | jax.Array = 0,
    positions: np.ndarray | jax.Array | None = None,
) -> jax.Array:
    """Rotary embedding on x [B, S, heads, head_dim] with the given frequencies [rotary_dim / 2].

    Only the first rotary_dim = 2 * len(freqs) features of each head rotate; the rest pass
    through. `interleaved` pairs (x0, x1), (x2, x3), ...; otherwise (x_i, x_{i + rotary_dim / 2}).
    `scale` multiplies cos and sin (YaRN's attention factor). The tokens sit at positions
    offset, offset + 1, ... (a decode step's offset is its cache position), or at `positions`
    [S] (context parallelism's zig-zag order) or [B, S] (a packed row's).
    """
    rotary_dim = 2 * freqs.shape[0]
    cos, sin = rotation_tables(
        freqs, x.shape[1], offset, scale, positions
    )  # [1, S, 1, rotary_dim / 2]
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(rot.shape)
    else:
        x1, x2 = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2 :]
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([out.astype(x.dtype), rest], axis=-1)


def rope_frequencies(rotary_dim: int, theta: float) -> np.ndarray:
    """The rotary frequencies theta^(-2i / rotary_dim), i < rotary_dim / 2 (RoFormer)."""
    return 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim))


def llama3_frequencies(
    rotary_dim: int,
    theta: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_seq: int,
) -> np.ndarray:
    """Llama 3.1's frequency scaling: wavelengths longer than original_max_seq / low_freq_factor
    are divided by `factor`, shorter than original_max_seq / high_freq_factor kept, and those
    between blended smoothly."""
    freqs = rope_frequencies(rotary_dim, theta)
    wavelen = 2 * math.pi / freqs
    smooth = (original_max_seq / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    scaled = np.where(wavelen > original_max_seq / low_freq_factor, freqs / factor, freqs)
    medium = (wavelen >= original_max_seq / high_freq_factor) & (
        wavelen <= original_max_seq / low_freq_factor
    )
    return np.where(medium, blended, scaled)


def yarn_frequencies(
    rotary_dim: int,
    theta: float,
    factor: float,
    original_max_seq: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> np.ndarray:
    """YaRN (Peng et al. 2023): dims that turn fewer than beta_slow times over original_max_seq
    are interpolated (divided by `factor`), more than beta_fast times extrapolated (kept), and
    those between ramp linearly."""

    def turning_dim(
        turns: float,
    ) -> float:  # the dim that turns `turns` times over original_max_seq
        return (
            rotary_dim * math.log(original_max_seq / (turns * 2 * math.pi)) / (2 * math.log(theta))
        )

    low, high = turning_dim(beta_fast), turning_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    freqs = rope_frequencies(rotary_dim, theta)
    return freqs / factor * ramp + freqs * (1 - ramp)


def yarn_attention_factor(factor: float, mscale: float = 1.0, mscale_all_dim: float = 0.0) -> float:
    """YaRN's cos/sin scale 0.1 ln(factor) + 1 (DeepSeek: the ratio for mscale and
    mscale_all_dim)."""

    def m(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

    return m(mscale) / m(mscale_all_dim) if mscale and mscale_all_dim else m(1.0)
