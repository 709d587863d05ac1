"""Mixture of experts: the generated router/dispatch equals a per-token reference, capacity drops
tokens as documented, auxiliary losses reach the training loss, and experts shard over `expert`."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.pipeline import compile_spec
from tests.targets_util import import_generated

SPEC = """\
import "std/transformer.axl"

model moe = DecoderLM {
  vocab = 256  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64  dtype = f32
  block = Block(mlp = MoE(hidden = 32, experts = 4, top_k = 2, capacity_factor = CF, shared = SHARED))
}

train { batch = 8  seq = 16  optimizer = adamw(lr = 3e-3)  schedule = constant(warmup = 0) }

target "cpu-8" { mesh(data = 2, expert = 4) }
"""


def _spec(tmp: Path, name: str, cf: float = 0.0, shared: int = 0) -> Path:
    path = tmp / f"{name}.axl"
    path.write_text(SPEC.replace("CF", repr(cf)).replace("SHARED", str(shared)))
    return path


@pytest.fixture(scope="module")
def dropless(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    return import_generated(_spec(tmp, "dropless", 0.0), "cpu", tmp)


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A build whose experts have a capacity, read from its Config (the model is the layer): it
    ships both dispatch paths and calls `moe_dispatch`, which picks one by that capacity."""
    tmp = tmp_path_factory.mktemp("moe_capped")
    path = tmp / "capped.axl"
    path.write_text(
        'import "std/layers.axl"\n'
        "model capped = MoE {\n"
        "  dim = 16  hidden = 8  experts = 4  top_k = 2  capacity_factor = 4.0\n"
        "}\n"
    )
    model, _ = import_generated(path, "cpu", tmp)
    assert model.Config().capacity_factor == 4.0
    return model, None


def _reference_moe(x, logits, w_gate, w_up, w_down, top_k):
    """Every token through its top-k experts, one at a time, in float64."""
    x, logits = np.asarray(x, np.float64), np.asarray(logits, np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            top = np.argsort(-probs[b, s], kind="stable")[:top_k]
            w = probs[b, s, top] / probs[b, s, top].sum()
            for e, we in zip(top, w, strict=True):
                g = x[b, s] @ np.asarray(w_gate[e], np.float64)
                h = g / (1 + np.exp(-g)) * (x[b, s] @ np.asarray(w_up[e], np.float64))
                out[b, s] += we * (h @ np.asarray(w_down[e], np.float64))
    return out


def _random_moe_inputs(experts=4, dim=16, hidden=8, batch=2, seq=12):
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (batch, seq, dim))
    logits = jax.random.normal(k[1], (batch, seq, experts)) * 2
    w_gate = jax.random.normal(k[2], (experts, dim, hidden)) / 4
    w_up = jax.random.normal(k[3], (experts, dim, hidden)) / 4
    w_down = jax.random.normal(k[4], (experts, hidden, dim)) / 4
    return x, logits, w_gate, w_up, w_down


def _moe(model, x, logits, w_gate, w_up, w_down, top_k, normalize, aux_weight, z_weight, **paths):
    """The generated layer's calls: its router, then `moe_dispatch` when a capacity_factor is
    given (the `capped` build, whose Config holds it), else the dropless path."""
    weights, chosen, aux = model.moe_route(
        logits, top_k=top_k, normalize=normalize, aux_weight=aux_weight, z_weight=z_weight
    )
    dispatch = model.moe_dispatch if "capacity_factor" in paths else model.moe_dropless
    return dispatch(x, weights, chosen, w_gate, w_up, w_down, **paths), aux


@pytest.mark.parametrize("capacity_factor", [0.0, 4.0])
def test_dropless_and_ample_capacity_equal_the_per_token_reference(
    dropless, capped, capacity_factor
):
    args = _random_moe_inputs()
    kwargs = dict(top_k=2, normalize=True, aux_weight=0.01, z_weight=0.001)
    if capacity_factor > 0:
        y, aux = _moe(capped[0], *args, capacity_factor=capacity_factor, **kwargs)
    else:  # a dropless build has no capacity path
        y, aux = _moe(dropless[0], *args, **kwargs)
    np.testing.assert_allclose(np.asarray(y), _reference_moe(*args, top_k=2), atol=1e-5, rtol=1e-5)
    # The auxiliary loss, recomputed from its definition.
    logits = np.asarray(args[1], np.float64)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :2]
    load = np.stack([(top == e).sum(-1).mean() for e in range(4)]) / 2  # share of the choices
    lb = 4 * np.sum(load * probs.mean((0, 1)))
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    np.testing.assert_allclose(float(aux), 0.01 * lb + 0.001 * z, rtol=1e-5)


def test_capacity_drops_tokens_beyond_each_experts_slots(capped):
    model, _ = capped
    x, logits, w_gate, w_up, w_down = _random_moe_inputs(seq=16)
    logits = logits.at[..., 0].add(10.0)  # every token's first choice is expert 0
    cf = 0.5
    y, _ = _moe(
        model,
        x,
        logits,
        w_gate,
        w_up,
        w_down,
        top_k=1,
        capacity_factor=cf,
        normalize=True,
        aux_weight=0.0,
        z_weight=0.0,
    )
    capacity = math.ceil(1 * 16 * cf / 4)  # 2 slots per sequence for expert 0
    served = np.abs(np.asarray(y)).sum(-1) > 0  # [B, S]: tokens that got an expert's output
    assert (served.sum(-1) == capacity).all()
    assert served[:, :capacity].all(), "earlier tokens take the slots first"
    full = _reference_moe(x, logits, w_gate, w_up, w_down, top_k=1)
    np.testing.assert_allclose(
        np.asarray(y)[:, :capacity], full[:, :capacity], atol=1e-5, rtol=1e-5
    )


