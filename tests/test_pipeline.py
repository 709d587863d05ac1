"""Pipeline parallelism (issue 36): the `pipeline` helper (axdsl/kernels/pipeline.py) gives the
plain scan's result and gradients, and a generated model built with pipeline(...) on 8 fake CPU
devices gives the cpu build's loss and gradients, with a collective-permute between its stages.
The directive's errors (one stage, uneven layers, batches) are tests/ir/plan_pipeline.test."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from axdsl import stats
from axdsl.ir import nodes as ir
from axdsl.kernels.pipeline import pipeline
from tests.targets_util import import_generated, xla_flags

QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _step(h, w):
    """A residual layer as a repeat's scan step: (h, one layer's weights) -> (h, None)."""
    return h + jnp.tanh(h @ w), None


@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (4, 4, 2), (2, 6, 3)])
def test_pipeline_gives_the_scans_result_and_gradients(stages, microbatches, repeats):
    """On a (stage, data) mesh every micro-batch meets layer l's weights in order, on the stage
    that holds them: the scan's result and gradients over the same stack, the roll to the next
    stage a collective-permute. Without a mesh it is the scan itself."""
    layers = stages * repeats * 2
    w = 0.3 * jax.random.normal(jax.random.key(0), (layers, 8, 8))
    x = jax.random.normal(jax.random.key(1), (24, 3, 8))

    def scanned(w):
        return jnp.sum(jax.lax.scan(_step, x, w)[0] ** 2)

    def piped(w):
        y = pipeline(
            _step,
            x,
            w,
            stages=stages,
            microbatches=microbatches,
            repeats=repeats,
            carry_spec=P("data"),
            specs=P("stage"),
        )
        return jnp.sum(y**2)

    want = jax.value_and_grad(scanned)(w)
    run = jax.jit(jax.value_and_grad(piped), compiler_options=QUICK_COMPILE)
    mesh = Mesh(np.array(jax.devices()).reshape(stages, -1), ("stage", "data"))
    with jax.set_mesh(mesh):
        compiled = run.lower(jax.device_put(w, jax.NamedSharding(mesh, P("stage")))).compile()
        got = compiled(w)
    assert "collective-permute" in compiled.as_text()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(w)[0], want[0], rtol=1e-6)  # no mesh: the scan


def _aux_step(h, w):
    """A layer with an auxiliary loss, as the pipeline takes it: (h, ((a, b, c),)) with a, b, c
    means over this batch's rows, the loss sum(a * b) + c (a product of batch means, as MoE's
    balancing loss). Nonzero on zero input, so the bubble's garbage would count if not left out."""
    h = h + jnp.tanh(h @ w + 0.5)
    stats = (jnp.mean(h, axis=(0, 1)), jnp.mean(jnp.tanh(h) ** 2, axis=(0, 1)), jnp.mean(h**2))
    return h, (stats,)


def test_pipeline_gives_the_scans_auxiliary_loss_from_each_layers_statistics():
    """With aux=True each layer's statistics are averaged over the micro-batches it ran (the
    bubble's left out): the loss and gradients of the scan, which sees the whole batch; a mean of
    the micro-batches' losses would differ, which shows the test can fail."""
    stages, microbatches, repeats = 2, 4, 2
    w = 0.3 * jax.random.normal(jax.random.key(0), (stages * repeats * 2, 8, 8))
    x = jax.random.normal(jax.random.key(1), (16, 3, 8))

    def layer_loss(stats):
        return sum(jnp.sum(a * b) + c for a, b, c in stats)

    def scanned(w):
        y, stats = jax.lax.scan(_aux_step, x, w)
        return jnp.mean(y**2) + jnp.sum(jax.vmap(layer_loss)(stats))

    def piped(w):
        kw = dict(stages=stages, microbatches=microbatches, repeats=repeats)
        y, aux = pipeline(_aux_step, x, w, carry_spec=P("data"), specs=P("stage"), aux=True, **kw)
        return jnp.mean(y**2) + aux

    pieces = x.reshape(microbatches, -1, *x.shape[1:])
    per_piece = jax.vmap(lambda p: jnp.sum(jax.vmap(layer_loss)(jax.lax.scan(_aux_step, p, w)[1])))
    naive = jnp.mean(per_piece(pieces)) + jnp.mean(jax.lax.scan(_aux_step, x, w)[0] ** 2)
    want = jax.value_and_grad(scanned)(w)
    assert abs(float(naive) - float(want[0])) > 1e-3 * abs(float(want[0]))
    run = jax.jit(jax.value_and_grad(piped), compiler_options=QUICK_COMPILE)
    mesh = Mesh(np.array(jax.devices()).reshape(stages, -1), ("stage", "data"))
    with jax.set_mesh(mesh):
        got = run(jax.device_put(w, jax.NamedSharding(mesh, P("stage"))))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(w)[0], want[0], rtol=1e-6)  # no mesh: the scan


