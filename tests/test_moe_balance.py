"""DeepSeek-V3's auxiliary-loss-free load balancing (`balance_rate` of `moe` / DeepSeekMoE).

The chain is tested link by link on the real generated code: the forward is unchanged by
balancing; the selection bias's gradient is exactly each expert's load surplus in the batch
(bincount of the chosen experts minus its mean); the optimizer moves each balanced bias by
-rate * sign(surplus) and nothing else (no AdamW state, no clipping, not in the logged gradient
norm); and whole train steps keep the bias on the rate's grid while the rest trains as before.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.targets_util import import_generated

RATE = 0.01


def _spec(tmp: Path, rate: float, name: str = "bal") -> Path:
    path = tmp / f"{name}.axl"
    path.write_text(f"""import "std/deepseek.axl"
model {name} = DecoderLM {{
  vocab = 64  dim = 32  layers = 2  heads = 2  ffn = 48  max_seq = 32
  norm = RMSNorm(eps = 1e-6)
  block = Block(attn = Attention(kv_heads = 2),
                mlp = DeepSeekMoE(hidden = 16, experts = 8, top_k = 2, groups = 4, top_groups = 2,
                                  scale = 2.5, shared = 1, balance_rate = {rate}))
  dtype = f32  param_dtype = f32
}}
train {{ batch = 8  seq = 16  steps = 4  optimizer = adamw(lr = 1e-2)  schedule = cosine(warmup = 1, final = 0.1) }}
""")
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("balance")
    return import_generated(_spec(tmp, RATE), "cpu", tmp / "on"), import_generated(_spec(tmp, 0.0), "cpu", tmp / "off")


def _moe_inputs(model):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 12, 32)), jnp.float32)
    logits = jnp.asarray(rng.standard_normal((2, 12, 8)), jnp.float32)
    w = [jnp.asarray(rng.standard_normal(s) * 0.2, jnp.float32) for s in ((8, 32, 16), (8, 32, 16), (8, 16, 32))]
    bias = jnp.asarray(rng.standard_normal(8) * 0.3, jnp.float32)
    return x, logits, w, bias


def test_the_bias_gradient_is_the_load_surplus_and_the_forward_is_unchanged(generated):
    (model, _), _ = generated
    x, logits, w, bias = _moe_inputs(model)
    kw = dict(top_k=2, normalize=True, aux_weight=0.0, z_weight=0.0, score="sigmoid", groups=4, top_groups=2,
              scale=2.5)

    def y_of(b, balance):  # the generated layer's calls, with and without its balancing update
        weights, chosen, _ = model.moe_route_deepseek(logits, bias=b, **kw)
        y = model.moe_dropless(x, weights, chosen, *w)
        return model.moe_balance(y, b, chosen) if balance else y

    np.testing.assert_array_equal(np.asarray(y_of(bias, True)), np.asarray(y_of(bias, False)))
    grad = jax.grad(lambda b: jnp.sum(y_of(b, True) ** 2))(bias)
    assert not np.any(np.asarray(jax.grad(lambda b: jnp.sum(y_of(b, False) ** 2))(bias)))
    chosen = np.asarray(model.moe_route_deepseek(logits, bias=bias, **kw)[1])  # (test_deepseek checks the choice)
    load = np.bincount(chosen.reshape(-1), minlength=8).astype(np.float32)
    assert load.sum() == 2 * 12 * 2 and load.std() > 0
    np.testing.assert_allclose(np.asarray(grad), load - load.mean(), rtol=0, atol=1e-6)


def test_the_optimizer_moves_balanced_biases_by_the_sign_rule_only(generated):
    (model, train), _ = generated
    assert train.BALANCE == {"blocks/mlp/score_bias": RATE}
    cfg, tc = model.CONFIGS["bal"], train.TRAIN
    params = model.init_params(cfg, jax.random.key(0))
    surplus = jnp.asarray([[3.0, -1.0, 0.0, -2.0, 5.0, -5.0, 1.0, -1.0]] * 2)  # [layers, experts]
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
    grads["blocks"]["mlp"]["score_bias"] = surplus
    optimizer = train.make_optimizer(tc)
    state = optimizer.init(params)
    for _ in range(2):  # the schedule's lr is 0 at step 0: AdamW moves the router from the second update
        updates, state = optimizer.update(grads, state, params)
        np.testing.assert_allclose(np.asarray(updates["blocks"]["mlp"]["score_bias"]), -RATE * np.sign(surplus))
    assert np.all(np.asarray(updates["blocks"]["mlp"]["router"]) != 0)  # AdamW still trains the router
    moments = [x for x in jax.tree.leaves(state) if hasattr(x, "shape") and x.shape == surplus.shape]
    assert not moments, "the balanced bias has no optimizer state"
    without = jax.tree.map(lambda g: g, grads)
    without["blocks"]["mlp"]["score_bias"] = jnp.zeros_like(surplus)
    assert float(train.runtime.global_norm(grads, skip=train.BALANCE)) == float(train.runtime.global_norm(without))


def test_train_steps_balance_the_bias_on_the_rate_grid(generated):
    (model, train), (model_off, train_off) = generated
    assert not hasattr(train_off, "BALANCE")
    cfg, tc = model.CONFIGS["bal"], train.TRAIN
    tokens = jax.random.randint(jax.random.key(1), (8, 17), 0, 64)
    mesh = model.make_mesh(jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = train.init_state(cfg, tc, mesh, jax.random.key(0))
        step = train.make_train_step(cfg, tc, mesh)
        batch = jax.device_put(tokens, train.batch_sharding(mesh))
        biases, losses = [], []
        for _ in range(4):
            state, metrics = step(state, batch)
            biases.append(np.asarray(state["params"]["blocks"]["mlp"]["score_bias"]))
            losses.append(float(metrics["loss"]))
    deltas = np.diff(np.stack([np.zeros_like(biases[0])] + biases), axis=0)
    assert np.all(np.isclose(np.abs(deltas), RATE) | (deltas == 0)), deltas
    assert np.abs(deltas).sum() > 0 and np.all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses
