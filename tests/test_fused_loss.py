"""The generated next-token loss: `loss_fn` runs the model to its hidden state, then the head and the
cross-entropy a chunk of positions at a time (`fused_cross_entropy`, with its gradient taken in the
forward pass). It must be the plain loss over forward's full logits, value and gradient, for each
kind of head the zoo has, with and without z-loss, with a ragged last chunk; the split must not
happen where the head is not position-wise.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from axdsl.analysis.head import head_of as split_head
from axdsl.pipeline import compile_spec


def _plain_loss(model, cfg, params, tokens, z_loss):
    """The loss written the obvious way: optax over forward's full float32 logits."""
    out = model.forward_with_aux(cfg, params, tokens[:, :-1]) if hasattr(model, "forward_with_aux") else None
    logits, aux = out if out is not None else (model.forward(cfg, params, tokens[:, :-1]), 0.0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss = ce + aux
    if z_loss:
        loss = loss + z_loss * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    return loss, ce


@pytest.mark.parametrize("spec, name, z_loss, chunk", [
    ("tiny_llama", "tiny_llama", 0.0, 7),  # an untied head; 3 chunks, the last one padded
    ("gemma2_2b", "gemma2_tiny", 1e-3, 8),  # a tied head with logit soft-capping, z-loss
    ("gpt2_small", "gpt2_tiny", 0.0, 512),  # tied, one chunk (chunk > S)
    ("mixtral_8x7b", "mixtral_8x7b_tiny", 1e-2, 5),  # MoE: the auxiliary loss comes from the hidden part
])
def test_fused_loss_is_the_plain_loss_value_and_gradient(spec, name, z_loss, chunk, monkeypatch):
    model = importlib.import_module(f"generated.{spec}.cpu.model")
    monkeypatch.setattr(model, "LOSS_CHUNK", chunk)
    cfg = dataclasses.replace(model.CONFIGS[name], dtype=jnp.float32, param_dtype=jnp.float32)
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 20), 0, cfg.vocab)
    fused = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens, z_loss=z_loss), has_aux=True))
    plain = jax.jit(jax.value_and_grad(lambda p: _plain_loss(model, cfg, p, tokens, z_loss), has_aux=True))
    (loss, ce), grads = fused(params)
    (want_loss, want_ce), want = plain(params)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    np.testing.assert_allclose(float(ce), float(want_ce), rtol=1e-6)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        w = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        scale = float(jnp.max(jnp.abs(w)))  # 1e-9 floor: some gradients are rounding noise (gpt2's key bias)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=max(2e-6 * scale, 1e-9), rtol=0,
                                   err_msg=jax.tree_util.keystr(path))


def test_the_ce_output_has_its_own_gradient():
    """Differentiating the mean cross-entropy (the aux output) alone leaves out the z-loss term."""
    model = importlib.import_module("generated.tiny_llama.cpu.model")
    cfg = model.CONFIGS["tiny_llama"]
    params = model.init_params(cfg, jax.random.key(2))
    tokens = jax.random.randint(jax.random.key(3), (2, 12), 0, cfg.vocab)
    got = jax.grad(lambda p: model.loss_fn(cfg, p, tokens, z_loss=0.5)[1])(params)
    want = jax.grad(lambda p: _plain_loss(model, cfg, p, tokens, 0.0)[1])(params)
    np.testing.assert_allclose(np.asarray(got["head"]), np.asarray(want["head"]), atol=1e-6)


def test_full_logits_never_exist_in_the_train_step():
    """No [B, S, vocab] float32 array in the compiled gradient: only chunk-sized logits."""
    model = importlib.import_module("generated.tiny_llama.cpu.model")
    cfg = model.CONFIGS["tiny_llama"]
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((4, 2 * model.LOSS_CHUNK + 1), jnp.int32)
    cfg = dataclasses.replace(cfg, max_seq=tokens.shape[1])
    hlo = jax.jit(jax.grad(lambda p: model.loss_fn(cfg, p, tokens)[0])).lower(params).as_text()
    full, chunk = (f"tensor<4x{n}x{cfg.vocab}xf32>" for n in (2 * model.LOSS_CHUNK, model.LOSS_CHUNK))
    assert chunk in hlo and full not in hlo


def test_the_chunk_is_the_targets(monkeypatch):
    """A target's profile sets the chunk (cpu's 128 keeps a chunk's logits in cache), and aot's
    estimate of the loss's working set follows it."""
    from dataclasses import replace

    from axdsl.analysis.memory import estimate_memory
    from axdsl.analysis.head import loss_chunk
    from axdsl.targets import profiles

    root = Path(__file__).resolve().parent.parent
    spec = root / "specs" / "llama3_8b.axl"
    assert profiles()["cpu"].loss_chunk == 128 and profiles()["gpu-h100"].loss_chunk == 512
    for target, dirname in (("cpu", "cpu"), ("gpu-h100", "gpu_h100")):
        source = (root / "generated" / "llama3_8b" / dirname / "model.py").read_text()
        assert f"LOSS_CHUNK = {loss_chunk(compile_spec(spec, target).schedule)}  #" in source
    logits = 3 * 4 * 512 * 128256  # a 512-position chunk's float32 logits, softmax and gradient
    small = estimate_memory(compile_spec(spec, "cpu"), "llama3_8b", batch=1, seq=2048)
    monkeypatch.setitem(profiles(), "cpu", replace(profiles()["cpu"], loss_chunk=512))
    large = estimate_memory(compile_spec(spec, "cpu"), "llama3_8b", batch=1, seq=2048)
    assert small.working < logits <= large.working and large.working_kind == "loss"


def _root(spec_text: str, tmp_path):
    path = tmp_path / "m.axl"
    path.write_text('import "std/transformer.axl"\n' + spec_text)
    return compile_spec(path, "cpu").models[0].root


def test_a_head_that_mixes_positions_is_not_split(tmp_path):
    """A tail that reads the sequence length or reduces over positions keeps the plain loss."""
    lm = ("layer LM(vocab: int, dim: int) {\n  child embed = Embedding()\n  param head: [dim, vocab] "
          "axes(embed, vocab) init normal(0.02)\n  forward(tokens: [B, S]) -> [B, S, vocab] {\n"
          "    x = embed(tokens)\n    BODY\n  }\n}\nmodel m = LM { vocab = 64  dim = 16 }\n")
    assert split_head(_root(lm.replace("BODY", "return cast(x @ head, f32)"), tmp_path)).hidden == "x"
    # the split falls after the op that mixes positions
    mixed_first = lm.replace("BODY", "y = x - cumsum(x, over = S)\n    return cast(y @ head, f32)")
    assert split_head(_root(mixed_first, tmp_path)).hidden == "y"
    mixed_last = lm.replace("BODY", "return cast(cumsum(x @ head, over = S), f32)")
    assert split_head(_root(mixed_last, tmp_path)) is None
    reads_s = lm.replace("BODY", "return cast(x @ head, f32) / S")
    assert split_head(_root(reads_s, tmp_path)) is None
