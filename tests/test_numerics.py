"""The generated tiny_llama equals an independent numpy reference, and optax steps lower its loss."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest


@pytest.fixture(scope="module")
def model():
    return importlib.import_module("generated.tiny_llama.cpu.model")


def _rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope(x, theta):
    """Half-split rotary embedding, written independently of the generated helper."""
    seq, hd = x.shape[1], x.shape[-1]
    half = hd // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) / half)
    ang = np.arange(seq)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _attention(x, p, cfg):
    q = np.einsum("bsd,dhk->bshk", x, p["wq"])
    k = np.einsum("bsd,dhk->bshk", x, p["wk"])
    v = np.einsum("bsd,dhk->bshk", x, p["wv"])
    q, k = _rope(q, cfg.rope_theta), _rope(k, cfg.rope_theta)
    group = cfg.heads // cfg.kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    seq = x.shape[1]
    scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", probs, v)
    return np.einsum("bshk,hkd->bsd", o, p["wo"])


def reference_forward(params, tokens, cfg):
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps = 1e-5
    x = p["embed"]["table"][np.asarray(tokens)]
    for layer in range(cfg.layers):
        lp = jax.tree.map(lambda a: a[layer], p["blocks"])
        x = x + _attention(_rms_norm(x, lp["attn_norm"]["scale"], eps), lp["attn"], cfg)
        h = _rms_norm(x, lp["mlp_norm"]["scale"], eps)
        m = lp["mlp"]
        gate = h @ m["w_gate"]
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ m["w_up"])) @ m["w_down"]
    x = _rms_norm(x, p["final_norm"]["scale"], eps)
    return x @ p["head"]


def test_forward_matches_independent_reference(model):
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    # Larger weights than the init so that differences would show.
    params = jax.tree.map(lambda a: a * 10.0 if a.ndim > 2 else a, params)
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, cfg.vocab)
    got = np.asarray(jax.jit(model.forward, static_argnums=0)(cfg, params, tokens))
    want = reference_forward(params, tokens, cfg)
    assert got.dtype == np.float32
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_init_is_deterministic_by_path(model):
    cfg = model.Config()
    a = model.init_params(cfg, jax.random.key(0))
    b = model.init_params(cfg, jax.random.key(0))
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: bool((x == y).all()), a, b)))
    assert not np.allclose(a["blocks"]["mlp"]["w_gate"], a["blocks"]["mlp"]["w_up"])
    assert jax.tree.structure(a) == jax.tree.structure(model.param_axes(), is_leaf=lambda x: isinstance(x, tuple))


def test_a_few_optax_steps_lower_the_loss(model):
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jnp.tile(jnp.arange(33, dtype=jnp.int32) % 7, (4, 1))
    opt = optax.adamw(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0])(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(10):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses


def test_gpt2_tiny_runs_with_tied_head_and_learned_positions():
    m = importlib.import_module("generated.gpt2_small.cpu.model")
    cfg = m.CONFIGS["gpt2_tiny"]
    params = m.init_params(cfg, jax.random.key(0))
    assert "head" not in params and "pos_embed" in params
    logits = m.forward(cfg, params, jnp.zeros((1, 8), jnp.int32))
    assert logits.shape == (1, 8, cfg.vocab)
    table = params["embed"]["table"]
    assert np.isfinite(np.asarray(logits)).all() and table.shape == (cfg.vocab, cfg.dim)
