"""ViT (std/vit.axl, specs/vit_base.axl) against transformers' ViTForImageClassification.

A tiny random ViTForImageClassification (float32, every tensor randomized so each one's place
shows) is saved with save_pretrained and read by `axdsl import-hf` into the spec's `vit_tiny`;
the generated model's logits equal HF's within 1e-4 (HF's pixel_values are [B, C, H, W], the
generated forward takes images [B, H, W, C]). Export then import is bitwise lossless and
transformers loads the export. `axdsl stats` of vit_base equals
ViTForImageClassification(ViTConfig(num_labels=1000)).num_parameters() exactly. transformers and
torch are optional: the tests that need them are skipped without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from axdsl import hf as axhf

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "vit_base.axl"
TINY_SPEC = ROOT / "specs" / "vit_tiny.axl"  # the tiny variant and its train block
VIT_BASE_PARAMS = 86_567_656  # ViTForImageClassification(ViTConfig(num_labels=1000)).num_parameters()

# vit_tiny of specs/vit_tiny.axl, as a transformers config
TINY = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=256, layer_norm_eps=1e-12, hidden_act="gelu",
            num_labels=10)


def _hf_model(**overrides):
    """A random ViTForImageClassification with TINY's config; norm scales near 1, the rest random."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**{**TINY, **overrides})).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and "layernorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            elif p.ndim == 4:  # the patch conv [dim, C, p, p]: fan-in C * p * p
                p.copy_(noise / (p[0].numel()) ** 0.5)
            elif p.ndim == 3:  # the class token and position embeddings
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def _pixels(batch: int = 3) -> np.ndarray:
    """Random pixel_values [B, C, H, W], as transformers takes them."""
    s, c = TINY["image_size"], TINY["num_channels"]
    return np.random.default_rng(0).standard_normal((batch, c, s, s)).astype(np.float32)


def _hf_logits(model, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels)).logits.numpy()


def _ours(model, cfg, params, pixels: np.ndarray) -> np.ndarray:
    import jax.numpy as jnp

    images = jnp.asarray(pixels.transpose(0, 2, 3, 1))  # NCHW -> NHWC: channels last
    return np.asarray(model.forward(cfg, params, images))


def _restore(model, cfg, path: Path):
    import jax
    import orbax.checkpoint as ocp

    abstract = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path.absolute(), abstract)


def _leaves(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from tests.targets_util import import_generated

    model, _ = import_generated(TINY_SPEC, "cpu", tmp_path_factory.mktemp("gen"))
    return model


@pytest.mark.slow
def test_logits_match_transformers_and_roundtrip(generated, tmp_path, capsys):
    import torch
    import transformers

    model, cfg = generated, generated.CONFIGS["vit_tiny"]
    hf = _hf_model()
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    assert "`vit_tiny`" in capsys.readouterr().out  # the first model that config.json matches
    params = _restore(model, cfg, tmp_path / "ckpt")

    pixels = _pixels()
    ours, ref = _ours(model, cfg, params, pixels), _hf_logits(hf, pixels)
    diff = float(np.abs(ours - ref).max())
    print(f"vit: max |logits - HF logits| = {diff:.2e} (logits std {ref.std():.2f})")
    assert ours.shape == ref.shape == (3, cfg.classes)
    assert ref.std() > 0.1 and diff < 1e-4

    # export -> import is lossless; transformers loads the export with the same tensors and logits
    out = tmp_path / "export"
    assert axhf.export_hf(TINY_SPEC, tmp_path / "ckpt", out, None) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ViTForImageClassification"]
    assert axhf.import_hf(TINY_SPEC, out, "vit_tiny", tmp_path / "ckpt2") == 0, capsys.readouterr().err
    again = _restore(model, cfg, tmp_path / "ckpt2")
    for (path, a), (_, b) in zip(_leaves(params), _leaves(again)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), path
    hf2 = transformers.AutoModelForImageClassification.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    sd, sd2 = hf.state_dict(), hf2.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    assert np.abs(_hf_logits(hf2, pixels) - ref).max() <= 1e-6


@pytest.mark.slow
def test_import_reads_transformers_in_memory_names(generated, tmp_path, capsys):
    """A state_dict saved as it is (transformers 5's vit.layers.i.attention.q_proj, mlp.fc1, ...)
    imports to the same parameters as save_pretrained's hub names."""
    from safetensors.torch import save_file

    model, cfg = generated, generated.CONFIGS["vit_tiny"]
    hf = _hf_model()
    hf.save_pretrained(tmp_path / "hub")
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "config.json").write_text((tmp_path / "hub" / "config.json").read_text())
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.startswith("vit.layers.0.attention.q_proj") for k in state)
    save_file(state, str(tmp_path / "mem" / "model.safetensors"), metadata={"format": "pt"})
    for name in ("hub", "mem"):
        assert axhf.import_hf(TINY_SPEC, tmp_path / name, "vit_tiny", tmp_path / f"ckpt_{name}") == 0, capsys.readouterr().err
    a, b = _restore(model, cfg, tmp_path / "ckpt_hub"), _restore(model, cfg, tmp_path / "ckpt_mem")
    for (path, x), (_, y) in zip(_leaves(a), _leaves(b)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), path


