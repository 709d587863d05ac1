"""Hardware targets: profiles, target blocks, and the schedule passes on 8 fake CPU devices.

The schedule (sharding, remat, kernels) must never change what is computed: every target's
generated model, run here on CPU, equals the cpu target's within 1e-5 in f32.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.build import diff_targets
from axdsl.ir.printer import print_module
from axdsl.pipeline import compile_spec
from axdsl import targets
from axdsl.ir import nodes as ir
from axdsl.targets import KNOWN_TARGETS, ProfileError, UnknownTarget, get_target, profiles
from tests.targets_util import import_generated

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("cpu", "gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200", "tpu-v4", "tpu-v5e", "tpu-v5p",
            "tpu-v6e", "trn2")

# A small Llama whose dims every 8-device layout divides; quantization off so numerics compare.
SPEC = """\
import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 256  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64  dtype = f32
}

train { batch = 8  seq = 16 }

target "*" { quantize(none) }
"""

# Data, FSDP and tensor parallelism at once, plus offloading remat, on the cpu target.
SPEC_3D = SPEC.replace('target "*" { quantize(none) }', """\
target "cpu-8" {
  mesh(data = 2, fsdp = 2, model = 2)
  rules(heads = model, kv_heads = model, mlp = model, vocab = model)
  remat(save = [query_proj], offload = [mlp_hidden])
}
target "*" { quantize(none) }""")


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "lm.axl"
    path.write_text(SPEC)
    (path.parent / "lm3d.axl").write_text(SPEC_3D)
    return path


# ----------------------------------------------------------------------------- profiles
def test_every_required_profile_ships_with_its_facts():
    assert set(REQUIRED) <= set(KNOWN_TARGETS)
    for name in REQUIRED:
        p = profiles()[name]
        assert p.hbm_bytes > 0 and p.peak_flops("bf16") > 0 and p.chips_per_host >= 1
        assert p.kernels["attention"][-1] == "xla", "every profile can fall back to the XLA reference"
        assert set(p.rules) >= {"batch", "embed", "heads", "mlp", "vocab", "experts"}
    assert profiles()["gpu-h100"].peak_flops("fp8") > 1.9 * profiles()["gpu-h100"].peak_flops("bf16")
    assert "int8" in profiles()["tpu-v5e"].quantize and "fp8" not in profiles()["tpu-v5e"].quantize


def test_profile_kernels_are_kernels_and_an_unknown_name_is_located(tmp_path, monkeypatch):
    assert profiles()["tpu-v5e"].kernels["attention"] == (ir.Kernel.SPLASH, ir.Kernel.XLA)
    text = targets.PROFILES.read_text().replace('attention = ["splash", "xla"]', 'attention = ["splsh", "xla"]', 1)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '"splsh"' in s)
    (tmp_path / "profiles.toml").write_text(text)
    monkeypatch.setattr(targets, "PROFILES", tmp_path / "profiles.toml")
    profiles.cache_clear()
    try:
        with pytest.raises(ProfileError, match=rf"profiles.toml:{line}: profile `tpu-v4` lists unknown "
                           r"attention kernel `splsh` \(did you mean `splash`\?\)"):
            profiles()
    finally:
        monkeypatch.undo()
        profiles.cache_clear()


def test_target_names_carry_chip_counts_and_unknown_names_suggest():
    assert get_target("gpu-h100-8").chips == 8
    assert get_target("tpu-v5e-256").chips == 256
    assert get_target("gpu-h100").chips == profiles()["gpu-h100"].default_chips
    with pytest.raises(UnknownTarget) as info:
        get_target("gpu-h10")
    assert "did you mean `gpu-h100`?" in str(info.value) and "tpu-v5p" in str(info.value)


def test_first_matching_block_wins_and_dump_shows_origins(tmp_path, in_root):
    path = tmp_path / "m.axl"
    path.write_text(SPEC.replace('target "*" { quantize(none) }', """\
