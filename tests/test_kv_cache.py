"""The generated KV-cache decode path: `prefill` then `decode_step` give the logits of the full
forward, for each kind of attention the zoo has (GQA with rope, sliding windows with soft-capping,
learned positions, partial rotary, MLA's own value head dim); `axdsl sample`'s cached generation
picks exactly the full forward's greedy tokens; models that cannot decode say why and fall back.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl import sampling
from axdsl.passes.plan_decode import decode_problem
from axdsl.pipeline import compile_spec

ROOT = Path(__file__).resolve().parent.parent


def _model(spec: str):
    return importlib.import_module(f"generated.{spec}.cpu.model")


@pytest.mark.parametrize("spec, name", [
    ("tiny_llama", "tiny_llama"),  # GQA, rope
    ("gemma2_2b", "gemma2_tiny"),  # alternating sliding-window layers, attention soft-capping
    ("gemma3_1b", "gemma3_tiny"),  # a pattern of 6 over 8 layers (2 after the scan), q/k norms, two rotary bases
    ("gpt2_small", "gpt2_tiny"),  # a learned position table, read from the cache position on
    ("phi2", "phi2_tiny"),  # partial rotary
    ("deepseek_v3", "deepseek_v3_tiny"),  # MLA: v's head dim is not k's; dense then MoE layers
])
def test_prefill_then_decode_steps_equal_the_full_forward(spec, name):
    model = _model(spec)
    cfg = dataclasses.replace(model.CONFIGS[name], dtype=jnp.float32, param_dtype=jnp.float32)
    params = model.init_params(cfg, jax.random.key(0))
    prompt, steps = 5, 6
    tokens = jax.random.randint(jax.random.key(1), (2, prompt + steps), 0, cfg.vocab)
    full = np.asarray(model.forward(cfg, params, tokens))
    logits, cache = model.prefill(cfg, params, tokens[:, :prompt], model.init_cache(cfg, 2, prompt + steps))
    np.testing.assert_allclose(np.asarray(logits), full[:, :prompt], atol=2e-5)
    for i in range(prompt, prompt + steps):
        logits, cache = model.decode_step(cfg, params, tokens[:, i], cache, jnp.int32(i))
        np.testing.assert_allclose(np.asarray(logits), full[:, i], atol=2e-5)


def test_cached_greedy_tokens_equal_the_full_forward_and_survive_a_full_cache():
    model = _model("tiny_llama")
    cfg = model.CONFIGS["tiny_llama"]
    params = model.init_params(cfg, jax.random.key(3))
    ids = list(b"To be, or not")
    def run(window: int, n: int, cache: bool) -> list[int]:
        greedy = sampling.Sampling(temperature=0.0, cache=cache)
        return list(sampling.generate_tokens(model, cfg, params, ids, window, n, greedy,
                                             np.random.default_rng(0)))

    fits = cfg.max_seq - len(ids)
    assert run(cfg.max_seq, fits, True) == run(cfg.max_seq, fits, False)
    # past the window the cache restarts from its newest half: generation goes on, same length
    beyond = run(32, 60, True)
    assert len(beyond) == 60 and beyond[: 32 - len(ids)] == run(32, 60, False)[: 32 - len(ids)]
    # sampled (not greedy) generation is reproducible from its seed
    hot = sampling.Sampling(temperature=0.9, top_k=20)
    draw = lambda: list(sampling.generate_tokens(model, cfg, params, ids, 64, 30, hot,  # noqa: E731
                                                 np.random.default_rng(7)))
    assert draw() == draw()


def test_the_cache_is_laid_out_like_the_parameters_and_sharded_like_the_activations():
    model = _model("tiny_llama")
    cfg = model.CONFIGS["tiny_llama"]
    cache = model.init_cache(cfg, 3, 40)
    head_dim = cfg.dim // cfg.heads
    assert cache["blocks"]["attn"]["k"].shape == (cfg.layers, 3, 40, cfg.kv_heads, head_dim)
    assert cache["blocks"]["attn"]["v"].dtype == cfg.dtype
    h100 = (ROOT / "generated/llama3_8b/gpu_h100/model.py").read_text()
    assert "def cache_specs()" in h100 and "def decode_step(" in h100


@pytest.mark.parametrize("spec, words", [
    ("mamba2_2_7b", "`ssd`, which mixes positions without a cache"),
    ("vit_tiny", "non-causal attention"),
])
def test_a_model_that_cannot_decode_says_why_and_samples_without_a_cache(spec, words):
    module = compile_spec(ROOT / "specs" / f"{spec}.axl")
    assert words in decode_problem(module.models[0].root)
    source = (ROOT / f"generated/{spec}/cpu/model.py").read_text()
    assert "def decode_step(" not in source
    if spec == "mamba2_2_7b":  # an LM: the file says why it has no decode path
        assert "# No KV-cache decode path" in source and words in source


def test_decode_params_cast_once_give_the_same_logits():
    """decode_params casts the f32 master weights to the compute dtype once (sample does it before
    prefill); prefill and decode steps over them give exactly the logits of the per-step casts."""
    model = _model("gemma2_2b")  # bf16 compute over f32 weights
    cfg = model.CONFIGS["gemma2_tiny"]
    assert cfg.dtype == jnp.bfloat16 and cfg.param_dtype == jnp.float32
    params = model.init_params(cfg, jax.random.key(0))
    cast = model.decode_params(cfg, params)
    assert all(w.dtype == jnp.bfloat16 for w in jax.tree.leaves(cast))
    tokens = jax.random.randint(jax.random.key(1), (1, 6), 0, cfg.vocab)
    outs = []
    for p in (params, cast):
        logits, cache = model.prefill(cfg, p, tokens, model.init_cache(cfg, 1, 8))
        step, _ = model.decode_step(cfg, p, tokens[:, -1], cache, jnp.int32(6))
        outs.append((np.asarray(logits), np.asarray(step)))
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes()
