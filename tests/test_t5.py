"""T5 (std/t5.axl, specs/t5_base.axl) against transformers' T5ForConditionalGeneration.

A tiny random T5 (float32, its own lm_head, every norm randomized) saved with save_pretrained is
imported into specs/t5_tiny.axl's `t5_tiny`; the generated model's logits for given input_ids and
decoder_input_ids match transformers' within 1e-4 (sequences longer than max_distance, so the
log-spaced and the clamped buckets count). Export then import is lossless and transformers loads
the export with the same tensors and logits. flan-t5-base's published config.json matches the
zoo spec field by field, and `axdsl stats` counts its parameters exactly.
A tied T5 (`T5(tied = true)`, T5 v1.0's head as in the original t5-base) imports a
tie_word_embeddings checkpoint with the same logits and parameter count.
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
SPEC = ROOT / "specs" / "t5_base.axl"
TINY_SPEC = ROOT / "specs" / "t5_tiny.axl"  # the tiny variant and its train block

FLAN_T5_BASE = {  # google/flan-t5-base's config.json (task_specific_params left out)
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 768,
    "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1, "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_decoder_layers": 12, "num_heads": 12, "num_layers": 12, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.23.1",
    "use_cache": True, "vocab_size": 32128,
}
FLAN_T5_BASE_PARAMS = 247_577_856  # with its own lm_head: 222,903,552 + 32,128 x 768


def _arch(name: str):
    return axhf.pick(axhf.load_spec(SPEC), name, SPEC)


def test_a_t5_config_against_another_root_is_one_line():
    """A T5 config.json against a spec whose model is not a T5 listed every field as null."""
    arch = {a.name: a for a in axhf.load_spec(ROOT / "specs" / "tiny_llama.axl")}["tiny_llama"]
    assert axhf.mismatches(arch, "t5", FLAN_T5_BASE) == [
        "config.json is a T5ForConditionalGeneration (std's T5), the spec's model is a DecoderLM"]

def test_published_flan_t5_base_config_matches_the_spec():
    arch = _arch("t5_base")
    assert axhf.family_of_config(FLAN_T5_BASE) == "t5" == axhf.family_of_arch(arch)
    assert axhf.mismatches(arch, "t5", FLAN_T5_BASE) == []
    written = json.loads(json.dumps(axhf.hf_config(arch, "t5")))  # what export writes
    assert axhf.mismatches(arch, "t5", written) == []
    assert written["feed_forward_proj"] == "gated-gelu" and written["tie_word_embeddings"] is False
    wrong = {**FLAN_T5_BASE, "relative_attention_num_buckets": 16, "num_decoder_layers": 6}
    problems = axhf.mismatches(arch, "t5", wrong)
    assert "config.json has relative_attention_num_buckets=16, the spec has T5 buckets = 32" in problems
    assert "config.json has num_decoder_layers=6, the spec has T5 dec_layers = 12" in problems
    v10 = {**FLAN_T5_BASE, "feed_forward_proj": "relu", "tie_word_embeddings": True}
    problems = axhf.mismatches(arch, "t5", v10)
    assert 'config.json has feed_forward_proj="relu", the spec has feed-forward layer = "GatedMLP"' in problems
    assert "config.json has tie_word_embeddings=true, the spec has tied = false" in problems


def test_stats_count_flan_t5_base_exactly_as_transformers(in_root):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    r = subprocess.run([sys.executable, "-m", "axdsl", "stats", "specs/t5_base.axl"], capture_output=True,
                       text=True, check=True)
    assert f"parameters        {FLAN_T5_BASE_PARAMS:,} total" in r.stdout
    conf = transformers.T5Config(**{k: v for k, v in FLAN_T5_BASE.items()
                                    if k not in ("architectures", "transformers_version", "torch_dtype")})
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(conf)
    # transformers 5 ties lm_head to `shared` when it builds a T5 (T5Config forces
    # tie_word_embeddings); from_pretrained unties it for flan-t5's checkpoint, whose lm_head differs.
    # transformers 4 builds it untied.
    tied = model.lm_head.weight is model.shared.weight
    assert model.num_parameters() == FLAN_T5_BASE_PARAMS - tied * 32128 * 768
    model.lm_head.weight = torch.nn.Parameter(torch.empty(32128, 768, device="meta"))
    assert model.num_parameters() == FLAN_T5_BASE_PARAMS


def _hf_tiny(cfg):
    """A random T5ForConditionalGeneration of t5_tiny's sizes, with its own lm_head and random norms."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = transformers.T5Config(
        vocab_size=cfg.vocab, d_model=cfg.dim, d_kv=cfg.head_dim, d_ff=cfg.ffn, num_layers=cfg.layers,
        num_decoder_layers=cfg.dec_layers, num_heads=cfg.heads, relative_attention_num_buckets=cfg.buckets,
        relative_attention_max_distance=cfg.max_distance, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, dropout_rate=0.0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(conf).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.randn(cfg.vocab, cfg.dim, generator=gen) / cfg.dim ** 0.5)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1:  # the norms' scales
                p.copy_(1.0 + 0.1 * noise)
            elif "relative_attention_bias" in name:
                p.copy_(noise)
            elif name != "lm_head.weight":
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def _hf_logits(model, tokens, dec_tokens, mask=None, dec_mask=None):
    import torch

    masks = {} if mask is None else {"attention_mask": torch.tensor(mask),
                                     "decoder_attention_mask": torch.tensor(dec_mask)}
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), decoder_input_ids=torch.tensor(dec_tokens),
                     **masks).logits.numpy()