target "gpu-h100-*" { mesh(data = 2, fsdp = -1) }
target "gpu-*" { mesh(fsdp = 4, model = -1) }"""))
    text = print_module(compile_spec(path, "gpu-h100-8"))
    assert 'target "gpu-h100-*"' in text.split("schedule gpu-h100-8")[1].splitlines()[0]
    assert "mesh(data = 2, fsdp = -1) -> stage=1, data=2, expert=1, fsdp=4, seq=1, model=1" in text
    assert "rule embed -> [fsdp]  # profile gpu-h100" in text
    assert "quantize(fp8" in text  # no quantize() in the matched block: the profile's default
    other = print_module(compile_spec(path, "gpu-a100-8"))
    assert "mesh(fsdp = 4, model = -1) -> stage=1, data=1, expert=1, fsdp=4, seq=1, model=2" in other
    plain = print_module(compile_spec(path, "cpu"))
    assert "no target block matched" in plain


# ----------------------------------------------------------------------------- sharding
def _expected_spec(param) -> tuple:
    parts = [None if not a else a[0] if len(a) == 1 else a for a in param.sharding]
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


def _spec_tuple(sharding) -> tuple:
    parts = [None if p is None else p if isinstance(p, str) else (p[0] if len(p) == 1 else tuple(p))
             for p in sharding.spec]
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


def _promised(module) -> dict[str, tuple]:
    out = {}
    for inst in module.models[0].root.walk():
        for p in inst.params:
            out[f"{inst.path.rstrip('/')}/{p.name}".lstrip("/")] = _expected_spec(p)
    return out


def _actual(tree) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): _spec_tuple(leaf.sharding) for path, leaf in flat}


@pytest.mark.parametrize("profile", REQUIRED)
def test_generated_step_runs_and_shards_as_dump_promised(profile, spec, tmp_path):
    target = f"{profile}-8"
    model, train = import_generated(spec, target, tmp_path)
    promised = _promised(compile_spec(spec, target))
    cfg, tc = model.CONFIGS["lm"], train.TRAIN
    mesh = model.make_mesh()
    assert mesh.devices.size == 8
    with jax.set_mesh(mesh):
        state = train.init_state(cfg, tc, mesh, jax.random.key(0))
        assert _actual(state["params"]) == promised
        mu = state["opt_state"][1][0].mu  # chain(clip, adamw): adam's first moment follows its param
        assert _actual(mu) == promised
        step = train.make_train_step(cfg, tc, mesh)
        batch = jax.device_put(jnp.zeros((tc.batch, tc.seq + 1), jnp.int32), train.batch_sharding(mesh))
        state, metrics = step(state, batch)
        assert bool(metrics["ok"]) and np.isfinite(float(metrics["loss"]))
        assert _actual(state["params"]) == promised


def test_data_fsdp_and_tensor_parallel_at_once(spec, tmp_path):
    path = spec.parent / "lm3d.axl"
    model, train = import_generated(path, "cpu-8", tmp_path)
    promised = _promised(compile_spec(path, "cpu-8"))
    assert promised["blocks/attn/wq"] == (None, "fsdp", "model")
    assert promised["blocks/mlp/w_down"] == (None, "model", "fsdp")
    assert promised["embed/table"] == ("model", "fsdp")
    cfg, tc = model.CONFIGS["lm"], train.TRAIN
    mesh = model.make_mesh()
    assert dict(mesh.shape) == {"stage": 1, "data": 2, "expert": 1, "fsdp": 2, "seq": 1, "model": 2}
    with jax.set_mesh(mesh):
        state = train.init_state(cfg, tc, mesh, jax.random.key(0))
        assert _actual(state["params"]) == promised
        state, metrics = train.make_train_step(cfg, tc, mesh)(
            state, jax.device_put(jnp.ones((tc.batch, tc.seq + 1), jnp.int32), train.batch_sharding(mesh)))
    assert np.isfinite(float(metrics["loss"]))


# ----------------------------------------------------------------------------- numerics
def _loss_and_grads(model, params, tokens, cfg, mesh=None):
    fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0]))
    if mesh is None:
        return fn(params)
    with jax.set_mesh(mesh):
        return fn(params)


def test_schedules_never_change_numerics(spec, tmp_path):
    """Every profile's generated model equals the cpu target's: forward, loss and gradients."""
    ref, _ = import_generated(spec, "cpu", tmp_path)
    cfg = ref.CONFIGS["lm"]
    params = ref.init_params(cfg, jax.random.key(0))
    params = jax.tree.map(lambda a: a * 5.0 if a.ndim > 2 else a, params)  # make differences show
    tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, cfg.vocab)
    want_logits = np.asarray(ref.forward(cfg, params, tokens))
    want_loss, want_grads = _loss_and_grads(ref, params, tokens, cfg)
    for profile in REQUIRED[1:]:
        target = f"{profile}-8"
        m, _ = import_generated(spec, target, tmp_path)
        np.testing.assert_allclose(np.asarray(m.forward(cfg, params, tokens)), want_logits, atol=1e-5, rtol=1e-5,
                                   err_msg=target)
        loss, grads = _loss_and_grads(m, params, tokens, cfg, m.make_mesh())
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6, err_msg=target)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4, err_msg=target)


def test_tensor_parallel_and_offload_remat_keep_numerics(spec, tmp_path):
    ref, _ = import_generated(spec, "cpu", tmp_path)
    m, _ = import_generated(spec.parent / "lm3d.axl", "cpu-8", tmp_path)
    cfg = ref.CONFIGS["lm"]
    params = ref.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, cfg.vocab)
    want_loss, want_grads = _loss_and_grads(ref, params, tokens, cfg)
    loss, grads = _loss_and_grads(m, params, tokens, cfg, m.make_mesh())
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- remat
def test_remat_policies_in_generated_code(spec, tmp_path):
    """cpu keeps every activation (its profile's none); accelerators choose by fit, and this small
    step fits with nothing recomputed; a target block's policy is emitted as written."""
    src = {t: (import_generated(spec, t, tmp_path)[0].__file__) for t in ("cpu", "gpu-h100-8", "tpu-v5e-8")}
    text = {t: Path(f).read_text() for t, f in src.items()}
    assert "REMAT_POLICY" not in text["cpu"]  # cpu profile: remat(none)
    for target, profile in (("gpu-h100-8", "gpu-h100"), ("tpu-v5e-8", "tpu-v5e")):
        assert "REMAT_POLICY" not in text[target]
        assert f"# insert_remat: remat(none) from fit_remat, for profile {profile}" in text[target]
        assert "none 0.0" in text[target] and "GiB: none fits" in text[target]
    written = spec.parent / "written.axl"
    written.write_text(SPEC.replace('target "*" { quantize(none) }',
                                    'target "gpu*" { remat(save_dots) }\ntarget "tpu*" { remat(full) }'))
    text = {t: Path(import_generated(written, t, tmp_path)[0].__file__).read_text() for t in ("gpu-h100-8", "tpu-v5e-8")}
    # fp8 matmuls (the gpu-h100 default): save_dots also saves the helpers' named outputs
    assert "jax.checkpoint_policies.dots_with_no_batch_dims_saveable," in text["gpu-h100-8"]
    assert 'jax.checkpoint_policies.save_only_these_names("quantized_matmul")' in text["gpu-h100-8"]
    assert "REMAT_POLICY = jax.checkpoint_policies.nothing_saveable" in text["tpu-v5e-8"]
    assert "@functools.partial(jax.checkpoint, policy=REMAT_POLICY, prevent_cse=False)" in text["tpu-v5e-8"]
    assert "fit_remat" not in text["tpu-v5e-8"]


# ----------------------------------------------------------------------------- unroll
def test_cpu_unrolls_short_repeats_and_numerics_do_not_move(spec, tmp_path):
    """The cpu profile's unroll(16) runs the 2-layer scan unrolled; unroll(0) (or a repeat longer
    than the bound) keeps the rolled scan. Both compute the same loss and gradients."""
    unrolled, _ = import_generated(spec, "cpu", tmp_path)
    rolled_spec = spec.parent / "rolled.axl"
    rolled_spec.write_text(SPEC.replace('target "*" { quantize(none) }',
                                        'target "cpu" { unroll(1) }\ntarget "*" { quantize(none) }'))
    rolled, _ = import_generated(rolled_spec, "cpu", tmp_path)
    text = {m: Path(m.__file__).read_text() for m in (unrolled, rolled)}
    assert 'jax.lax.scan(blocks_step, x, params["blocks"], unroll=True)' in text[unrolled]
    assert "# unroll(16) from profile cpu: the cfg.layers steps run unrolled" in text[unrolled]
    assert 'jax.lax.scan(blocks_step, x, params["blocks"])' in text[rolled] and "unroll=True" not in text[rolled]
    gpu, _ = import_generated(spec, "gpu-h100-8", tmp_path)
    assert "unroll=True" not in Path(gpu.__file__).read_text()  # gpu profiles: unroll(0)
    cfg = unrolled.CONFIGS["lm"]
    params = unrolled.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, cfg.vocab)
    want_loss, want_grads = _loss_and_grads(rolled, params, tokens, cfg)
    loss, grads = _loss_and_grads(unrolled, params, tokens, cfg)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-6, rtol=1e-5)


