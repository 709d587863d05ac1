"""Context parallelism's kernels (axdsl/kernels/context.py) on fake CPU devices: attention with the
sequence split over a `seq` mesh axis, all-gathered or as a ring, in contiguous or zig-zag order,
gives single-device attention's outputs and gradients; the zig-zag order balances causal work."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from axdsl.kernels import attention, context, splash
from axdsl.build import build_files
from tests.targets_util import import_generated, kernels_of

RNG = np.random.default_rng(0)
BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM = 2, 32, 4, 2, 8
Q = jnp.asarray(RNG.standard_normal((BATCH, SEQ, HEADS, HEAD_DIM)), jnp.float32)
K = jnp.asarray(RNG.standard_normal((BATCH, SEQ, KV_HEADS, HEAD_DIM)), jnp.float32)
V = jnp.asarray(RNG.standard_normal((BATCH, SEQ, KV_HEADS, HEAD_DIM)), jnp.float32)
# packed documents whose boundaries fall inside the shards' chunks
# XLA:CPU's cheaper optimizations: compiling dominates these tests (about 40% less), and the results
# still agree to 1e-5
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
SEGMENTS = jnp.asarray([[0] * 13 + [1] * 19, [0] * 5 + [1] * 20 + [2] * 7], jnp.int32)


def _with_gradients(f):
    """f's output and the gradients in q, k, v of sum(sin(output)), in one jitted call: every
    output element gets its own cotangent."""

    def run(q, k, v):
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(jnp.cos(out))

    return jax.jit(run, compiler_options=QUICK_COMPILE)(Q, K, V)


@functools.cache
def _reference(causal: bool, window: int | None, segments: bool):
    """Single-device attention (jax.nn.dot_product_attention) and its gradient in q, k, v."""

    def attend(q, k, v):
        mask = SEGMENTS[:, None, :, None] == SEGMENTS[:, None, None, :] if segments else None
        local = (window - 1, 0) if window else None
        return jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=causal, local_window_size=local
        )

    return _with_gradients(attend)


def _sharded(strategy, mesh, balance, causal, window, segments, positions_from, attend=None):
    """Outputs and q, k, v gradients of context attention under jax.shard_map over `seq` (the
    batch over `data` when the mesh has it): the sequence put in zig-zag order when `balance`,
    the output put back, so both compare with _reference in the original order."""
    shards = mesh.shape["seq"]
    order = context.zigzag_order(SEQ, shards) if balance else np.arange(SEQ)
    inverse = context.zigzag_inverse(SEQ, shards) if balance else np.arange(SEQ)
    batch = "data" if "data" in mesh.axis_names else None
    kwargs = {} if attend is None else {"attend": attend}

    def local(q, k, v, segment_ids, positions):
        if positions_from == "index":  # computed in the shard from its index
            positions = context.local_positions(q.shape[1], "seq", balance)
        elif positions_from == "none":  # the kernel's default: contiguous shards
            positions = None
        run = getattr(context, f"context_attention_{strategy}")
        return run(
            q,
            k,
            v,
            causal=causal,
            window=window,
            segment_ids=segment_ids if segments else None,
            positions=positions,
            **kwargs,
        )

    spec = P(batch, "seq")
    specs = (spec, spec, spec, spec, P("seq"))
    sharded = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec)

    def full(q, k, v):
        out = sharded(q[:, order], k[:, order], v[:, order], SEGMENTS[:, order], order)
        return out[:, inverse]

    return _with_gradients(full)


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


CASES = [  # strategy, mesh, balance, causal, window, segments, where positions come from
    ("all_gather", (4,), False, True, None, False, "none"),
    ("ring", (4,), False, True, 5, True, "none"),
    ("ring", (8,), True, True, None, False, "array"),
    ("ring", (2, 4), True, True, 5, True, "index"),
]


@pytest.mark.parametrize("strategy,shape,balance,causal,window,segments,positions_from", CASES)
def test_context_attention_matches_single_device_attention_and_its_gradients(
    strategy, shape, balance, causal, window, segments, positions_from
):
    names = ("seq",) if len(shape) == 1 else ("data", "seq")
    want = _reference(causal, window, segments)
    got = _sharded(strategy, _mesh(shape, names), balance, causal, window, segments, positions_from)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_ring_folds_key_blocks_smaller_than_a_tile(monkeypatch):
    """The ring's blocked inner loop: with RING_KEY_BLOCK 2, each shard's query halves (4
    tokens) take a travelling block's keys 2 at a time (the online softmax over more steps, the
    fully masked blocks skipped), forward and backward; the results stay the full attention's."""
    from axdsl.primitives import attention as registry

    assert registry.RING_KEY_BLOCK == context.RING_KEY_BLOCK  # aot's memory model, one figure
    monkeypatch.setattr(context, "RING_KEY_BLOCK", 2)
    assert [context._ring_key_block(n) for n in (8, 6, 1)] == [2, 1, 1]
    got = _sharded("ring", _mesh((4,), ("seq",)), True, True, 5, True, "index")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(_reference(True, 5, True)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_all_gather_in_zigzag_order_runs_the_attention_it_is_given():
    """einsum_attention (the xla fallback kernel) as the local attention, windowed, with packed
    documents, the positions computed in each shard from its index."""
    attend = functools.partial(attention.einsum_attention, causal=False)
    mesh = _mesh((4,), ("seq",))
    got = _sharded("all_gather", mesh, True, True, 5, True, "index", attend=attend)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(_reference(True, 5, True)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_splash_under_all_gather_matches_full_attention(monkeypatch):
    """Splash (interpret mode) on each shard's queries, the kernel built over the whole sequence
    in zig-zag order and cut into rows by q_seq_shards (and heads by head_shards): the full
    attention's outputs and q, k, v gradients in f32, causal, packed documents, GQA (4 query
    heads over 2 kv heads of 64, split over `model`). The generated-model test below runs it
    windowed, in contiguous order."""
    monkeypatch.setattr(splash, "PALLAS_INTERPRET", True)
    rng = np.random.default_rng(1)
    seq, mesh = 256, _mesh((2, 2), ("model", "seq"))
    q = jnp.asarray(rng.standard_normal((1, seq, 4, 64)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((1, seq, 2, 64)), jnp.float32) for _ in range(2))
    ids = jnp.asarray([[0] * 90 + [1] * 100 + [2] * 66], jnp.int32)
    order = context.zigzag_order(seq, mesh.shape["seq"])

    def full(q, k, v):
        mask = ids[:, None, :, None] == ids[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)

    def sharded(q, k, v):
        out = splash.splash_context_attention(
            q[:, order],
            k[:, order],
            v[:, order],
            causal=True,
            positions=order,
            segment_ids=ids[:, order],
        )
        return out[:, np.argsort(order)]

    def with_gradients(f):
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(jnp.cos(out))

    want = jax.jit(lambda: with_gradients(full), compiler_options=QUICK_COMPILE)()
    with jax.set_mesh(mesh):
        got = jax.jit(lambda: with_gradients(sharded), compiler_options=QUICK_COMPILE)()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seq,shards", [(16, 4), (64, 8), (6, 1)])
def test_zigzag_order_round_trips_and_pairs_early_with_late_chunks(seq, shards):
    order, inverse = context.zigzag_order(seq, shards), context.zigzag_inverse(seq, shards)
    x = RNG.standard_normal((2, seq))
    np.testing.assert_array_equal(x[:, order][:, inverse], x)
    np.testing.assert_array_equal(np.sort(order), np.arange(seq))
    chunk = seq // (2 * shards)
    rows = context.shard_positions(seq, shards, balance=True)
    for i, row in enumerate(rows):  # shard i: chunk i, then chunk 2 * shards - 1 - i
        late = 2 * shards - 1 - i
        np.testing.assert_array_equal(row[:chunk], np.arange(i * chunk, (i + 1) * chunk))
        np.testing.assert_array_equal(row[chunk:], np.arange(late * chunk, (late + 1) * chunk))
    np.testing.assert_array_equal(
        context.shard_positions(seq, shards, balance=False), np.arange(seq).reshape(shards, -1)
    )


def _causal_work(seq: int, shards: int, balance: bool, window: int | None = None) -> list[int]:
    """Per shard: the (query, key) pairs the causal (and windowed) mask keeps."""
    work = []
    for row in context.shard_positions(seq, shards, balance):
        keys = np.arange(seq)[None, :]
        keep = keys <= row[:, None]
        if window:
            keep &= keys > row[:, None] - window
        work.append(int(keep.sum()))
    return work


@pytest.mark.parametrize("seq,shards", [(32, 4), (64, 8), (4096, 16)])
def test_zigzag_balances_causal_work_and_contiguous_does_not(seq, shards):
    balanced, contiguous = _causal_work(seq, shards, True), _causal_work(seq, shards, False)
    assert len(set(balanced)) == 1 and sum(balanced) == seq * (seq + 1) // 2
    assert sum(contiguous) == sum(balanced)
    assert contiguous == sorted(contiguous) and contiguous[-1] > 2 * contiguous[0]


def test_zigzag_and_shard_positions_refuse_uneven_splits():
    with pytest.raises(ValueError, match="multiple of 8"):
        context.zigzag_order(36, 4)
    with pytest.raises(ValueError, match="does not split"):
        context.shard_positions(30, 4, balance=False)


def _ring_tiles_computed(seq: int, shards: int, balance: bool) -> list[int]:
    """Per shard: the (query half, key half) tiles the causal ring computes over all the blocks
    that reach it, the others being dropped whole by the mask (what its lax.cond skips)."""
    rows = jnp.asarray(context.shard_positions(seq, shards, balance))
    tiles = context._ring_tiles(seq // shards)
    counts = []
    for mine in rows:
        count = 0
        for theirs in rows:
            keep = context._context_keep(mine[None], theirs[None], None, None, True, None)[0]
            count += sum(bool(jnp.any(keep[r, c])) for r in tiles for c in tiles)
        counts.append(count)
    return counts


def test_the_ring_computes_equal_tiles_per_shard_in_zigzag_order():
    """4 shards: zig-zag, each shard 3 tiles of its own block and 2 of each other's; contiguous,
    shard i computes 3 + 4 i (the last shard 15, 1.6 times the balanced 9)."""
    assert _ring_tiles_computed(32, 4, balance=True) == [9, 9, 9, 9]
    assert _ring_tiles_computed(32, 4, balance=False) == [3, 7, 11, 15]


# ----------------------------------------------------------------------------- generated models
# A small GQA Llama, sliding window; `{context}` is the target block's context(...) directive.
CP_SPEC = """\
import "std/transformer.axl"

model lm = DecoderLM {{
  vocab = 256  dim = 64  layers = 1  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
  dtype = f32  block = Block(attn = Attention(window = {window}, softcap = {softcap}))
  packed = {packed}
}}
train {{ batch = 4  seq = 32 }}
target "cpu-8" {{ mesh(data = 2, seq = 4)  {context} }}
"""
CP_CASES = [  # context(...), window, softcap, packed; the collective its attention must run
    ('context(strategy = "ring")', 0, 0.0, False, "collective-permute"),
    ('context(strategy = "ring", balance = false)', 12, 0.0, True, "collective-permute"),
    ("context()", 12, 0.0, True, "all-gather"),  # balanced, on cpu's vjp kernel
    ("context(balance = false)", 0, 30.0, False, "all-gather"),  # einsum_attention, soft cap
    ('context(strategy = "ring")', 0, 0.0, True, "collective-permute"),
]
# Packed rows: documents whose boundaries fall inside the shards' chunks, and padding (0)
ROW_SEGMENTS = jnp.asarray(
    [[1] * 7 + [2] * 20 + [3] * 6, [1] * 30 + [0] * 3, [1] * 33, [1] * 3 + [2] * 25 + [0] * 5],
    jnp.int32,
)


def _spec(tmp_path, name: str, context: str, window: int, softcap: float, packed=False) -> Path:
    path = tmp_path / f"{name}.axl"
    packed_text = "true" if packed else "false"
    text = CP_SPEC.format(context=context, window=window, softcap=softcap, packed=packed_text)
    path.write_text(text)
    return path


@pytest.mark.parametrize("context_dir,window,softcap,packed,collective", CP_CASES)
def test_generated_context_parallel_model_keeps_the_loss_and_gradients(
    tmp_path, context_dir, window, softcap, packed, collective
):
    """The spec built for cpu-8 with context(...) (the sequence over 4 shards, the batch over 2)
    gives the cpu build's loss and gradients with the mesh set, its attention running the
    collective of its strategy; packed rows (segment ids, positions restarting in each document)
    too, in zig-zag order or not. The last case also runs without a mesh (one shard, as
    sampling does) and checks that forward's logits come back in order."""
    ref_spec = _spec(tmp_path, "ref", "", window, softcap, packed)
    ref, _ = import_generated(ref_spec, "cpu", tmp_path)
    cp_spec = _spec(tmp_path, "cp", context_dir, window, softcap, packed)
    cp, _ = import_generated(cp_spec, "cpu-8", tmp_path)
    cfg = ref.CONFIGS["lm"]
    params = ref.init_params(cfg, jax.random.key(0))
    params = jax.tree.map(lambda a: a * 3.0 if a.ndim > 2 else a, params)
    tokens = jax.random.randint(jax.random.key(1), (4, 33), 0, cfg.vocab)
    segments = (ROW_SEGMENTS,) if packed else ()

    def loss_and_grads(model):
        run = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens, *segments)[0])
        return jax.jit(run, compiler_options=QUICK_COMPILE)

    want = loss_and_grads(ref)(params)
    with jax.set_mesh(cp.make_mesh()):
        step = loss_and_grads(cp).lower(params).compile()
        assert collective in step.as_text()
        runs = [step(params)]
    if (context_dir, packed) == CP_CASES[-1][::3]:
        runs.append(loss_and_grads(cp)(params))
        inputs = (tokens[:, :-1], *(s[:, :-1] for s in segments))
        logits = cp.forward(cfg, params, *inputs)
        np.testing.assert_allclose(logits, ref.forward(cfg, params, *inputs), atol=1e-5)
    for loss, grads in runs:
        np.testing.assert_allclose(float(loss), float(want[0]), rtol=1e-6)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want[1]), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=1e-4)


