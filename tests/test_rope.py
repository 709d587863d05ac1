"""Rotary embedding variants: partial, interleaved, and linear/llama3/yarn frequency scaling.

The frequencies the generated helpers compute are compared with transformers' own rope
initializers (modeling_rope_utils.ROPE_INIT_FUNCTIONS) for the same parameters, the rotation of a
part of each head and the interleaved layout with an independent numpy reference, and the plain
form keeps emitting `apply_rope` (existing generated code is unchanged). Whole models with
llama3 and yarn scaling match transformers' Llama in tests/test_hf.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.targets_util import import_generated, kernels_of

SPEC = """import "std/transformer.axl"
model m = DecoderLM {{
  vocab = 64  dim = 64  layers = 1  heads = 2  ffn = 64  dtype = f32  max_seq = 64
  block = Block(attn = Attention({attn}))
}}
"""


def _model(tmp_path, attn: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "rope.axl"
    spec.write_text(SPEC.format(attn=attn))
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    return model, (tmp_path / "gen").rglob("model.py").__next__().read_text()


def _hf_inv_freq(rope_type: str, head_dim: int = 32, **params) -> tuple[np.ndarray, float]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    conf = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                    max_position_embeddings=64,
                                    rope_parameters={"rope_type": rope_type, **params})
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](conf, "cpu")
    return inv_freq.numpy(), float(factor)


def _rotate_reference(x: np.ndarray, freqs: np.ndarray, interleaved: bool, scale: float = 1.0) -> np.ndarray:
    """Rotate pairs of the first 2 * len(freqs) features of x [B, S, H, D] by position * freq."""
    r = 2 * len(freqs)
    out = x.astype(np.float64).copy()
    angles = np.arange(x.shape[1])[:, None] * freqs.astype(np.float64)  # [S, r / 2]
    for i in range(r // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + r // 2)
        c = scale * np.cos(angles[:, i])[None, :, None]
        s = scale * np.sin(angles[:, i])[None, :, None]
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def test_plain_rope_keeps_its_helper(tmp_path):
    _, code = _model(tmp_path, "")
    assert "apply_rope(q, theta=" in code and "apply_rotary" not in code


@pytest.mark.parametrize("rope_type, attn, params", [
    ("linear", 'rope_scaling = "linear", rope_factor = 4.0', {"factor": 4.0}),
    ("llama3", 'rope_scaling = "llama3", rope_factor = 8.0, rope_low_freq = 1.0, rope_high_freq = 4.0, '
               'rope_original_max_seq = 16',
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    ("yarn", 'rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 16',
     {"factor": 4.0, "original_max_position_embeddings": 16}),
    ("yarn", 'rope_scaling = "yarn", rope_factor = 40.0, rope_original_max_seq = 32, rope_beta_fast = 16.0, '
             'rope_beta_slow = 2.0, rope_mscale = 1.0, rope_mscale_all_dim = 0.707, rope_untruncated = true',
     {"factor": 40.0, "original_max_position_embeddings": 32, "beta_fast": 16.0, "beta_slow": 2.0,
      "mscale": 1.0, "mscale_all_dim": 0.707, "truncate": False}),
])
def test_scaled_frequencies_match_transformers(tmp_path, rope_type, attn, params):
    import jax.numpy as jnp

    model, code = _model(tmp_path, attn)
    ref, ref_factor = _hf_inv_freq(rope_type, rope_theta=10000.0, **params)
    x = np.random.default_rng(0).normal(size=(1, 48, 2, 32)).astype(np.float32)
    q = jnp.asarray(x)
    if rope_type == "linear":
        freqs = kernels_of(model).rope_frequencies(32, 10000.0) / 4.0
        factor = 1.0
    elif rope_type == "llama3":
        freqs = kernels_of(model).llama3_frequencies(32, 10000.0, 8.0, 1.0, 4.0, 16)
        factor = 1.0
    else:
        freqs = kernels_of(model).yarn_frequencies(32, 10000.0, params["factor"], params["original_max_position_embeddings"],
                                       params.get("beta_fast", 32.0), params.get("beta_slow", 1.0),
                                       params.get("truncate", True))
        factor = kernels_of(model).yarn_attention_factor(params["factor"], params.get("mscale", 1.0),
                                             params.get("mscale_all_dim", 0.0))
    np.testing.assert_allclose(np.asarray(freqs), ref, rtol=1e-6)
    assert factor == pytest.approx(ref_factor, rel=1e-12)
    assert not np.allclose(np.asarray(freqs), np.asarray(kernels_of(model).rope_frequencies(32, 10000.0)))  # it scales
    rotated = np.asarray(kernels_of(model).apply_rotary(q, freqs, scale=factor))
    np.testing.assert_allclose(rotated, _rotate_reference(x, ref, False, ref_factor), atol=2e-5)
    assert f"{rope_type}_frequencies(" in code or rope_type == "linear"


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_and_interleaved_rotation(tmp_path, interleaved):
    """rope_dim = 8 of head_dim 32: 8 features rotate, 24 pass through unchanged."""
    import jax
    import jax.numpy as jnp

    flag = ", rope_interleaved = true" if interleaved else ""
    model, code = _model(tmp_path, f"rope_dim = 8{flag}")
    assert "apply_rotary(" in code and ("interleaved=True" in code) == interleaved
    x = np.random.default_rng(1).normal(size=(2, 16, 2, 32)).astype(np.float32)
    freqs = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    out = np.asarray(kernels_of(model).apply_rotary(jnp.asarray(x), kernels_of(model).rope_frequencies(8, 10000.0), interleaved=interleaved))
    np.testing.assert_allclose(out, _rotate_reference(x, freqs, interleaved), atol=2e-5)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
    # the two layouts differ, and the whole model runs with the variant
    other = np.asarray(kernels_of(model).apply_rotary(jnp.asarray(x), kernels_of(model).rope_frequencies(8, 10000.0),
                                          interleaved=not interleaved))
    assert np.abs(out - other).max() > 1e-2
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    logits = model.forward(cfg, params, jnp.ones((1, 8), jnp.int32))
    assert logits.shape == (1, 8, 64) and bool(jnp.isfinite(logits).all())


def test_an_odd_rotary_dim_rotates_one_feature_more_as_transformers_does(tmp_path):
    """GPT-NeoX with a head of 12 and rotary_pct 0.25 has rotary_ndims = 3: transformers rotates 4
    features (cos and sin of 2 frequencies theta^(-2i/3), doubled) and passes 8 through. A spec's
    rope_dim = 3 was refused (issue 38); it now checks, and the helpers its generated code calls
    (rope_frequencies(3, theta), apply_rotary: copied from axdsl/kernels/rope.py; the emitted call
    is the partial form test_partial_and_interleaved_rotation runs) rotate the same features as
    transformers' own GPTNeoXRotaryEmbedding and apply_rotary_pos_emb. No model is built: cheap."""
    import jax.numpy as jnp

    from axdsl.kernels import rope
    from axdsl.pipeline import compile_spec

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    spec = tmp_path / "odd.axl"
    spec.write_text(SPEC.format(attn="rope_dim = 3"))
    (attn,) = [i for i in compile_spec(spec, "cpu").models[0].root.walk() if i.layer == "Attention"]
    assert attn.hparam("rope_dim").value.value == 3
    conf = transformers.GPTNeoXConfig(hidden_size=24, num_attention_heads=2, rotary_pct=0.25,
                                      rotary_emb_base=10000.0, max_position_embeddings=64)
    x = np.random.default_rng(2).normal(size=(2, 16, 2, 12)).astype(np.float32)
    q = torch.from_numpy(x).permute(0, 2, 1, 3)  # transformers' [B, heads, S, head_dim]
    cos, sin = neox.GPTNeoXRotaryEmbedding(conf)(q, torch.arange(16)[None].expand(2, -1))
    ref = neox.apply_rotary_pos_emb(q, q, cos, sin)[0].permute(0, 2, 1, 3).numpy()
    out = np.asarray(rope.apply_rotary(jnp.asarray(x), rope.rope_frequencies(3, 10000.0)))
    np.testing.assert_allclose(out, ref, atol=1e-6)
    assert np.abs(out[..., 3] - x[..., 3]).max() > 1e-2  # the 4th feature rotates too
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])


