"""Packed rows (std's DecoderLM with `packed = true`): several sequences to a row, told apart by
segment ids. Each sequence's logits equal those of the same weights run on it alone, by the
unpacked model; the KV-cache decode path equals the forward; chat data and token rows number
their sequences; and the conditional inputs the layers are written with are checked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl import cli
from axdsl.runtime import chat_data
from tests.targets_util import import_generated

QUICK = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

SPEC = """\
import "std/deepseek.axl"

model lm = DecoderLM {{
  vocab = 64  dim = 32  layers = 1  heads = 4  kv_heads = 2  ffn = 64  max_seq = 32
  dtype = f32  packed = {packed}
  block = Block(attn = {attn})
}}
train {{ batch = 2  seq = 24  objective = next_token(sep = 5) }}
"""
# std's two attentions that take segment ids: grouped-query (here windowed) and DeepSeek's
# multi-head latent attention (its rotary part a slice of each head, in YaRN's scaling)
ATTENTIONS = {
    "attention": "Attention(window = 9)",
    "mla": "MLAttention(q_rank = 16, kv_rank = 8, nope_dim = 8, rope_dim = 4, v_head_dim = 8, "
    'rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 8)',
}


@pytest.fixture(scope="module", params=sorted(ATTENTIONS))
def models(request, tmp_path_factory):
    """(packed model, its train module, the unpacked model) built for cpu. MLA's unpacked model
    is not built (suite time): its reference is the packed model with one segment to a row."""
    tmp = tmp_path_factory.mktemp("packed")
    built = []
    for packed in ("true", "false") if request.param == "attention" else ("true",):
        spec = tmp / f"lm_{packed}.axl"
        text = SPEC.format(packed=packed, attn=ATTENTIONS[request.param])
        spec.write_text(
            text if packed == "true" else text.replace("next_token(sep = 5)", "next_token()")
        )
        built.append(import_generated(spec, "cpu", tmp))
    if len(built) == 1:
        return built[0][0], built[0][1], None
    return built[0][0], built[0][1], built[1][0]


def test_each_packed_sequence_equals_the_sequence_run_alone(models):
    """A row of three sequences and padding: each sequence's logits are the unpacked model's on
    that sequence alone (attention stays inside it, RoPE positions restart at 0), within 1e-5."""
    packed, _, plain = models
    cfg = packed.CONFIGS["lm"]
    params = packed.init_params(cfg, jax.random.key(0))
    lengths = (7, 12, 3)
    tokens = jax.random.randint(jax.random.key(1), (1, 24), 0, cfg.vocab)
    segments = np.zeros((1, 24), np.int32)
    segments[0, :22] = np.repeat([1, 2, 3], lengths)
    logits = jax.jit(packed.forward, static_argnums=0, compiler_options=QUICK)(
        cfg, params, tokens, jnp.asarray(segments)
    )
    # each sequence alone, in a row of its own padded at the end (causal: the padding is unseen)
    alone = np.zeros((len(lengths), max(lengths)), np.int32)
    starts = np.cumsum((0, *lengths))
    for k, n in enumerate(lengths):
        alone[k, :n] = tokens[0, starts[k] : starts[k] + n]
    if plain is not None:
        want = jax.jit(plain.forward, static_argnums=0, compiler_options=QUICK)(cfg, params, alone)
    else:
        want = jax.jit(packed.forward, static_argnums=0, compiler_options=QUICK)(
            cfg, params, alone, jnp.ones_like(alone)
        )
    for k, n in enumerate(lengths):
        np.testing.assert_allclose(logits[0, starts[k] : starts[k] + n], want[k, :n], atol=1e-5)


def test_the_packed_models_decode_path_equals_its_forward(models):
    """prefill and decode_step (a row is one sequence, segments all 1) give the forward's logits
    at every position."""
    packed, _, _ = models
    cfg = packed.CONFIGS["lm"]
    params = packed.init_params(cfg, jax.random.key(2))
    tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, cfg.vocab)
    want = packed.forward(cfg, params, tokens, jnp.ones_like(tokens))
    logits, cache = packed.prefill(cfg, params, tokens[:, :6], packed.init_cache(cfg, 2, 16))
    np.testing.assert_allclose(logits, want[:, :6], atol=1e-5)
    for pos in range(6, 10):
        step, cache = packed.decode_step(cfg, params, tokens[:, pos], cache, jnp.int32(pos))
        np.testing.assert_allclose(step, want[:, pos], atol=1e-5)


def test_token_rows_number_the_documents_sep_ends(models):
    """train.py's `documents`: next_token(sep = 5) numbers a row's documents 1, 2, ..., each
    sep ending its own."""
    _, train, _ = models
    rows = jnp.asarray([[1, 5, 2, 3, 5, 5, 4], [5, 1, 1, 1, 1, 1, 1]])
    want = [[1, 1, 2, 2, 2, 3, 4], [1, 2, 2, 2, 2, 2, 2]]
    np.testing.assert_array_equal(train.documents(rows, 5), want)
    np.testing.assert_array_equal(train.documents(rows, -1), np.ones_like(want))


def test_chat_rows_pack_conversations_and_keep_every_loss_token():
    """Packed, conversations share rows in order; every assistant token is still a label, and
    a conversation's first token, whose input is another conversation's, is none."""
    encoded = [
        ([1, 2, 3, 4], [0, 0, 1, 1]),
        ([5, 6, 7], [0, 1, 1]),
        ([8, 9, 10, 11, 12], [0, 0, 0, 1, 1]),
    ]
    one, several = (chat_data.chat_rows(encoded, 9, packed) for packed in (False, True))
    assert len(one["tokens"]) == 3 and "segments" not in one
    np.testing.assert_array_equal(
        several["segments"], [[1] * 4 + [2] * 3 + [0] * 2, [1] * 5 + [0] * 4]
    )
    np.testing.assert_array_equal(several["tokens"][0], [1, 2, 3, 4, 5, 6, 7, 0, 0])
    assert several["loss_mask"][:, 1:].sum() == one["loss_mask"][:, 1:].sum() == 6
    encoded[1] = ([5, 6, 7], [1, 1, 1])  # train_on = "all": its first token is still no label
    np.testing.assert_array_equal(chat_data.chat_rows(encoded, 9, True)["loss_mask"][0, 4], 0)


@pytest.mark.parametrize(
    "forward,words",
    [
        (
            "segments: [B, S] if packed) -> [B, S, dim] {\n    return x + segments",
            "input `segments` does not exist for these hyperparameters (its `if` is false)",
        ),
        (
            "segments: [B, S] if packed) -> [B, S, dim] {\n    return softcap(x, 30.0 if packed)",
            "a positional argument of `softcap` cannot be conditional",
        ),
        (
            "segments: [B, S] if 3) -> [B, S, dim] {\n    return x",
            "an `if` condition must be a bool, got int",
        ),
    ],
)
def test_conditional_inputs_and_arguments_are_checked(tmp_path, capsys, forward, words):
    """An input off by its `if` is named where it is read; conditions are bools; a primitive's
    positional operands cannot be conditional (a keyword can)."""
    spec = tmp_path / "c.axl"
    spec.write_text(
        "layer L(dim: int, packed: bool = false) {\n"
        f"  forward(x: [B, S, dim], {forward}\n  }}\n}}\nmodel m = L {{ dim = 8 }}\n"
    )
    assert cli.main(["check", str(spec)]) == 1
    assert words in capsys.readouterr().err