def _restore(model, cfg, path: Path):
    import jax
    import orbax.checkpoint as ocp

    abstract = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path.absolute(), abstract)


@pytest.mark.slow
def test_logits_match_transformers_and_export_roundtrips(tmp_path, capsys):
    pytest.importorskip("transformers")
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from tests.targets_util import import_generated

    model, _ = import_generated(TINY_SPEC, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["t5_tiny"]
    hf = _hf_tiny(cfg)
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    assert "`t5_tiny`" in capsys.readouterr().out  # t5_base's config does not match; t5_tiny's does
    params = _restore(model, cfg, tmp_path / "ckpt")

    rng = np.random.default_rng(0)  # both longer than max_distance (16): every kind of bucket
    tokens, dec_tokens = rng.integers(0, cfg.vocab, (2, 40)), rng.integers(0, cfg.vocab, (2, 37))
    ones, dec_ones = np.ones_like(tokens), np.ones_like(dec_tokens)  # one unpadded example per row
    ours = np.asarray(model.forward(cfg, params, tokens, dec_tokens, ones, dec_ones))
    ref = _hf_logits(hf, tokens, dec_tokens)
    diff = float(np.abs(ours - ref).max())
    print(f"t5: max |logits - HF logits| = {diff:.2e} (logits std {ref.std():.2f})")
    assert ours.shape == ref.shape == (2, 37, cfg.vocab)
    assert diff < 1e-4
    _check_padding_and_packing(model, cfg, params, hf, tokens, dec_tokens)

    out = tmp_path / "export"
    assert axhf.export_hf(TINY_SPEC, tmp_path / "ckpt", out, None) == 0, capsys.readouterr().err
    assert axhf.import_hf(TINY_SPEC, out, "t5_tiny", tmp_path / "ckpt2") == 0, capsys.readouterr().err
    again = _restore(model, cfg, tmp_path / "ckpt2")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    hf2 = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
    sd, sd2 = hf.state_dict(), hf2.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    assert np.abs(_hf_logits(hf2, tokens, dec_tokens) - ref).max() <= 1e-6


def _check_padding_and_packing(model, cfg, params, hf, tokens, dec_tokens):
    """Segments: a padded row equals transformers with attention masks (at the real positions); a row
    packing two examples equals each example run alone."""
    seg = (np.arange(40) < np.array([[40], [29]])).astype(np.int32)  # row 1: 11 padding positions
    dec_seg = (np.arange(37) < np.array([[37], [21]])).astype(np.int32)
    ours = np.asarray(model.forward(cfg, params, tokens, dec_tokens, seg, dec_seg))
    ref = _hf_logits(hf, tokens, dec_tokens, seg, dec_seg)
    real = dec_seg.astype(bool)
    assert np.abs(ours[real] - ref[real]).max() < 1e-4
    # one row: example a (22 + 18 tokens), then example b (18 + 19)
    seg = np.repeat([[1, 2]], [22, 18], axis=1)
    dec_seg = np.repeat([[1, 2]], [18, 19], axis=1)
    packed = np.asarray(model.forward(cfg, params, tokens[:1], dec_tokens[:1], seg, dec_seg))[0]
    for n, (enc, dec) in enumerate(((slice(0, 22), slice(0, 18)), (slice(22, 40), slice(18, 37)))):
        alone = _hf_logits(hf, tokens[:1, enc], dec_tokens[:1, dec])[0]
        assert np.abs(packed[dec] - alone).max() < 1e-4, f"packed example {n}"


@pytest.mark.slow
def test_odd_buckets_fewer_decoder_layers_and_a_head_saved_tied(tmp_path, capsys):
    """10 buckets (transformers floors 10 // 2 // 2 = 2 exact buckets), max distance 20, one decoder
    layer for two encoder layers; the model transformers 5 builds ties lm_head to `shared`, so its
    save_pretrained writes no lm_head: the import takes the head from the embedding."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.targets_util import import_generated

    spec = tmp_path / "odd.axl"
    spec.write_text('import "std/t5.axl"\nmodel odd = T5 { vocab = 64  dim = 32  layers = 2  dec_layers = 1  '
                    'heads = 4  head_dim = 8  ffn = 48  buckets = 10  max_distance = 20  dtype = f32 }\n')
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["odd"]
    conf = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1,
                                 num_heads=4, relative_attention_num_buckets=10, relative_attention_max_distance=20,
                                 feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(conf).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape))
    hf.save_pretrained(tmp_path / "hf")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        if hf.lm_head.weight is hf.shared.weight:  # transformers 5 (4 builds the head untied)
            assert "lm_head.weight" not in f.keys()
    assert axhf.import_hf(spec, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    params = _restore(model, cfg, tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    tokens, dec_tokens = rng.integers(0, 64, (2, 50)), rng.integers(0, 64, (2, 45))
    ours = np.asarray(model.forward(cfg, params, tokens, dec_tokens, np.ones_like(tokens), np.ones_like(dec_tokens)))
    assert np.abs(ours - _hf_logits(hf, tokens, dec_tokens)).max() < 1e-4


def test_tiny_t5_starts_near_log_vocab_with_finite_gradients_through_padding(tmp_path):
    """The generated t5_tiny (cpu): the first cross-entropy is near log(vocab), and every parameter
    gets a finite gradient with padded rows (only real positions in the loss)."""
    import jax
    import jax.numpy as jnp

    from tests.targets_util import import_generated

    model, _ = import_generated(TINY_SPEC, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["t5_tiny"]
    params = model.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens, dec_tokens = rng.integers(0, cfg.vocab, (4, 24)), rng.integers(0, cfg.vocab, (4, 20))
    seg = (np.arange(24) < np.array([[24], [20], [9], [24]])).astype(np.int32)
    dec_seg = (np.arange(20) < np.array([[20], [15], [20], [4]])).astype(np.int32)

    def loss(p):
        logits = model.forward(cfg, p, tokens, dec_tokens, seg, dec_seg)
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(dec_tokens)[..., None], -1)[..., 0]
        return (ce * dec_seg).sum() / dec_seg.sum()

    value, grads = jax.value_and_grad(loss)(params)
    assert abs(float(value) - np.log(cfg.vocab)) < 1.5
    assert all(bool(jnp.isfinite(g).all()) and float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_a_v1_0_config_is_refused_before_any_tensor_is_read(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    conf = transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                 feed_forward_proj="relu")
    conf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", "t5_tiny", tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "does not match model `t5_tiny`" in err
    assert "config.json has scale_decoder_outputs=true, the spec has tied = false" in err
    assert 'config.json has feed_forward_proj="relu", the spec has feed-forward layer = "GatedMLP"' in err
    assert not (tmp_path / "ckpt").exists()


TIED_SPEC = """import "std/t5.axl"

model tied = T5 {
  vocab = 64  dim = 32  layers = 2  dec_layers = 1  heads = 4  head_dim = 8  ffn = 48
  buckets = 10  max_distance = 20  tied = true  dtype = f32
}
"""
V1_0_SPEC = TIED_SPEC.replace("model tied", "model v1_0").replace("f32\n", """f32
  mlp = MLP(hidden = ffn, act = "relu", std = 1 / sqrt(dim), out_std = 1 / sqrt(ffn))
""")  # the original t5-base's structure at toy size (models of one spec share one structure)
T5_BASE = {  # the original t5-base's config.json (T5 v1.0: relu and a tied head, both left to defaults)
    "architectures": ["T5WithLMHeadModel"], "d_ff": 3072, "d_kv": 64, "d_model": 768,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "initializer_factor": 1.0,
    "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_heads": 12, "num_layers": 12, "output_past": True, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "vocab_size": 32128,
}
T5_BASE_PARAMS = 222_903_552  # its lm_head is `shared`


def test_tied_t5_reads_t5_base_style_configs_and_exports_tie_word_embeddings(tmp_path):
    """`T5(tied = true)` (T5 v1.0's head: the embedding, after d_model ** -0.5) has no `head`
    parameter; it matches a config.json whose tie_word_embeddings is true or missing (t5-base's) or
    whose scale_decoder_outputs is true (transformers 5's), and refuses Flan-T5's untied one."""
    spec = tmp_path / "tied.axl"
    spec.write_text(TIED_SPEC)
    arch = axhf.pick(axhf.load_spec(spec), "tied", spec)
    assert ("head",) not in arch.params and arch.facts.tied
    sizes = {"vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2,
             "num_decoder_layers": 1, "num_heads": 4, "relative_attention_num_buckets": 10,
             "relative_attention_max_distance": 20, "feed_forward_proj": "gated-gelu", "model_type": "t5"}
    for tie in ({}, {"tie_word_embeddings": True}, {"tie_word_embeddings": True, "scale_decoder_outputs": True}):
        assert axhf.mismatches(arch, "t5", {**sizes, **tie}) == [], tie
    assert axhf.mismatches(arch, "t5", {**sizes, "tie_word_embeddings": False}) == [
        "config.json has tie_word_embeddings=false, the spec has tied = true"]
    written = axhf.hf_config(arch, "t5")
    assert written["tie_word_embeddings"] is True and axhf.mismatches(arch, "t5", written) == []
    (tmp_path / "v1_0.axl").write_text(V1_0_SPEC)
    v1_0 = axhf.pick(axhf.load_spec(tmp_path / "v1_0.axl"), "v1_0", spec)
    assert ("encoder", "mlp", "w_in") in v1_0.params and v1_0.facts.mlp == "MLP"
    assert axhf.mismatches(v1_0, "t5", {**sizes, "feed_forward_proj": "relu"}) == []
    assert axhf.hf_config(v1_0, "t5")["feed_forward_proj"] == "relu"
    assert axhf.mismatches(arch, "t5", {**sizes, "feed_forward_proj": "relu"}) == [
        'config.json has feed_forward_proj="relu", the spec has feed-forward layer = "GatedMLP"']


def test_the_original_t5_base_config_matches_a_few_lines_and_its_parameter_count(tmp_path):
    """The original t5-base (T5 v1.0) is std's T5 with `tied = true` and a relu MLP: its published
    config.json matches, and the spec counts transformers' parameters exactly; an ungated feed-forward
    std cannot express (gelu, whose erf form std's MLP has not) is still refused."""
    spec = tmp_path / "t5_base_v1_0.axl"
    spec.write_text('import "std/t5.axl"\nmodel t5_v1_0 = T5 {\n  vocab = 32128  dim = 768  layers = 12  '
                    'heads = 12  head_dim = 64  ffn = 3072  tied = true\n'
                    '  mlp = MLP(hidden = ffn, act = "relu", std = 1 / sqrt(dim), out_std = 1 / sqrt(ffn))\n}\n')
    arch = axhf.pick(axhf.load_spec(spec), "t5_v1_0", spec)
    assert axhf.mismatches(arch, "t5", T5_BASE) == []
    assert sum(int(np.prod(shape)) for shape, _ in arch.params.values()) == T5_BASE_PARAMS
    problems = axhf.mismatches(arch, "t5", {**T5_BASE, "feed_forward_proj": "gelu"})
    assert any('feed_forward_proj = "gelu"' in p and "is not supported" in p for p in problems)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = transformers.T5Config(**{k: v for k, v in T5_BASE.items() if k != "architectures"})
    with torch.device("meta"):
        assert transformers.T5ForConditionalGeneration(conf).num_parameters() == T5_BASE_PARAMS


@pytest.mark.slow
def test_tied_t5_v1_0_logits_and_parameter_count_match_transformers(tmp_path, capsys):
    """A tiny T5 v1.0 as the original t5-base (tie_word_embeddings=True: lm_head is `shared`,
    decoder outputs scaled by d_model ** -0.5; the ungated relu feed-forward) imports into
    `T5(tied = true, mlp = MLP(act = "relu"))`: logits within 1e-4 of transformers' float32 ones,
    exactly its parameter count, and an export transformers loads to the same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.targets_util import import_generated

    spec = tmp_path / "v1_0.axl"
    spec.write_text(V1_0_SPEC)
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["v1_0"]
    conf = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1,
                                 num_heads=4, relative_attention_num_buckets=10, relative_attention_max_distance=20,
                                 feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.0)
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(conf).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():  # lm_head is `shared`: named once
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen) if p.ndim == 1
                    else torch.randn(p.shape, generator=gen) / (1.0 if "relative" in name else p.shape[-1] ** 0.5))
    assert hf.lm_head.weight is hf.shared.weight and hf.config.scale_decoder_outputs
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(spec, tmp_path / "hf", "v1_0", tmp_path / "ckpt") == 0, capsys.readouterr().err
    params = _restore(model, cfg, tmp_path / "ckpt")
    import jax

    assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params)) == hf.num_parameters()
    rng = np.random.default_rng(0)
    tokens, dec_tokens = rng.integers(0, 64, (2, 30)), rng.integers(0, 64, (2, 25))
    ref = _hf_logits(hf, tokens, dec_tokens)
    ours = np.asarray(model.forward(cfg, params, tokens, dec_tokens, np.ones_like(tokens), np.ones_like(dec_tokens)))
    print(f"tied t5: max |logits - HF logits| = {np.abs(ours - ref).max():.2e} (logits std {ref.std():.2f})")
    assert np.abs(ours - ref).max() < 1e-4
    assert axhf.export_hf(spec, tmp_path / "ckpt", tmp_path / "export", "v1_0") == 0, capsys.readouterr().err
    hf2 = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "export").eval()
    assert np.abs(_hf_logits(hf2, tokens, dec_tokens) - ref).max() <= 1e-6