def test_full_rotary_equals_the_plain_helper(tmp_path):
    """Every feature rotating with unit linear scaling is the plain rope: the same logits from
    `apply_rotary` as from `apply_rope`, for the same parameters."""
    import jax
    import jax.numpy as jnp

    plain, plain_code = _model(tmp_path / "a", "")
    variant, code = _model(tmp_path / "b", 'rope_scaling = "linear", rope_factor = 1.0')
    assert "apply_rope(" in plain_code and "apply_rotary(" in code
    cfg = plain.Config()
    params = plain.init_params(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, (2, 16)))
    np.testing.assert_allclose(np.asarray(variant.forward(variant.Config(), params, tokens)),
                               np.asarray(plain.forward(cfg, params, tokens)), atol=1e-5)


@pytest.mark.parametrize("attn", ["", 'rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 16'])
def test_rotation_tables_are_constants_not_recomputed_per_element(tmp_path, attn):
    """Under jit with positions known at trace time, cos and sin come from numpy tables: the
    compiled program has no cosine or sine op (XLA had fused them into the multiplies and computed
    them for every element of the rotated tensor). A traced offset (a decode step) computes the
    same rotation in jax."""
    import jax
    import jax.numpy as jnp

    model, _ = _model(tmp_path, attn)
    freqs = 1.0 / 10000.0 ** (np.arange(0, 32, 2) / 32)
    scale = 1.0 if not attn else kernels_of(model).yarn_attention_factor(4.0)
    rotate = (lambda x, offset=0: kernels_of(model).apply_rope(x, 10000.0, offset)) if not attn else (
        lambda x, offset=0: kernels_of(model).apply_rotary(x, kernels_of(model).yarn_frequencies(32, 10000.0, 4.0, 16), scale=scale,
                                               offset=offset))
    x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 24, 2, 32)).astype(np.float32))
    hlo = jax.jit(rotate).lower(x).compile().as_text()
    assert "cosine(" not in hlo and "sine(" not in hlo
    traced = jax.jit(rotate)(x[:, 5:6], jnp.int32(5))  # one decode position, its offset traced
    np.testing.assert_allclose(np.asarray(traced), np.asarray(rotate(x)[:, 5:6]), atol=1e-6)
    if not attn:
        np.testing.assert_allclose(np.asarray(rotate(x)), _rotate_reference(np.asarray(x), freqs, False), atol=2e-5)
