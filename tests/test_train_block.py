"""The `train { }` block: its settings reach the generated TrainConfig, and every optimizer it
accepts (and dropout in the model) produces a train.py that really trains, built into a temporary
package. Schedules are checked value by value in test_training.py; the block's mistakes are error
fixtures (tests/errors/train_*.axl, run by test_errors.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from axdsl.build import build_files, write_atomic
from axdsl.ir import nodes as ir
from axdsl.pipeline import compile_spec

MODEL = """import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 256  dim = 32  layers = 1  heads = 2  kv_heads = 1  ffn = 64  max_seq = 64  dtype = f32
  BLOCK
}
"""


def spec_text(train: str, block: str = "") -> str:
    return MODEL.replace("BLOCK", block) + train


def build_package(tmp_path: Path, name: str, text: str):
    """Write spec `name`.axl, build it into tmp_path/generated/<name>/cpu and import its train.py."""
    spec = tmp_path / f"{name}.axl"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "generated" / name / "cpu"
    write_atomic(out, build_files(spec, "cpu"), make_packages=True)
    top = tmp_path / "generated"  # holds runtime.py, which train.py imports as `from ... import runtime`
    alias = "_axdsl_test_" + hashlib.sha256(str(out).encode()).hexdigest()[:12]
    pkg = importlib.util.spec_from_file_location(alias, top / "__init__.py", submodule_search_locations=[str(top)])
    module = importlib.util.module_from_spec(pkg)
    sys.modules[alias] = module
    pkg.loader.exec_module(module)
    return importlib.import_module(f"{alias}.{name}.cpu.train")


FULL = """
train {
  batch = 16  seq = 32  steps = 50  microbatches = 2
  optimizer = lion(lr = 1e-4, b2 = 0.98)
  schedule = wsd(warmup = 5, decay = 0.3)
  clip = 0.5  z_loss = 1e-4  eval_every = 10  eval_batches = 2  log_every = 5  seed = 3
  max_bad_steps = 2  dtype = bf16  param_dtype = f32
  data = tokens("data/train.bin", dtype = "u32")
  checkpoint(every = 5, keep = 2, async = false, dir = "ckpt")
}
"""


def test_every_setting_reaches_train_config(tmp_path):
    tm = build_package(tmp_path, "full", spec_text(FULL))
    tc = tm.TRAIN
    expect = dict(model="lm", batch=16, seq=32, steps=50, microbatches=2, lr=1e-4, b1=0.9, b2=0.98,
                  weight_decay=0.1, warmup=5, decay=0.3, final=0.0, clip=0.5, z_loss=1e-4,
                  eval_every=10, eval_batches=2, log_every=5, seed=3, max_bad_steps=2, data="tokens",
                  data_path="data/train.bin", data_dtype="u32", checkpoint_every=5, checkpoint_keep=2,
                  checkpoint_async=False, checkpoint_dir="ckpt", dtype="bfloat16", param_dtype="float32")
    assert {k: getattr(tc, k) for k in expect} == expect
    assert "eps" not in {f.name for f in dataclasses.fields(tc)}  # lion has no eps
    assert tm.model_config(tc).dtype == np.dtype("bfloat16") and tm.CONFIGS["lm"].dtype == np.float32
    assert tm.model_config(dataclasses.replace(tc, dtype="")).dtype == np.float32
    source = Path(tm.__file__).read_text()
    assert "optax.lion(" in source and "optax.adamw(" not in source  # only the optimizer in use
    assert "full.axl:9:25\n    steps: int = 50\n" in source  # where it was set


def test_defaults_without_a_train_block(tmp_path):
    module = compile_spec(_write(tmp_path, "plain", spec_text("")), "cpu")
    t = dict(module.train_settings.settings)
    assert t["batch"].value == 8 and t["seq"].value == 64  # seq: 128, at most max_seq
    assert t["schedule"].value == ir.NamedCall("cosine", (("warmup", 100), ("final", 0.1)))
    assert t["optimizer"].value.name == "adamw" and t["data"].value == ir.DataSource(ir.DataKind.DEFAULT)


def test_left_out_warmup_is_a_tenth_of_the_run(tmp_path):
    text = spec_text("train {\n  steps = 50\n  schedule = linear(final = 0.1)\n}\n")
    module = compile_spec(_write(tmp_path, "short", text), "cpu")
    assert dict(module.train_settings.settings)["schedule"].value == ir.NamedCall("linear", (("warmup", 5), ("final", 0.1)))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    spec = tmp_path / f"{name}.axl"
    spec.write_text(text, encoding="utf-8")
    return spec


OPTIMIZERS = [
    "adamw(lr = 1e-3)",
    "lion(lr = 1e-4)",
    "adafactor(lr = 1e-2, weight_decay = 0.01)",
    "sgd(lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 1e-4)",
]
TOKENS = np.random.default_rng(0).integers(0, 256, (8, 33)).astype(np.int32)


@pytest.fixture(scope="module")
def lm_params(tmp_path_factory):
    """Parameters of `lm`, initialized once: every variant below shares the model's structure."""
    import jax

    tm = build_package(tmp_path_factory.mktemp("init"), "init", spec_text(""))
    return jax.jit(lambda k: tm.init_params(tm.CONFIGS["lm"], k))(jax.random.key(0))