SPLASH_SPEC = """\
import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 256  dim = 128  layers = 1  heads = 2  kv_heads = 1  ffn = 128  max_seq = 256
  dtype = f32  block = Block(attn = Attention(window = 100))  packed = true
}
train { batch = 4  seq = 256 }
target "tpu-v5e-8" { mesh(data = 2, fsdp = 2, seq = 2)  context(balance = false)  quantize(none) }
"""


def test_generated_model_runs_splash_under_all_gather(tmp_path, monkeypatch):
    """Built for tpu-v5e-8 with context(balance = false), the attention is splash on each shard's
    queries (select_kernels keeps it under all_gather), windowed, packed, GQA; on 8 CPU devices
    in interpret mode it gives the cpu build's loss and gradients."""
    spec = tmp_path / "splash.axl"
    spec.write_text(SPLASH_SPEC)
    ref, _ = import_generated(spec, "cpu", tmp_path)
    tpu, _ = import_generated(spec, "tpu-v5e-8", tmp_path)
    source = Path(tpu.__file__).read_text()
    assert "splash_context_attention(" in source and "context_parallel(" not in source
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    cfg = ref.CONFIGS["lm"]
    params = ref.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 257), 0, cfg.vocab)
    rows = [[1] * 100 + [2] * 157] * 2 + [[1] * 257, [1] * 60 + [2] * 190 + [0] * 7]
    segments = jnp.asarray(rows, jnp.int32)

    def loss_and_grads(model):
        run = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens, segments)[0])
        return jax.jit(run, compiler_options=QUICK_COMPILE)

    want = loss_and_grads(ref)(params)
    with jax.set_mesh(tpu.make_mesh()):
        loss, grads = loss_and_grads(tpu)(params)
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=1e-4)