def test_moe_is_a_drop_in_feed_forward_and_trains(dropless):
    model, train = dropless
    source = Path(model.__file__).read_text()
    kernels = Path(model.__file__).with_name("kernels.py").read_text()
    assert "def moe_dropless(" in kernels and "def moe_route(" in kernels
    assert not any(  # dropless only, plain softmax routing
        f"def {name}(" in kernels
        for name in ("moe_with_capacity", "moe_dispatch", "moe_route_deepseek", "moe_balance")
    )
    assert (
        "def moe(cfg: Config, params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:" in source
    )
    assert "(x, blocks_aux), _ = jax.lax.scan(" in source
    cfg, tc = model.CONFIGS["moe"], train.TRAIN
    params = model.init_params(cfg, jax.random.key(0))
    assert params["blocks"]["mlp"]["w_gate"].shape == (2, 4, 64, 32)
    tokens = jnp.tile(jnp.arange(17, dtype=jnp.int32) % 5, (8, 1))
    logits, aux = model.forward_with_aux(cfg, params, tokens[:, :-1])
    assert logits.shape == (8, 16, 256) and float(aux) > 0
    ce = float(model.loss_fn(cfg, params, tokens)[0]) - float(aux)
    assert np.isfinite(ce)
    mesh = model.make_mesh(jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = train.init_state(cfg, tc, mesh, jax.random.key(0))
        step = train.make_train_step(cfg, tc, mesh)
        batch = jax.device_put(tokens, train.batch_sharding(mesh))
        losses = []
        for _ in range(8):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.parametrize("capacity_factor", [0.0, 1.5])
def test_experts_shard_over_the_expert_axis_with_unchanged_results(tmp_path, capacity_factor):
    path = _spec(tmp_path, "ep", capacity_factor, shared=1)
    module = compile_spec(path, "cpu-8")
    w_gate = next(i for i in module.models[0].root.walk() if i.path == "/blocks/mlp").param(
        "w_gate"
    )
    assert w_gate.sharding == ((), ("expert",), (), ())
    model, _ = import_generated(path, "cpu-8", tmp_path)
    cfg = model.CONFIGS["moe"]
    mesh = model.make_mesh()
    assert dict(mesh.shape)["expert"] == 4
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (8, 17), 0, 256)
    want = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0]))(params)
    with jax.set_mesh(mesh):
        specs = model.param_specs()
        sharded = jax.tree.map(
            lambda a, s: jax.device_put(a, jax.NamedSharding(mesh, s)), params, specs
        )
        assert sharded["blocks"]["mlp"]["w_gate"].sharding.spec == jax.P(None, "expert")
        assert len(sharded["blocks"]["mlp"]["w_gate"].addressable_shards[0].data.shape) == 4
        assert (
            sharded["blocks"]["mlp"]["w_gate"].addressable_shards[0].data.shape[1] == 1
        )  # 4 experts / 4
        got = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0]))(sharded)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(8, 1), (2, 4)])  # the batch split 8 ways; 2 ways beside experts
def test_dropless_dispatch_sorts_only_each_devices_tokens(dropless, shape):
    """Under a mesh that splits the batch, each device sorts and runs its own tokens: every sort in
    the compiled step is one shard long, and each token's output and input gradient are bitwise
    the unsharded ones."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    x, logits, w_gate, w_up, w_down = _random_moe_inputs(batch=8)
    kwargs = dict(top_k=2, normalize=True, aux_weight=0.01, z_weight=0.001, batch_axes=("data",))

    def loss(x, logits, w_gate):  # logits an argument: XLA would fold a constant's routing
        y, _ = _moe(dropless[0], x, logits, w_gate, w_up, w_down, **kwargs)
        return jnp.sum(y**2), y

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 2), has_aux=True))
    (_, want), (want_dx, want_dw) = step(x, logits, w_gate)
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "expert"))
    with jax.set_mesh(mesh):
        rows = NamedSharding(mesh, P("data"))
        args = (jax.device_put(x, rows), jax.device_put(logits, rows), w_gate)
        hlo = step.lower(*args).compile().as_text()
        (_, got), (got_dx, got_dw) = step(*args)
    tokens = 8 * 12 * 2  # B * S * top_k (token, choice) pairs in the whole batch
    sorts = [line for line in hlo.splitlines() if " sort(" in line]
    assert sorts and all(f"[{tokens // shape[0]}]" in s and f"[{tokens}]" not in s for s in sorts)
    assert np.array_equal(np.asarray(got), np.asarray(want))
    assert np.array_equal(np.asarray(got_dx), np.asarray(want_dx))
    # A weight's gradient sums over the tokens: per shard, then across shards.
    np.testing.assert_allclose(np.asarray(got_dw), np.asarray(want_dw), rtol=1e-5, atol=1e-5)
