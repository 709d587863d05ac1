"""`repeat`: scanned blocks with side inputs, layer patterns and prefixes, each checked against an
unrolled float64 numpy reference, and the generated code holding one `jax.lax.scan` per repeat."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.analysis.memory import estimate_memory
from axdsl.ir.nodes import RematKind, RematPolicy
from axdsl.pipeline import compile_spec
from axdsl.stats import model_stats
from tests.targets_util import import_generated

CROSS = """\
# A decoder whose repeated block reads the encoder's memory: x is carried, mem is a side input.
layer CrossBlock(dim: int, heads: int, head_dim: int = dim / heads) {
  param wq: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wk: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wv: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wo: [heads, head_dim, dim] axes(heads, head_dim, embed) init normal(0.2)
  param w1: [dim, dim] axes(embed, mlp) init normal(0.2)
  forward(x: [B, S, dim], mem: [B, T, dim]) -> [B, S, dim] {
    o = attention(x @ wq, mem @ wk, mem @ wv, causal = false)
    x = x + einsum("B S heads head_dim, heads head_dim dim -> B S dim", o, wo)
    return x + silu(x @ w1)
  }
}

layer CrossDecoder(dim: int, heads: int, layers: int) {
  child blocks = repeat(layers, CrossBlock())
  forward(x: [B, S, dim], mem: [B, T, dim]) -> [B, S, dim] {
    return blocks(x, mem * 0.5)
  }
}
model cross = CrossDecoder { dim = 8  heads = 2  layers = 3 }
"""


DECODING = (
    "# ----------------------------------------------------------------------------- decoding"
)


def _build(tmp: Path, name: str, source: str):
    """(generated model module, its source up to the loss) of `source` built for cpu.

    An LM's decode path runs the same layer functions over new tokens; the root's scans over
    stacked layers get a decode form (under `else:`, carrying the cache) that scans as often. A
    test that counts scans counts the training forward's (`_train_scans`: the layers, not the
    loss's scan over chunks of positions), and this checks the decode forms have as many."""
    spec = tmp / f"{name}.axl"
    spec.write_text(source, encoding="utf-8")
    model, _ = import_generated(spec, "cpu", tmp)
    code = Path(model.__file__).read_text(encoding="utf-8")
    forward = code.partition(DECODING)[0]
    forward = forward.split("\ndef loss_fn(")[0].split("\nHEAD_PARAMS = ")[0]
    if DECODING in code:
        assert _decode_scans(forward) == _train_scans(forward)
    return model, forward


def _decode_scans(code: str) -> int:
    """Scans of the decode path: they carry a part of the cache out."""
    return len(re.findall(r"new_cache\[[^]]*\] = jax\.lax\.scan\(", code))


def _train_scans(code: str) -> int:
    return code.count("jax.lax.scan(") - _decode_scans(code)


def _np(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _cross_block(p, x, mem):
    q = np.einsum("bsd,dhk->bshk", x, p["wq"])
    k = np.einsum("btd,dhk->bthk", mem, p["wk"])
    v = np.einsum("btd,dhk->bthk", mem, p["wv"])
    w = _softmax(np.einsum("bshk,bthk->bhst", q, k) / np.sqrt(q.shape[-1]))
    o = np.einsum("bhst,bthk->bshk", w, v)
    x = x + np.einsum("bshk,hkd->bsd", o, p["wo"])
    return x + _silu(x @ p["w1"])


def _layer(stacked: dict, i: int) -> dict:
    return jax.tree.map(lambda a: a[i], stacked)


def test_a_repeated_block_takes_a_side_input(tmp_path):
    model, code = _build(tmp_path, "cross", CROSS)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 5, 8), jnp.float32)
    mem = jax.random.normal(jax.random.key(2), (2, 7, 8), jnp.float32)
    got = jax.jit(lambda p, x, m: model.forward(cfg, p, x, m))(params, x, mem)
    ref, p, m = np.asarray(x, np.float64), _np(params), np.asarray(mem, np.float64) * 0.5
    for i in range(3):
        ref = _cross_block(_layer(p["blocks"], i), ref, m)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 1
    assert "blocks_in = mem * 0.5" in code  # computed once, before the scan, and closed over