def fresh_state(tm, params, mesh):
    """The train state of `tm` around a copy of `params` (the step donates its input)."""
    import jax
    import jax.numpy as jnp

    tc = tm.TRAIN
    params = jax.tree.map(jnp.copy, params)
    state = {"params": params, "opt_state": tm.make_optimizer(tc).init(params),
             "step": jnp.zeros((), jnp.int32), "bad_steps": jnp.zeros((), jnp.int32)}
    return jax.device_put(state, tm.state_shardings(tm.CONFIGS["lm"], tc, mesh))


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.split("(")[0])
def test_each_optimizer_trains(tmp_path, lm_params, optimizer):
    """Three steps on one repeated batch: the loss goes down; norms are not weight-decayed."""
    import jax

    train = f"train {{\n  batch = 8  seq = 32  optimizer = {optimizer}\n  schedule = constant()\n}}\n"
    tm = build_package(tmp_path, optimizer.split("(")[0], spec_text(train))
    mask = tm.decay_mask()
    assert mask["blocks"]["attn_norm"]["scale"] is False and mask["head"] is True
    mesh = tm.make_mesh(jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = fresh_state(tm, lm_params, mesh)
        step = tm.make_train_step(tm.CONFIGS["lm"], tm.TRAIN, mesh)
        batch = jax.device_put(TOKENS, tm.batch_sharding(mesh))
        losses = []
        for _ in range(3):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert int(state["step"]) == 3


@pytest.mark.parametrize("optimizer", ["adamw", "lion"])
def test_mu_dtype_keeps_the_first_moment_in_bf16_and_trains(tmp_path, lm_params, optimizer):
    """`adamw(mu_dtype = bf16)`: train.py passes optax's mu_dtype, so the first moment is bf16
    (adamw's second stays float32) and the model still trains; the memory model counts 2 bytes."""
    import jax

    from axdsl.analysis.memory import estimate_memory

    train = (f"train {{\n  batch = 8  seq = 32  optimizer = {optimizer}(lr = 1e-3, mu_dtype = bf16)\n"
             "  schedule = constant()\n}\n")
    tm = build_package(tmp_path, f"mu_{optimizer}", spec_text(train))
    assert tm.TRAIN.mu_dtype == "bfloat16"
    mesh = tm.make_mesh(jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = fresh_state(tm, lm_params, mesh)
        dtypes = {str(x.dtype) for x in jax.tree.leaves(state["opt_state"]) if x.ndim}
        assert dtypes == ({"bfloat16", "float32"} if optimizer == "adamw" else {"bfloat16"}), dtypes
        step = tm.make_train_step(tm.CONFIGS["lm"], tm.TRAIN, mesh)
        batch = jax.device_put(TOKENS, tm.batch_sharding(mesh))
        losses = []
        for _ in range(3):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    mu = jax.tree.leaves(state["opt_state"][1][0].mu)
    assert all(str(x.dtype) == "bfloat16" for x in mu)
    module = compile_spec(tmp_path / f"mu_{optimizer}.axl", "cpu")
    plain = estimate_memory(module, mu_dtype="f32")
    assert estimate_memory(module).opt_state == plain.opt_state - plain.params // 2


def test_plain_optimizers_generate_no_mu_dtype(tmp_path):
    """A spec that leaves mu_dtype out generates what it always did: no field, no argument."""
    tm = build_package(tmp_path, "plain_mu", spec_text("train { optimizer = adamw(lr = 1e-3) }\n"))
    assert "mu_dtype" not in Path(tm.__file__).read_text()


def test_dropout_models_get_a_key_per_step(tmp_path, lm_params):
    """A model with dropout trains with keys folded from (seed, step): same step, same result."""
    import jax

    tm = build_package(tmp_path, "drop", spec_text("train {\n  batch = 8  seq = 32  microbatches = 2\n}\n",
                                                   "block = Block(dropout = 0.5)"))
    assert "rng=rng" in Path(tm.__file__).read_text()
    cfg, tc = tm.CONFIGS["lm"], tm.TRAIN
    mesh = tm.make_mesh(jax.devices()[:1])
    with jax.set_mesh(mesh):
        step = tm.make_train_step(cfg, tc, mesh)
        batch = jax.device_put(TOKENS, tm.batch_sharding(mesh))
        a = float(step(fresh_state(tm, lm_params, mesh), batch)[1]["loss"])
        b = float(step(fresh_state(tm, lm_params, mesh), batch)[1]["loss"])
        clean = float(tm.make_eval_step(cfg, tc, mesh)(lm_params, batch))
    assert a == b  # deterministic given the seed and step
    assert a != clean  # dropout is on in training and off in evaluation
