"""The helpers generated models call, imported from their real source in axdsl/kernels/ and run
against plain jnp/numpy references on tiny shapes; and codegen's copy of them: cut from the
files as text (the definitions a `Source` names), without importing jax."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.kernels import (
    attention,
    conv,
    dense,
    dropout,
    losses,
    mesh,
    moe,
    positions,
    quantized,
    rope,
    splash,
    ssd,
    vjp_blocks,
)

ROOT = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(0)


def _normal(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _reference_attention(q, k, v, causal: bool, window: int | None = None):
    """Plain attention, kv heads repeated to the query heads, float32."""
    heads, kv_heads = q.shape[2], k.shape[2]
    k, v = (jnp.repeat(t, heads // kv_heads, axis=2) for t in (k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    seq = q.shape[1]
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    keep = np.ones((seq, seq), bool)
    if causal:
        keep &= j <= i
    if window:
        keep &= j > i - window
    logits = jnp.where(keep, logits, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)


def test_einsum_and_vjp_attention_match_plain_attention_and_its_gradient():
    q, k, v = _normal(2, 8, 4, 3), _normal(2, 8, 2, 3), _normal(2, 8, 2, 5)
    want = _reference_attention(q, k, v, causal=True, window=3)
    got = attention.einsum_attention(q, k, v, causal=True, window=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        attention.vjp_attention(q, k, v, True, 3), want, rtol=1e-5, atol=1e-5
    )

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))

    ref = jax.grad(loss(lambda q, k, v: _reference_attention(q, k, v, True)), (0, 1, 2))(q, k, v)
    got = jax.grad(loss(lambda q, k, v: attention.vjp_attention(q, k, v, True)), (0, 1, 2))(q, k, v)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cached_attention_decodes_what_attention_over_the_sequence_computes():
    q, k, v = _normal(1, 6, 2, 4), _normal(1, 6, 2, 4), _normal(1, 6, 2, 4)
    full = _reference_attention(q, k, v, causal=True)
    cache_k = cache_v = jnp.zeros((1, 8, 2, 4))
    out, cache_k, cache_v = attention.cached_attention(
        q[:, :4], k[:, :4], v[:, :4], cache_k, cache_v, 0
    )
    np.testing.assert_allclose(out, full[:, :4], rtol=1e-5, atol=1e-5)
    for pos in (4, 5):  # then one token at a time
        sl = slice(pos, pos + 1)
        out, cache_k, cache_v = attention.cached_attention(
            q[:, sl], k[:, sl], v[:, sl], cache_k, cache_v, jnp.int32(pos)
        )
        np.testing.assert_allclose(out, full[:, sl], rtol=1e-5, atol=1e-5)


def test_vjp_blocks_cover_each_query_s_keys():
    assert vjp_blocks._vjp_attention_blocks(16, 16, False, None) == [(0, 16, 0, 16)]
    blocks = vjp_blocks._vjp_attention_blocks(1024, 1024, True, None)
    assert len(blocks) == 8 and blocks[0] == (0, 128, 0, 128) and blocks[-1][1:] == (1024, 0, 1024)


def test_splash_attention_in_interpret_mode_matches_plain_attention(monkeypatch):
    monkeypatch.setattr(splash, "PALLAS_INTERPRET", True)
    q, k, v = (_normal(1, 128, 2, 8) for _ in range(3))
    got = splash.splash_attention(q, k, v, causal=True, window=None)
    np.testing.assert_allclose(got, _reference_attention(q, k, v, True), rtol=2e-3, atol=2e-3)
    assert mesh.dividing_axes(
        jax.sharding.AbstractMesh((2, 4), ("data", "model")), ("data", "model"), 4
    ) == ("data",)


def test_ssd_matches_the_sequential_recurrence():
    batch, seq, heads, dim, state = 1, 6, 2, 3, 4
    x, b, c = (
        _normal(batch, seq, heads, dim),
        _normal(batch, seq, 1, state),
        _normal(batch, seq, 1, state),
    )
    dt = jax.nn.softplus(_normal(batch, seq, heads))
    a = -jnp.exp(_normal(heads))
    h = np.zeros((batch, heads, dim, state), np.float32)
    want = []
    for t in range(seq):  # state = exp(dt a) state + dt x b^T; y = state c
        decay = np.exp(dt[:, t] * a)[..., None, None]
        h = decay * h + np.einsum("bh,bhp,bn->bhpn", dt[:, t], x[:, t], b[:, t, 0])
        want.append(np.einsum("bhpn,bn->bhp", h, c[:, t, 0]))
    got = ssd.ssd(x, dt, a, b, c, chunk=4)
    np.testing.assert_allclose(got, np.stack(want, axis=1), rtol=1e-4, atol=1e-5)


def test_quantized_einsums_are_close_to_the_float_einsum_and_differentiate():
    x, w = _normal(4, 16), _normal(16, 8)
    exact = jnp.einsum("ab,bc->ac", x, w)
    for f, tol in ((quantized.fp8_einsum, 0.1), (quantized.int8_einsum, 0.05)):
        got = f("ab,bc->ac", x, w)
        assert float(jnp.max(jnp.abs(got - exact)) / jnp.max(jnp.abs(exact))) < tol
        grad = jax.grad(lambda x, f=f: jnp.sum(f("ab,bc->ac", x, w)))(x)
        want = jnp.broadcast_to(jnp.sum(w, axis=1), x.shape)  # d/dx of sum(x @ w)
        assert float(jnp.max(jnp.abs(grad - want)) / jnp.max(jnp.abs(want))) < tol
    assert quantized._summed_axes("abc", "ac") == (-2,)  # counted from the end


def test_rope_variants_agree_and_rotate_by_position():
    x = _normal(1, 5, 2, 8)
    plain = rope.apply_rope(x, 10000.0)
    np.testing.assert_allclose(
        rope.apply_rotary(x, rope.rope_frequencies(8, 10000.0)), plain, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(plain[:, 0], x[:, 0], rtol=1e-6)  # position 0 is not rotated
    half = np.asarray(x[0, 1, 0])  # position 1, lowest frequency 1: a rotation by 1 radian
    want0 = half[0] * np.cos(1.0) - half[4] * np.sin(1.0)
    np.testing.assert_allclose(plain[0, 1, 0, 0], want0, rtol=1e-5)
    np.testing.assert_allclose(
        rope.apply_rope(x[:, 2:3], 10000.0, offset=2), plain[:, 2:3], rtol=1e-5, atol=1e-6
    )
    base = rope.rope_frequencies(8, 500000.0)  # wavelengths 6.3 (kept) .. 1.2e5 (> 8192: scaled)
    scaled = rope.llama3_frequencies(8, 500000.0, 8.0, 1.0, 4.0, 8192)
    assert scaled[0] == base[0] and np.isclose(scaled[-1], base[-1] / 8)
    assert rope.yarn_attention_factor(1.0) == 1.0


def test_moe_routers_and_dispatch_paths_agree_with_a_per_token_reference():
    """Both routers pick each token's top-k experts (the DeepSeek one, without its options, as
    the softmax one does); the Switch loss is experts x sum(load x importance); both dispatch
    paths (and moe_dispatch, which picks one) equal every token run through its chosen experts
    when nothing is dropped; and balancing leaves y and gives the bias the load surplus."""
    batch, seq, dim, hidden, experts, top_k = 1, 4, 3, 5, 4, 2
    x = _normal(batch, seq, dim)
    w_gate, w_up, w_down = (
        _normal(experts, dim, hidden),
        _normal(experts, dim, hidden),
        _normal(experts, hidden, dim),
    )
    logits = _normal(batch, seq, experts)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, chosen, aux = moe.moe_route(logits, top_k, False, 1.0, 0.0)
    want_weights, want_chosen = jax.lax.top_k(probs, top_k)
    np.testing.assert_array_equal(chosen, want_chosen)
    np.testing.assert_array_equal(weights, want_weights)
    load = np.bincount(np.asarray(chosen).reshape(-1), minlength=experts) / (batch * seq * top_k)
    want_aux = experts * np.sum(load * np.asarray(probs).mean(axis=(0, 1)))
    np.testing.assert_allclose(aux, want_aux, rtol=1e-5)
    plain = moe.moe_route_deepseek(logits, top_k, False, 1.0, 0.0, "softmax", 1, 1, 1.0)
    for a, b in zip(plain, (weights, chosen, aux), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    want = sum(  # every token through its chosen experts, one at a time
        weights[..., j, None]
        * jnp.einsum(
            "bsh,bshd->bsd",
            jax.nn.silu(jnp.einsum("bsd,bsdh->bsh", x, w_gate[chosen[..., j]]))
            * jnp.einsum("bsd,bsdh->bsh", x, w_up[chosen[..., j]]),
            w_down[chosen[..., j]],
        )
        for j in range(top_k)
    )
    routed = (x, weights, chosen, w_gate, w_up, w_down)
    for got in (
        moe.moe_dropless(*routed),
        moe.moe_with_capacity(*routed, 4.0),
        moe.moe_dispatch(*routed, 0.0),
        moe.moe_dispatch(*routed, 4.0),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    bias = jnp.zeros(experts)
    np.testing.assert_array_equal(moe.moe_balance(x, bias, chosen), x)
    bias_grad = jax.grad(lambda b: jnp.sum(moe.moe_balance(x, b, chosen)))(bias)
    surplus = np.bincount(np.asarray(chosen).reshape(-1), minlength=experts)
    np.testing.assert_allclose(bias_grad, surplus - surplus.mean())


def test_dense_is_tensordot_with_its_gradients():
    x, w = _normal(2, 3, 4, 5), _normal(4, 5, 6)
    np.testing.assert_allclose(dense.dense(x, w, 2), jnp.tensordot(x, w, 2), rtol=1e-5, atol=1e-5)
    got = jax.grad(lambda x, w: jnp.sum(jnp.sin(dense.dense(x, w, 2))), (0, 1))(x, w)
    want = jax.grad(lambda x, w: jnp.sum(jnp.sin(jnp.tensordot(x, w, 2))), (0, 1))(x, w)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_small_helpers():
    segments = jnp.array([[1, 1, 2, 2, 2, 0]])
    np.testing.assert_array_equal(positions.segment_positions(segments), [[0, 1, 0, 1, 2, 0]])
    x, w, b = _normal(1, 5, 2), _normal(3, 2), _normal(2)
    padded = np.concatenate([np.zeros((1, 2, 2), np.float32), np.asarray(x)], axis=1)
    want = sum(padded[:, k : k + 5] * np.asarray(w)[k] for k in range(3)) + np.asarray(b)
    np.testing.assert_allclose(conv.causal_conv1d(x, w, b), want, rtol=1e-5, atol=1e-5)
    logits, labels = _normal(3, 7), jnp.array([0, 6, 2])
    want_ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(losses.cross_entropy(logits, labels), want_ce, rtol=1e-5, atol=1e-6)
    ones = jnp.ones((1000,))
    assert dropout.dropout(ones, 0.5, None) is ones
    dropped = dropout.dropout(ones, 0.5, jax.random.key(0))
    assert (
        set(np.unique(np.asarray(dropped))) <= {0.0, 2.0} and 400 < int(jnp.sum(dropped > 0)) < 600
    )
    assert dropout._fold(None, 3) is None


def test_helper_sources_are_cut_from_the_kernel_files_without_jax():
    """Every helper's copied text defines what its Source names and parses; building them all
    imports no jax or numpy."""
    code = (
        "import sys\n"
        "from axdsl import primitives\n"
        "from axdsl.codegen import helpers\n"
        "sources, _ = helpers.select(set(primitives.HELPERS))\n"
        "assert 'jax' not in sys.modules and 'numpy' not in sys.modules, 'imported jax'\n"
        "print(repr(sources))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True
    )
    sources = ast.literal_eval(out.stdout)
    from axdsl import primitives
    from axdsl.codegen import helpers
    from axdsl.primitives.base import Source

    assert len(sources) == len(primitives.HELPERS)
    for helper in primitives.HELPERS.values():
        code = helper.code_for(frozenset(primitives.HELPERS))
        parts = [code] if isinstance(code, Source) else code if isinstance(code, tuple) else []
        text = helpers.source_text(code)
        defined = {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
        for part in parts:
            assert set(n for n in part.names if not n.isupper()) <= defined, helper.name
    with pytest.raises(AssertionError, match="defines no"):
        helpers.kernel_source(Source("rope", ("no_such_function",)))


def test_every_helper_declares_exactly_the_imports_its_source_uses():
    """kernels.py holds only helpers, so an import a helper declares but does not use is an
    unused import there (the generated-code check refuses it), and one it uses but does not
    declare is a NameError."""
    from axdsl import primitives
    from axdsl.codegen.helpers import source_text

    for name, helper in sorted(primitives.HELPERS.items()):
        tree = ast.parse(source_text(helper.code_for(frozenset({name}))))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        bound = {line.split()[-1] for line in helper.imports}
        assert bound <= used, (name, sorted(bound - used))