# ----------------------------------------------------------------------------- generated models
# A small GQA Llama of 8 layers; `{target}` is the target block's directives, `{variant}` the
# model's extra lines.
PP_SPEC = """\
import "std/transformer.axl"

model lm = DecoderLM {{
  vocab = 256  dim = 64  layers = 8  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
  dtype = f32{variant}
}}
train {{ batch = 16  seq = 16 }}
target "cpu-8" {{ {target} }}
"""
VARIANTS = {
    "": "",
    "packed": "  packed = true",  # segment ids go through the pipeline too
    # 4 layers of DeepSeek's dropless MoE (sigmoid router, a shared expert): each adds its
    # load-balancing and z losses, and its selection bias gets the load surplus (balance_rate)
    "moe": "\n  block = Block(attn = Attention(kv_heads = 2), mlp = DeepSeekMoE(hidden = 16, "
    "experts = 4, top_k = 2, aux_weight = 0.01, z_weight = 0.001, balance_rate = 0.01))",
}
PP_CASES = [  # (target, variant): FSDP inside each stage; 2 and 4 stages, repeats 1 and 2
    ("mesh(stage = 2, fsdp = 4)  pipeline(microbatches = 4)", ""),
    ("mesh(stage = 4, fsdp = 2)  remat(full)  pipeline(microbatches = 4, repeats = 2)", ""),
    # PP + CP + TP on packed rows: the ring's shard_map inside the stages' vmap, heads over
    # `model`, each micro-batch's segment ids beside it
    (
        "mesh(stage = 2, seq = 2, model = 2)  "
        'context(strategy = "ring")  pipeline(microbatches = 2)',
        "packed",
    ),
    # MoE with EP under PP (circular): experts over `expert`, dropless dispatch in each stage,
    # the auxiliary loss and the bias's load surplus from each layer's statistics averaged over
    # the micro-batches
    ("mesh(stage = 2, expert = 2, fsdp = 2)  pipeline(microbatches = 4, repeats = 2)", "moe"),
]
# packed rows of 17 tokens: documents whose boundaries differ between the micro-batches
SEGMENTS = np.repeat(np.array([[1, 2, 2, 3]] * 8 + [[1, 1, 1, 1]] * 8), [5, 4, 4, 4], axis=1)


def _spec(tmp_path, name: str, target: str, variant: str = "") -> Path:
    path = tmp_path / f"{name}.axl"
    text = PP_SPEC.format(target=target, variant=VARIANTS[variant])
    if variant == "moe":  # 4 layers: enough for 2 stages x 2 repeats, and quicker
        text = text.replace("layers = 8", "layers = 4").replace("transformer.axl", "deepseek.axl")
    path.write_text(text)
    return path