# The same decoder as a pattern: layer i uses 2 heads when i is even, 1 when odd; the side input
# is named like a local of the scan step (`h`), so the step must not shadow it.
CROSS_PATTERN = (
    CROSS.replace(
        "child blocks = repeat(layers, CrossBlock())",
        "child blocks = repeat(layers, [CrossBlock(), CrossBlock(heads = 1)])",
    )
    .replace("return blocks(x, mem * 0.5)", "h = mem * 0.5\n    return blocks(x, h)")
    .replace("layers = 3", "layers = 4")
)


def test_a_pattern_takes_side_inputs(tmp_path):
    model, code = _build(tmp_path, "cross_pattern", CROSS_PATTERN)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    assert params["blocks"]["1"]["wq"].shape == (2, 8, 1, 8)  # groups=2, heads=1, head_dim=8
    x = jax.random.normal(jax.random.key(1), (2, 5, 8), jnp.float32)
    mem = jax.random.normal(jax.random.key(2), (2, 7, 8), jnp.float32)
    got = jax.jit(lambda p, x, m: model.forward(cfg, p, x, m))(params, x, mem)
    ref, p, m = np.asarray(x, np.float64), _np(params), np.asarray(mem, np.float64) * 0.5
    for i in range(4):
        ref = _cross_block(_layer(p["blocks"][str(i % 2)], i // 2), ref, m)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 1
    assert "blocks_in = h" in code and "blocks_pattern(cfg, layer_params, h, blocks_in)" in code


ALTERNATING = """\
import "std/transformer.axl"

# Layer i runs pattern[i % 2]: local (sliding-window) attention, then global.
model alt = DecoderLM {
  vocab = 64  dim = 16  layers = 6  heads = 2  ffn = 32  max_seq = 32  dtype = f32
  block = [Block(attn = Attention(window = 3)), Block()]
}
"""

# The same model written out layer by layer: no repeat, no scan.
UNROLLED = """\
import "std/transformer.axl"

layer Unrolled(vocab: int, dim: int, heads: int, ffn: int, dtype: dtype = f32, param_dtype: dtype = f32) {
  child embed = Embedding()
  child b0 = Block(attn = Attention(window = 3))
  child b1 = Block()
  child b2 = Block(attn = Attention(window = 3))
  child b3 = Block()
  child b4 = Block(attn = Attention(window = 3))
  child b5 = Block()
  child final_norm = RMSNorm()
  param head: [dim, vocab] axes(embed, vocab)
  forward(tokens: [B, S]) -> [B, S, vocab] {
    x = embed(tokens)
    x = b5(b4(b3(b2(b1(b0(x))))))
    return final_norm(x) @ head
  }
}
model unrolled = Unrolled { vocab = 64  dim = 16  heads = 2  ffn = 32 }
"""


def _tokens(shape=(2, 12)):
    return jax.random.randint(jax.random.key(3), shape, 0, 64)


def test_an_alternating_pattern_is_one_scan_and_matches_the_unrolled_model(tmp_path):
    model, code = _build(tmp_path, "alt", ALTERNATING)
    ref_model, ref_code = _build(tmp_path, "unrolled", UNROLLED)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    assert set(params["blocks"]) == {"0", "1"}  # blocks/0/..., blocks/1/..., each stacked 3 deep
    assert params["blocks"]["0"]["attn"]["wq"].shape == (3, 16, 2, 8)
    ref_params = {k: v for k, v in params.items() if k != "blocks"}
    for i in range(6):
        ref_params[f"b{i}"] = _layer(params["blocks"][str(i % 2)], i // 2)
    tokens = _tokens()
    got = jax.jit(lambda p, t: model.forward(cfg, p, t))(params, tokens)
    want = ref_model.forward(ref_model.Config(), ref_params, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 1 and "jax.lax.scan(" not in ref_code
    assert (
        "vjp_attention(q, k, v, causal=True, window=3)" in code
    )  # the local layers' static window
    # The window matters: a model of only global layers computes something else.
    only_global = _layer_swap(params)
    assert not np.allclose(np.asarray(model.forward(cfg, only_global, tokens)), np.asarray(got))


def _layer_swap(params: dict) -> dict:
    """The alternating model's parameters with its two pattern elements swapped."""
    blocks = dict(params["blocks"])
    blocks["0"], blocks["1"] = blocks["1"], blocks["0"]
    return {**params, "blocks": blocks}


def test_pattern_init_is_by_path_and_parameter_counts_are_exact(tmp_path):
    model, _ = _build(tmp_path, "alt", ALTERNATING)
    ref_model, _ = _build(tmp_path, "unrolled", UNROLLED)
    cfg = model.Config()
    a = model.init_params(cfg, jax.random.key(0))
    b = model.init_params(cfg, jax.random.key(0))
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert not np.allclose(a["blocks"]["0"]["attn"]["wq"], a["blocks"]["1"]["attn"]["wq"])
    count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
    assert count(a) == count(ref_model.init_params(ref_model.Config(), jax.random.key(0)))
    stats, ref_stats = (
        model_stats(compile_spec(tmp_path / f"{n}.axl", "cpu").models[0], seq=12, batch=2)
        for n in ("alt", "unrolled")
    )
    assert stats.total_params == ref_stats.total_params == count(a)
    assert stats.flops_per_token == ref_stats.flops_per_token
    memory = estimate_memory(compile_spec(tmp_path / "alt.axl", "cpu"), batch=2, seq=12)
    assert memory.layers == 6  # 3 scan steps of 2 layers


# DeepSeek's layout: the first layers dense, the rest mixture-of-experts; two repeat children.
PREFIX = """\
import "std/transformer.axl"

layer DenseThenMoE(vocab: int, dim: int, layers: int, dense_layers: int, heads: int, ffn: int,
                   dtype: dtype = f32, param_dtype: dtype = f32) {
  child embed = Embedding()
  child dense = repeat(dense_layers, Block())
  child moe = repeat(layers - dense_layers, Block(mlp = MoE(hidden = 8, experts = 4, capacity_factor = 0.0, shared = 1)))
  child final_norm = RMSNorm()
  param head: [dim, vocab] axes(embed, vocab)
  forward(tokens: [B, S]) -> [B, S, vocab] {
    x = dense(embed(tokens))
    x = moe(x)
    return final_norm(x) @ head
  }
}
model ds = DenseThenMoE { vocab = 64  dim = 16  layers = 4  dense_layers = 1  heads = 2  ffn = 32 }
"""

PREFIX_UNROLLED = """\
import "std/transformer.axl"

layer Unrolled(vocab: int, dim: int, heads: int, ffn: int, dtype: dtype = f32, param_dtype: dtype = f32) {
  child embed = Embedding()
  child d0 = Block()
  child m0 = Block(mlp = MoE(hidden = 8, experts = 4, capacity_factor = 0.0, shared = 1))
  child m1 = Block(mlp = MoE(hidden = 8, experts = 4, capacity_factor = 0.0, shared = 1))
  child m2 = Block(mlp = MoE(hidden = 8, experts = 4, capacity_factor = 0.0, shared = 1))
  child final_norm = RMSNorm()
  param head: [dim, vocab] axes(embed, vocab)
  forward(tokens: [B, S]) -> [B, S, vocab] {
    return final_norm(m2(m1(m0(d0(embed(tokens)))))) @ head
  }
}
model unrolled = Unrolled { vocab = 64  dim = 16  heads = 2  ffn = 32 }
"""


def test_dense_layers_then_moe_layers_are_two_scans(tmp_path):
    model, code = _build(tmp_path, "ds", PREFIX)
    ref_model, _ = _build(tmp_path, "ds_unrolled", PREFIX_UNROLLED)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    assert (
        params["dense"]["attn"]["wq"].shape[0] == 1 and params["moe"]["mlp"]["w_up"].shape[0] == 3
    )
    ref_params = {k: v for k, v in params.items() if k not in ("dense", "moe")}
    ref_params["d0"] = _layer(params["dense"], 0)
    for i in range(3):
        ref_params[f"m{i}"] = _layer(params["moe"], i)
    batch = jax.random.randint(jax.random.key(3), (2, 13), 0, 64)
    loss, ce = jax.jit(lambda p, b: model.loss_fn(cfg, p, b))(params, batch)
    ref_loss, ref_ce = ref_model.loss_fn(ref_model.Config(), ref_params, batch)
    np.testing.assert_allclose([loss, ce], [ref_loss, ref_ce], rtol=1e-5, atol=1e-6)
    assert loss > ce  # the MoE layers' auxiliary losses leave both scans
    assert _train_scans(code) == 2


# A pattern whose layers differ in kind: a windowed layer with dropout, then an MoE layer.
MIXED = """\
import "std/transformer.axl"

model mixed = DecoderLM {
  vocab = 256  dim = 64  layers = 4  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64  dtype = f32
  block = [Block(attn = Attention(window = 5), dropout = 0.1), Block(mlp = MoE(hidden = 32, experts = 4))]
}
train { batch = 8  seq = 16 }
target "*" { quantize(none) }
"""


def _loss_and_grads(model, cfg, params, batch, mesh=None):
    fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(cfg, p, batch)[0]))
    if mesh is None:
        return fn(params)
    with jax.set_mesh(mesh):
        return fn(params)


def test_a_mixed_pattern_trains_and_every_schedule_computes_the_same(tmp_path):
    """Dropout keys and auxiliary losses pass through the pattern's scan; a GPU schedule
    (sharding over 8 fake devices, remat) changes how it runs, not what it computes."""
    spec = tmp_path / "mixed.axl"
    spec.write_text(MIXED, encoding="utf-8")
    ref, _ = import_generated(spec, "cpu", tmp_path)
    remat = (
        tmp_path / "mixed_remat.axl"
    )  # fit_remat keeps everything of so small a step: ask for full
    remat.write_text(
        MIXED.replace(
            'target "*" { quantize(none) }', 'target "gpu*" { quantize(none) remat(full) }'
        ),
        encoding="utf-8",
    )
    gpu, _ = import_generated(remat, "gpu-h100-8", tmp_path)
    cfg = ref.Config()
    params = ref.init_params(cfg, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (8, 17), 0, 256)
    loss, grads = _loss_and_grads(ref, cfg, params, batch)
    _, ce = ref.loss_fn(cfg, params, batch)
    assert loss > ce  # the MoE layers' auxiliary loss
    gpu_loss, gpu_grads = _loss_and_grads(gpu, cfg, params, batch, gpu.make_mesh())
    np.testing.assert_allclose(float(gpu_loss), float(loss), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(gpu_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)
    dropped, _ = ref.loss_fn(
        cfg, params, batch, rng=jax.random.key(2)
    )  # dropout keys reach the scan
    assert np.isfinite(float(dropped)) and float(dropped) != float(loss)
    assert "REMAT_POLICY" in Path(gpu.__file__).read_text()


# ----------------------------------------------------------------------------- scan over time
RNN = """\
# A minimal gated recurrent cell, run along the sequence with `scan`; the carry starts at zeros.
layer MinGRU(dim: int) {
  param wz: [dim, dim] axes(embed, mlp) init normal(0.3)
  param wh: [dim, dim] axes(embed, mlp) init normal(0.3)
  forward(h: [B, dim], x: [B, dim]) -> [B, dim] {
    z = sigmoid(x @ wz)
    return (1.0 - z) * h + z * tanh(x @ wh)
  }
}

# A linear state-space recurrence with two inputs per step, time-major, from a given state.
layer Linear2(dim: int, state: int) {
  param a: [state, state] axes(embed, mlp) init normal(0.2)
  param b: [dim, state] axes(embed, mlp) init normal(0.2)
  forward(h: [B, state], x: [B, dim], g: [B, dim]) -> [B, state] {
    return h @ a + (x * g) @ b
  }
}

layer Recurrent(dim: int, state: int) {
  child cell = MinGRU()
  child ssm = Linear2()
  forward(x: [B, S, dim], h0: [B, state]) -> [B, S, state] {
    y = x + scan(cell, x, over = S)
    t = einsum("B S dim -> S B dim", y)
    return einsum("S B state -> B S state", scan(ssm, t, t, over = S, init = h0))
  }
}
model rec = Recurrent { dim = 4  state = 3 }
"""


def test_scan_over_time_matches_a_python_loop(tmp_path):
    model, code = _build(tmp_path, "rec", RNN)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 6, 4), jnp.float32)
    h0 = jax.random.normal(jax.random.key(2), (2, 3), jnp.float32)
    got = jax.jit(lambda p, x, h: model.forward(cfg, p, x, h))(params, x, h0)
    p, xn = _np(params), np.asarray(x, np.float64)
    h, ys = np.zeros((2, 4)), []
    for t in range(6):
        z = 1.0 / (1.0 + np.exp(-xn[:, t] @ p["cell"]["wz"]))
        h = (1.0 - z) * h + z * np.tanh(xn[:, t] @ p["cell"]["wh"])
        ys.append(h)
    y = xn + np.stack(ys, axis=1)
    s, out = np.asarray(h0, np.float64), []
    for t in range(6):
        s = s @ p["ssm"]["a"] + (y[:, t] * y[:, t]) @ p["ssm"]["b"]
        out.append(s)
    np.testing.assert_allclose(np.asarray(got), np.stack(out, axis=1), rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 2
    grads = jax.grad(lambda p: model.forward(cfg, p, x, h0).sum())(params)
    assert all(
        np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0
        for g in jax.tree.leaves(grads)
    )


CONTEXT_RNN = """\
# A cell that reads, besides its step of x, a per-sequence context passed whole to every step, and
# drops out its input in training.
layer CtxCell(dim: int) {
  param wh: [dim, dim] axes(embed, mlp) init normal(0.3)
  param wc: [dim, dim] axes(embed, mlp) init normal(0.3)
  forward(h: [B, dim], x: [B, dim], ctx: [B, dim]) -> [B, dim] {
    return tanh(h @ wh + dropout(x, 0.5) + ctx @ wc)
  }
}

layer CtxRNN(dim: int) {
  child cell = CtxCell()
  forward(x: [B, S, dim], ctx: [B, dim]) -> [B, S, dim] {
    return scan(cell, x, ctx, over = S)
  }
}
model ctx = CtxRNN { dim = 4 }
"""


def test_scan_passes_a_side_input_to_every_step_and_folds_dropout_keys_per_step(tmp_path):
    model, code = _build(tmp_path, "ctx", CONTEXT_RNN)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    x = jnp.ones((2, 6, 4), jnp.float32)  # every step the same input: only the keys differ
    ctx = jax.random.normal(jax.random.key(2), (2, 4), jnp.float32)
    got = np.asarray(model.forward(cfg, params, x, ctx))  # no rng: dropout is off
    p, h, ys = _np(params), np.zeros((2, 4)), []
    for t in range(6):
        h = np.tanh(h @ p["cell"]["wh"] + 1.0 + np.asarray(ctx, np.float64) @ p["cell"]["wc"])
        ys.append(h)
    np.testing.assert_allclose(got, np.stack(ys, axis=1), rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 1 and "xs_t[-1]" in code  # the step index folds the key

    def dropped(key):
        # x * mask / 0.5 at each step: recover each step's mask from the pre-activation difference
        return np.asarray(model.forward(cfg, params, x, ctx, rng=key))

    a, b = dropped(jax.random.key(3)), dropped(jax.random.key(3))
    assert np.array_equal(a, b) and not np.allclose(a, got)
    first, second = dropped(jax.random.key(3)), dropped(jax.random.key(4))
    assert not np.allclose(first, second)
    # steps draw their own masks: with the carry and the context fixed, a one-step model would
    # repeat its mask; here two steps of one row differ in which inputs were dropped
    grads = jax.grad(lambda x: model.forward(cfg, params, x, ctx, rng=jax.random.key(3)).sum())(x)
    kept = np.asarray(grads) != 0  # a dropped input gets no gradient
    assert not all(np.array_equal(kept[0, 0], kept[0, t]) for t in range(1, 6))


def _unrolled_spec(kinds: list[str]) -> str:
    """A DecoderLM-like model written out layer by layer: child b<i> is `kinds[i]`, no scan."""
    children = "\n".join(f"  child b{i} = {kind}" for i, kind in enumerate(kinds))
    chain = "x"
    for i in range(len(kinds)):
        chain = f"b{i}({chain})"
    return f"""\
import "std/transformer.axl"

layer Unrolled(vocab: int, dim: int, heads: int, ffn: int, dtype: dtype = f32, param_dtype: dtype = f32) {{
  child embed = Embedding()
{children}
  child final_norm = RMSNorm()
  param head: [dim, vocab] axes(embed, vocab)
  forward(tokens: [B, S]) -> [B, S, vocab] {{
    x = embed(tokens)
    return final_norm({chain}) @ head
  }}
}}
model unrolled = Unrolled {{ vocab = 64  dim = 16  heads = 2  ffn = 32 }}
"""


LOCAL = "Block(attn = Attention(window = 3))"

# Gemma's layout: local, local, global, ...; 7 layers are 2 whole patterns and one more layer.
REMAINDER = f"""\
import "std/transformer.axl"

model gem = DecoderLM {{
  vocab = 64  dim = 16  layers = 7  heads = 2  ffn = 32  max_seq = 32  dtype = f32
  block = [{LOCAL}, {LOCAL}, Block()]
}}
"""


def test_a_pattern_that_does_not_divide_the_count_runs_its_remainder_after_the_scan(tmp_path):
    model, code = _build(tmp_path, "gem", REMAINDER)
    kinds = [LOCAL, LOCAL, "Block()"] * 2 + [LOCAL]
    ref_model, _ = _build(tmp_path, "gem_unrolled", _unrolled_spec(kinds))
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    assert set(params["blocks"]) == {"groups", "tail"} and set(params["blocks"]["tail"]) == {"0"}
    assert params["blocks"]["groups"]["2"]["attn"]["wq"].shape[0] == 2
    ref_params = {k: v for k, v in params.items() if k != "blocks"}
    for i in range(6):
        ref_params[f"b{i}"] = _layer(params["blocks"]["groups"][str(i % 3)], i // 3)
    ref_params["b6"] = params["blocks"]["tail"]["0"]
    tokens = _tokens()
    got = jax.jit(lambda p, t: model.forward(cfg, p, t))(params, tokens)
    want = ref_model.forward(ref_model.Config(), ref_params, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert _train_scans(code) == 1
    stats = model_stats(compile_spec(tmp_path / "gem.axl", "cpu").models[0], seq=12, batch=2)
    ref_stats = model_stats(
        compile_spec(tmp_path / "gem_unrolled.axl", "cpu").models[0], seq=12, batch=2
    )
    assert (
        stats.total_params == ref_stats.total_params
        and stats.flops_per_token == ref_stats.flops_per_token
    )


def test_pattern_arithmetic_writes_the_same_model_as_the_pattern_written_out(tmp_path):
    """`[A] * 2 + [B]` is the pattern [A, A, B]: the same generated layer code and parameters."""
    from axdsl.build import build_files

    written = REMAINDER
    short = REMAINDER.replace(
        f"block = [{LOCAL}, {LOCAL}, Block()]", f"block = [{LOCAL}] * 2 + [Block()]"
    )
    assert short != written
    codes = []
    for name, text in (("written", written), ("short", short)):
        spec = tmp_path / f"{name}.axl"
        spec.write_text(text, encoding="utf-8")
        code = build_files(spec, "cpu")["model.py"]
        codes.append(
            [line for line in code.splitlines() if "sha256" not in line and ".axl" not in line]
        )  # the spec's name, hash and lines
    assert codes[0] == codes[1]


def _bf16_casts(jaxpr) -> list:
    """The operands of the f32 -> bf16 casts at the top level of a jaxpr (not in a scan)."""
    return [
        e.invars[0]
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type"
        and e.params["new_dtype"] == jnp.bfloat16
        and e.invars[0].aval.dtype == jnp.float32
    ]


def test_a_mixed_precision_pattern_with_a_remainder_casts_one_group_at_a_time(tmp_path):
    """bf16 compute over f32 master weights: the scanned groups of a pattern are cast inside the
    scan step, one group at a time, and the tail after it (not the whole stack up front); the
    memory model counts one group's copy, and the result is the f32 model's within bf16 error."""
    mixed = REMAINDER.replace("dtype = f32", "dtype = bf16  param_dtype = f32")
    model, _ = _build(tmp_path, "gem_mixed", mixed)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    tokens = _tokens()
    grad = jax.make_jaxpr(jax.grad(lambda p: jnp.mean(model.forward(cfg, p, tokens))))(params)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    by_var = {v: jax.tree_util.keystr(k) for v, (k, _) in zip(grad.jaxpr.invars, leaves)}
    cast = {by_var[v] for v in _bf16_casts(grad.jaxpr) if v in by_var}
    assert any("'tail'" in k for k in cast) and any("'embed'" in k for k in cast), cast
    assert not [k for k in cast if "'groups'" in k], cast  # no stacked weight is cast whole
    steps = [e.params["jaxpr"].jaxpr for e in grad.jaxpr.eqns if e.primitive.name == "scan"]
    assert any(_bf16_casts(step) for step in steps)  # the groups' weights, one group per step
    f32_model, _ = _build(tmp_path, "gem_f32", REMAINDER)
    want = f32_model.forward(f32_model.Config(), params, tokens)
    got = jax.jit(lambda p, t: model.forward(cfg, p, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.05)
    # on a target that scans the stack (cpu unrolls it, and XLA:CPU then keeps every group's copy)
    module = compile_spec(tmp_path / "gem_mixed.axl", "gpu-h100-1")
    est = estimate_memory(module, "gem", batch=2, seq=12, remat=RematPolicy(RematKind.FULL))
    group = sum(w.size for w in jax.tree.leaves(params["blocks"]["groups"])) // 2
    unstacked = sum(w.size for w in jax.tree.leaves(params)) - 2 * group
    assert est.weight_copies == 2 * 2 * (
        unstacked + group
    )  # a bf16 copy and its gradient of one group