def test_cudnn_runs_on_each_shards_queries_under_all_gather_and_not_in_the_ring(tmp_path):
    """On gpu-h100-8 (bf16) under context() the all-gather passes cuDNN the mask of the tokens'
    original positions ([B, 1, S_local, S], jax's dense-bias input, which spans this shard's
    queries and all keys); the ring computes in its own blocks, so cuDNN is not chosen. cuDNN
    cannot run on the CPU: the generated text is checked (the all-gather around
    jax.nn.dot_product_attention with that mask runs in the tests above)."""
    spec = tmp_path / "gpu.axl"
    gpu = 'target "gpu-h100-8" {{ mesh(data = 2, seq = 4)  {} }}\n'
    base = CP_SPEC.split('target "cpu-8"')[0].format(window=12, softcap=0.0, packed="true")
    spec.write_text(base.replace("dtype = f32", "dtype = bf16") + gpu.format("context()"))
    model = build_files(spec, "gpu-h100-8")["model.py"]
    assert "context_attention_all_gather," in model and "select_kernels: cudnn" in model
    assert 'jax.nn.dot_product_attention, implementation="cudnn"' in model
    spec.write_text(spec.read_text().replace("context()", 'context(strategy = "ring")'))
    model = build_files(spec, "gpu-h100-8")["model.py"]
    assert "context_attention_ring" in model and 'implementation="cudnn"' not in model