def _loss_and_grads(model, cfg, tokens, segments=None):
    given = () if segments is None else (jnp.asarray(segments, jnp.int32),)
    run = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens, *given)[0])
    return jax.jit(run, compiler_options=QUICK_COMPILE)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The spec built for cpu (no pipeline): its module, tokens, and a function of the variant
    giving its module, parameters and the loss and grads (computed once each)."""
    tmp_path = tmp_path_factory.mktemp("pp_ref")
    ref, _ = import_generated(_spec(tmp_path, "ref", ""), "cpu", tmp_path)
    tokens = jax.random.randint(jax.random.key(1), (16, 17), 0, ref.CONFIGS["lm"].vocab)
    wanted: dict[str, tuple] = {}

    def want(variant: str) -> tuple:
        if variant not in wanted:
            model = ref
            if variant:
                model, _ = import_generated(_spec(tmp_path, variant, "", variant), "cpu", tmp_path)
            cfg = model.CONFIGS["lm"]
            params = model.init_params(cfg, jax.random.key(0))
            params = jax.tree.map(lambda a: a * 3.0 if a.ndim > 2 else a, params)
            segments = SEGMENTS if variant == "packed" else None
            result = _loss_and_grads(model, cfg, tokens, segments)(params)
            wanted[variant] = model, params, result
        return wanted[variant]

    return ref, tokens, want


@pytest.mark.parametrize("target,variant", PP_CASES)
def test_generated_pipelined_model_keeps_the_loss_and_gradients(
    tmp_path, reference, target, variant
):
    """The spec built for cpu-8 with pipeline(...) gives the cpu build's loss and gradients with
    its mesh set (the loss is a mean over the micro-batches), its stages exchanging activations
    by collective-permute; packed rows cut their segment ids into the same micro-batches; MoE
    layers under EP give the whole batch's auxiliary loss (a product of batch means, not a mean
    of the micro-batches' losses). The first case also checks the forward without a mesh (the
    plain scan) and that prefill, which runs the layers unpipelined, is unchanged."""
    ref, tokens, wanted = reference
    _, params, want = wanted(variant)
    segments = SEGMENTS if variant == "packed" else None
    pp, _ = import_generated(_spec(tmp_path, "pp", target, variant), "cpu-8", tmp_path)
    cfg = pp.CONFIGS["lm"]
    mesh = pp.make_mesh()
    shardings = jax.tree.map(lambda s: jax.NamedSharding(mesh, s), pp.param_specs())
    placed = jax.device_put(params, shardings)
    with jax.set_mesh(mesh):
        step = _loss_and_grads(pp, cfg, tokens, segments).lower(placed).compile()
        assert "collective-permute" in step.as_text()
        loss, grads = step(placed)
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=1e-4)
    if variant == "moe":  # the experts rest on `expert`; the bias got the whole batch's surplus
        assert placed["blocks"]["mlp"]["w_gate"].sharding.spec[:2] == ("stage", "expert")
        surplus = np.asarray(grads["blocks"]["mlp"]["score_bias"])
        assert np.abs(surplus).max() >= 1 and np.all(surplus == np.round(surplus))
    if target == PP_CASES[0][0]:
        prompt = tokens[:2, :8]
        logits = jax.jit(pp.forward, static_argnums=0)(cfg, params, prompt)
        np.testing.assert_allclose(logits, ref.forward(cfg, params, prompt), atol=1e-5)
        cache = pp.init_cache(cfg, 2, 16)
        got, _ = pp.prefill(cfg, pp.decode_params(cfg, params), prompt, cache)
        np.testing.assert_allclose(got, logits, atol=1e-5)


@pytest.mark.parametrize(
    "stages,microbatches,repeats,bubble",
    [(2, 4, 1, 1 / 5), (4, 4, 1, 3 / 7), (4, 8, 1, 3 / 11), (4, 4, 2, 3 / 11), (8, 16, 4, 7 / 71)],
)
def test_bubble_is_maxtexts_circular_formula(stages, microbatches, repeats, bubble):
    """(stages - 1) / (microbatches * repeats + stages - 1): the idle share of the loop."""
    policy = ir.PipelinePolicy(microbatches, repeats, stages=stages)
    assert policy.iterations == microbatches * repeats + stages - 1
    assert policy.bubble == pytest.approx(bubble)


def test_stats_prints_the_pipeline_and_its_bubble(tmp_path, capsys):
    """`axdsl stats` says how the layers split and the bubble (axdsl aot adds it as a note)."""
    spec = _spec(tmp_path, "pp", PP_CASES[1][0])
    assert stats.run(spec, "cpu-8") == 0
    out = capsys.readouterr().out
    assert "over 4 stages of `stage`: /blocks (lm 8 = 4 x 2 x 1 layers), 11 iterations" in out
    assert "bubble 27.3%" in out


def test_each_stage_keeps_its_layers_weights_and_optimizer_state(tmp_path):
    """The memory model: under pipeline(...) over 4 stages, the repeat's weights, gradients and
    optimizer state per chip are a quarter of what the same chips hold with `stage` as data
    parallelism; the embedding, final norm and head stay as they are."""
    from axdsl.analysis.layout import Layout
    from axdsl.analysis.memory import estimate_memory
    from axdsl.ir.axes import dim_axes
    from axdsl.pipeline import compile_spec

    staged = compile_spec(
        _spec(tmp_path, "pp", "mesh(stage = 4, fsdp = 2)  pipeline(microbatches = 4)"), "cpu-8"
    )
    flat = compile_spec(_spec(tmp_path, "dp", "mesh(stage = 4, fsdp = 2)"), "cpu-8")
    pp, dp = estimate_memory(staged), estimate_memory(flat)
    root, sched = flat.models[0].root, flat.target
    layout = Layout(dict(sched.mesh_sizes), {k: c.value for k, c in sched.rules}, dim_axes(root))
    blocks = sum(  # f32 bytes per chip of the repeat's weights with `stage` as data parallelism
        layout.param_elements(p) * 4
        for i in root.walk()
        if i.path.startswith("/blocks")
        for p in i.params
    )
    assert dp.params - pp.params == blocks - blocks // 4
    assert dp.opt_state - pp.opt_state == 2 * (blocks - blocks // 4)  # adamw: two f32 moments


def test_a_pipelined_run_killed_and_resumed_is_bitwise_the_uninterrupted_one(tmp_path):
    """pipeline(...) over 2 stages on 8 fake devices: the generated train.py, killed (SIGKILL)
    after its step-4 checkpoint and rerun with the same command, ends with the bytes of the
    uninterrupted run's parameters, moments and counters."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.test_train_objectives import complete, final_params

    spec = _spec(tmp_path, "pp", "mesh(stage = 2, fsdp = 4)  pipeline(microbatches = 4)")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "axdsl",
            "build",
            str(spec),
            "--target",
            "cpu-8",
            "--out",
            str(tmp_path / "gen"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    env = dict(
        os.environ, XLA_FLAGS=xla_flags(8), JAX_PLATFORMS="cpu"
    )

    def train(run: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gen.pp.cpu_8.train",
            "--out",
            str(run),
            "--steps",
            "8",
            "--checkpoint-every",
            "4",
            "--no-progress",
            "--compile-cache",
            str(tmp_path / "cache"),
        ]

    def run_to_end(run: Path) -> str:
        done = subprocess.run(
            train(run), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    run_to_end(tmp_path / "reference")
    killed = tmp_path / "killed"
    with open(tmp_path / "log", "w") as log:
        child = subprocess.Popen(train(killed), cwd=tmp_path, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 240
        while not [s for s in complete(killed) if s >= 4] and child.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint at step 4 in time"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL, (tmp_path / "log").read_text()[-2000:]
    assert "resumed from step" in run_to_end(killed)
    want, got = final_params("pp", tmp_path / "reference", 8), final_params("pp", killed, 8)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].tobytes() == got[key].tobytes(), key


def test_attention_in_shard_map_leaves_the_stage_axis_to_the_pipeline(tmp_path):
    """Splash (and context parallelism) run in jax.shard_map; inside the stages, whose vmap holds
    the `stage` axis, their batch must split over the other axes (JAX refuses a vmap axis in
    shard_map's specs): the calls in the pipelined layers say staged=True. Interpret-mode splash
    inside a 2-stage pipeline on cpu gives the unpipelined loss (checked by hand: 5.58584 vs
    5.58555, TPU precision); building is what this test pins."""
    from axdsl.build import build_files

    text = PP_SPEC.replace("dim = 64  layers = 8  heads = 4", "dim = 256  layers = 8  heads = 2")
    spec = tmp_path / "splash.axl"
    spec.write_text(
        text.replace("seq = 16", "seq = 128")
        .replace("max_seq = 64", "max_seq = 128")
        .format(
            target="mesh(stage = 2, fsdp = 2, model = 2)  pipeline(microbatches = 2)", variant=""
        )
        .replace('target "cpu-8"', 'target "tpu-v5e-8"')
    )
    model = build_files(spec, "tpu-v5e-8")["model.py"]
    assert "splash_attention(q, k, v, causal=True, window=None, staged=True)" in model