def test_offload_policy_reaches_the_gpu_lowering(spec, tmp_path):
    """Host offload is a no-op on CPU; the cuda lowering must carry the pinned_host transfer."""
    path = spec.parent / "offload.axl"
    path.write_text(SPEC.replace('target "*" { quantize(none) }', """\
target "gpu-*" { remat(offload = [mlp_hidden], save = [context])  quantize(none) }"""))
    m, _ = import_generated(path, "gpu-h100-8", tmp_path)
    saved = Path(m.__file__).read_text()
    assert 'names_which_can_be_offloaded=["mlp_hidden"]' in saved and 'offload_dst="pinned_host"' in saved
    cfg = m.CONFIGS["lm"]
    params = jax.eval_shape(lambda k: m.init_params(cfg, k), jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((2, 17), jnp.int32)
    grad = jax.jit(jax.grad(lambda p, t: m.loss_fn(cfg, p, t)[0]))
    hlo = grad.trace(params, tokens).lower(lowering_platforms=("cuda",)).as_text()
    assert "pinned_host" in hlo


# ----------------------------------------------------------------------------- output
def test_diff_between_targets_shows_the_schedule(in_root):
    diff = diff_targets(Path("specs/llama3_8b.axl"), "gpu-h100", "tpu-v5e")
    assert diff.startswith("--- gpu_h100/kernels.py\n+++ tpu_v5e/kernels.py")
    assert "--- gpu_h100/model.py\n+++ tpu_v5e/model.py" in diff
    assert '+REMAT_POLICY = jax.checkpoint_policies.nothing_saveable' in diff  # fit_remat: none fits one v5e
    assert "+def splash_attention(" in diff and "int8_einsum" in diff and "fp8_einsum" in diff


def test_diff_cli(in_root):
    r = subprocess.run([sys.executable, "-m", "axdsl", "diff", "specs/tiny_llama.axl", "-t", "cpu", "-t", "trn2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "-MESH_SHAPE" not in r.stdout and '+    "fsdp": -1,' in r.stdout
    r = subprocess.run([sys.executable, "-m", "axdsl", "diff", "specs/tiny_llama.axl", "-t", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "exactly two" in r.stderr