def test_train_py_refuses_a_seq_the_shards_do_not_split(tmp_path):
    """--seq is checked before tracing: 4 shards in zig-zag order need a multiple of 8 (the
    model would otherwise fail inside jit with a traceback)."""
    import dataclasses

    _, train = import_generated(_spec(tmp_path, "cp", "context()", 0, 0.0), "cpu-8", tmp_path)
    mesh = __import__(train.__package__ + ".model", fromlist=["model"]).make_mesh()
    cfg, tc = train.model_config(train.TRAIN), train.TRAIN
    train.check_config(cfg, tc, mesh)  # seq 32: 8 chunks of 4
    with pytest.raises(SystemExit, match="multiple of 8"):
        train.check_config(cfg, dataclasses.replace(tc, seq=30), mesh)


def test_decoding_reads_a_cache_split_over_seq(tmp_path):
    """On the context-parallel target the KV cache's positions are split over `seq` like the
    activations (cache_specs), and the decode path over it, prefill then one token at a time,
    gives the forward's logits (a packed model, each row one sequence)."""
    spec = _spec(tmp_path, "cp", 'context(strategy = "ring")', 0, 0.0, packed=True)
    cp, _ = import_generated(spec, "cpu-8", tmp_path)
    cfg = cp.CONFIGS["lm"]
    params = cp.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, cfg.vocab)
    mesh = cp.make_mesh()
    assert cp.cache_specs()["blocks"]["attn"]["k"] == P(None, "data", "seq")
    with jax.set_mesh(mesh):
        forward = jax.jit(cp.forward, static_argnums=0, compiler_options=QUICK_COMPILE)
        want = forward(cfg, params, tokens, jnp.ones_like(tokens))
        places = jax.tree.map(lambda s: jax.NamedSharding(mesh, s), cp.cache_specs())
        cache = jax.device_put(cp.init_cache(cfg, 4, 16), places)
        logits, cache = cp.prefill(cfg, params, tokens[:, :12], cache)
        assert cache["blocks"]["attn"]["k"].sharding.spec == P(None, "data", "seq")
        np.testing.assert_allclose(logits, want[:, :12], atol=1e-5)
        for pos in range(12, 16):
            step, cache = cp.decode_step(cfg, params, tokens[:, pos], cache, jnp.int32(pos))
            np.testing.assert_allclose(step, want[:, pos], atol=1e-5)