def test_patch_embedding_is_the_conv(generated):
    """PatchEmbed's split + einsum equals a stride-`patch` convolution (numpy, NHWC) with the
    weight laid out as import-hf lays out transformers' Conv2d [dim, C, p, p]."""
    import jax.numpy as jnp

    model, cfg = generated, generated.CONFIGS["vit_tiny"]
    rng = np.random.default_rng(3)
    p, c, dim, s = cfg.patch, cfg.channels, cfg.dim, cfg.image
    conv = rng.standard_normal((dim, c, p, p)).astype(np.float32)
    bias = rng.standard_normal(dim).astype(np.float32)
    images = rng.standard_normal((2, s, s, c)).astype(np.float32)
    w = conv.transpose(2, 3, 1, 0).reshape(p * p * c, dim)
    ours = np.asarray(model.patch_embed(cfg, {"w": jnp.asarray(w), "b": jnp.asarray(bias)}, jnp.asarray(images)))
    ref = np.zeros((2, s // p, s // p, dim), np.float32)
    for r in range(s // p):
        for q in range(s // p):
            tile = images[:, r * p:(r + 1) * p, q * p:(q + 1) * p, :]  # [B, p, p, C]
            ref[:, r, q] = np.einsum("bijc,dcij->bd", tile, conv) + bias
    assert ours.shape == (2, (s // p) ** 2, dim)
    np.testing.assert_allclose(ours, ref.reshape(2, -1, dim), rtol=1e-5, atol=1e-5)


def test_class_token_goes_in_front_and_head_reads_it(generated):
    """The pad-and-add placement is exactly a concatenation: with every block's residual branches
    zeroed (zero output projections), the logits depend only on the class token + its position."""
    import jax
    import jax.numpy as jnp

    model, cfg = generated, generated.CONFIGS["vit_tiny"]
    params = model.init_params(cfg, jax.random.key(0))
    params["blocks"]["attn"]["wo"] = jnp.zeros_like(params["blocks"]["attn"]["wo"])
    params["blocks"]["mlp"]["w_out"] = jnp.zeros_like(params["blocks"]["mlp"]["w_out"])
    params["head"] = jax.random.normal(jax.random.key(1), params["head"].shape)
    images = jax.random.normal(jax.random.key(2), (2, cfg.image, cfg.image, cfg.channels))
    a = np.asarray(model.forward(cfg, params, images))
    b = np.asarray(model.forward(cfg, params, images * 3.0))
    np.testing.assert_array_equal(a[0], a[1])  # the patches never reach the class token
    np.testing.assert_array_equal(a, b)
    x = params["cls_token"][0] + params["pos_embed"][0]  # the class token's row, then the final norm
    x = (x - x.mean()) / np.sqrt(((x - x.mean()) ** 2).mean() + 1e-12)
    x = x * params["final_norm"]["scale"] + params["final_norm"]["shift"]
    np.testing.assert_allclose(a[0], np.asarray(x @ params["head"] + params["head_b"]), rtol=1e-5, atol=1e-5)


def test_config_mismatches_are_named(tmp_path, capsys):
    """A checkpoint of another image size, eps or label count is refused before any tensor is read."""
    hf = _hf_model(image_size=64, layer_norm_eps=1e-6, num_labels=7)
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", "vit_tiny", tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "config.json has image_size=64, the spec has height = 32" in err
    assert "layer_norm_eps=1e-06, the spec has norm eps = 1e-12" in err
    assert "id2label=7, the spec has classes = 10" in err
    assert not (tmp_path / "ckpt").exists()


def test_vit_base_stats_equal_transformers_num_parameters(in_root):
    r = subprocess.run([sys.executable, "-m", "axdsl", "stats", "specs/vit_base.axl", "--model", "vit_base"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{VIT_BASE_PARAMS:,} total" in r.stdout
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        hf = transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=1000))
    assert hf.num_parameters() == VIT_BASE_PARAMS
    # google/vit-base-patch16-224's config.json (published numbers) matches the spec's vit_base
    arch = axhf.pick(axhf.load_spec(SPEC), "vit_base", SPEC)
    published = dict(image_size=224, patch_size=16, num_channels=3, hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12,
                     qkv_bias=True, model_type="vit", architectures=["ViTForImageClassification"],
                     id2label={str(i): f"LABEL_{i}" for i in range(1000)})
    assert axhf.mismatches(arch, "vit", published) == []
    assert axhf.family_of_arch(arch) == "vit" and axhf.family_of_config(published) == "vit"


@pytest.mark.slow
def test_tiny_model_fits_a_small_batch(generated):
    """Gradients flow through the patch split, the class token's pad and the head: a few Adam
    steps of cross-entropy on 16 labelled images take the loss far below log(classes)."""
    import jax
    import jax.numpy as jnp
    import optax

    model, cfg = generated, generated.CONFIGS["vit_tiny"]
    params = model.init_params(cfg, jax.random.key(0))
    images = jax.random.normal(jax.random.key(1), (16, cfg.image, cfg.image, cfg.channels))
    labels = jnp.arange(16) % cfg.classes

    def loss_fn(p):
        logits = model.forward(cfg, p, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss, grads

    first = None
    for i in range(60):
        params, state, loss, grads = step(params, state)
        if first is None:
            first = float(loss)
        assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    # after the first step (the zero head passes no gradient back) the embeddings learn too
    assert float(jnp.abs(grads["cls_token"]).max()) > 0 and float(jnp.abs(grads["patch_embed"]["w"]).max()) > 0
    assert abs(first - np.log(cfg.classes)) < 1e-3  # the head starts at zero: uniform logits
    assert float(loss_fn(params)) < 0.2 * first


@pytest.mark.slow
def test_rectangular_images_and_other_channel_counts(tmp_path, capsys):
    """height != width (transformers' image_size [h, w]) and 2 channels: import, logits, export."""
    import torch
    import transformers

    from tests.targets_util import import_generated

    spec = tmp_path / "rect.axl"
    spec.write_text('import "std/vit.axl"\nmodel r = VisionTransformer {\n  height = 16  width = 24  patch = 8  '
                    'channels = 2  dim = 32  layers = 1  heads = 2  ffn = 64  classes = 5\n}\n')
    config = transformers.ViTConfig(image_size=[16, 24], patch_size=8, num_channels=2, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=5)
    hf = transformers.ViTForImageClassification(config).eval()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(spec, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["r"]
    params = _restore(model, cfg, tmp_path / "ckpt")
    pixels = np.random.default_rng(0).standard_normal((2, 2, 16, 24)).astype(np.float32)
    diff = float(np.abs(_ours(model, cfg, params, pixels) - _hf_logits(hf, pixels)).max())
    assert diff < 1e-4, diff
    assert axhf.export_hf(spec, tmp_path / "ckpt", tmp_path / "out", None) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["image_size"] == [16, 24]


# A small ViT whose dims every 8-device layout divides, f32 and unquantized so numerics compare;
# tensor parallelism on the cpu target shards heads, the feed-forward and the classes.
TARGETS_SPEC = """\
import "std/vit.axl"

model v = VisionTransformer {
  image = 16  patch = 4  channels = 3  dim = 64  layers = 2  heads = 4  ffn = 128  classes = 16
}

target "cpu-8" {
  mesh(data = 2, fsdp = 2, model = 2)
  rules(heads = model, kv_heads = model, mlp = model, vocab = model)
}
target "*" { quantize(none) }
"""
TARGETS = ("gpu-h100-8", "tpu-v5e-8", "trn2-8", "cpu-8")


@pytest.mark.slow
def test_every_target_computes_the_cpu_logits_and_gradients(tmp_path):
    """The schedules (remat, sharding annotations, data/fsdp/tensor parallel meshes of 8 fake
    devices) never change a ViT's numerics: forward and cross-entropy gradients equal cpu's."""
    import jax
    import jax.numpy as jnp
    import optax

    from tests.targets_util import import_generated

    spec = tmp_path / "v.axl"
    spec.write_text(TARGETS_SPEC)
    ref, _ = import_generated(spec, "cpu", tmp_path)
    cfg = ref.CONFIGS["v"]
    params = ref.init_params(cfg, jax.random.key(0))
    params["head"] = 0.1 * jax.random.normal(jax.random.key(3), params["head"].shape)
    images = jax.random.normal(jax.random.key(1), (8, cfg.image, cfg.image, cfg.channels))
    labels = jnp.arange(8) % cfg.classes

    def grads_of(m, mesh=None):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(m.forward(cfg, p, images), labels).mean()

        fn = jax.jit(jax.value_and_grad(loss))
        if mesh is None:
            return fn(params)
        with jax.set_mesh(mesh):
            return fn(params)

    want_logits = np.asarray(ref.forward(cfg, params, images))
    want_loss, want_grads = grads_of(ref)
    for target in TARGETS:
        m, _ = import_generated(spec, target, tmp_path)
        np.testing.assert_allclose(np.asarray(m.forward(cfg, params, images)), want_logits, atol=1e-5, rtol=1e-5,
                                   err_msg=target)
        loss, grads = grads_of(m, m.make_mesh())
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6, err_msg=target)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-4, err_msg=target)
