"""BERT (std/bert.axl, specs/bert_base.axl) against transformers' BertForMaskedLM.

A tiny random BertForMaskedLM (float32, every tensor randomized so each one's place shows) is
saved with save_pretrained and read by `axdsl import-hf` into the spec's `bert_tiny`; the generated
model's logits equal HF's within 1e-4, for full rows and for padded ones (segments 0 = HF's
attention_mask 0). Export then import is bitwise lossless and transformers loads the export.
`axdsl stats` of bert_base equals BertForMaskedLM(BertConfig()).num_parameters() exactly.
transformers and torch are optional: the tests that need them are skipped without them.
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
SPEC = ROOT / "specs" / "bert_base.axl"
TINY_SPEC = ROOT / "specs" / "bert_tiny.axl"  # the tiny variant and its train block
BERT_BASE_PARAMS = 109_514_298  # BertForMaskedLM(BertConfig()).num_parameters(), transformers 5

# bert_tiny of specs/bert_tiny.axl, as a transformers config
TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
            max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")


def _hf_model(cls: str = "BertForMaskedLM", **overrides):
    """A random transformers BERT with TINY's config; norms near 1, everything else random."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = getattr(transformers, cls)(transformers.BertConfig(**{**TINY, **overrides})).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def _hf_logits(model, tokens, types, mask=None) -> np.ndarray:
    import torch

    kw = {} if mask is None else {"attention_mask": torch.tensor(mask)}
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(types), **kw).logits.numpy()


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


def _inputs(vocab: int, batch: int = 2, seq: int = 16):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (batch, seq))
    types = (np.arange(seq)[None, :] >= rng.integers(4, seq - 4, (batch, 1))).astype(np.int64)
    return tokens, types


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from tests.targets_util import import_generated

    model, _ = import_generated(TINY_SPEC, "cpu", tmp_path_factory.mktemp("gen"))
    return model


@pytest.mark.slow
def test_logits_match_transformers_and_roundtrip(generated, tmp_path, capsys):
    import jax.numpy as jnp
    import torch
    import transformers

    model, cfg = generated, generated.CONFIGS["bert_tiny"]
    hf = _hf_model()
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    assert "`bert_tiny`" in capsys.readouterr().out  # the first model that config.json matches
    params = _restore(model, cfg, tmp_path / "ckpt")

    tokens, types = _inputs(cfg.vocab)
    ones = np.ones_like(tokens)
    ours = np.asarray(model.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(types), jnp.asarray(ones)))
    ref = _hf_logits(hf, tokens, types)
    diff = float(np.abs(ours - ref).max())
    print(f"bert: max |logits - HF logits| = {diff:.2e} (logits std {ref.std():.2f})")
    assert ours.shape == ref.shape == (2, 16, cfg.vocab)
    assert diff < 1e-4

    # padding: segments 0 are HF's attention_mask 0; the real positions' logits agree
    keep = (np.arange(16)[None, :] < np.array([[11], [16]])).astype(np.int64)
    ours = np.asarray(model.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(types), jnp.asarray(keep)))
    ref = _hf_logits(hf, tokens, types, keep)
    padded = float(np.abs(ours - ref)[keep.astype(bool)].max())
    print(f"bert, padded rows: max |logits - HF logits| = {padded:.2e}")
    assert padded < 1e-4

    # export -> import is lossless; transformers loads the export with the same tensors and logits
    out = tmp_path / "export"
    assert axhf.export_hf(TINY_SPEC, tmp_path / "ckpt", out, None) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert axhf.import_hf(TINY_SPEC, out, "bert_tiny", tmp_path / "ckpt2") == 0, capsys.readouterr().err
    again = _restore(model, cfg, tmp_path / "ckpt2")
    for (path, a), (_, b) in zip(_leaves(params), _leaves(again)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), path
    hf2 = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    sd, sd2 = hf.state_dict(), hf2.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    assert np.abs(_hf_logits(hf2, tokens, types) - _hf_logits(hf, tokens, types)).max() <= 1e-6


@pytest.mark.slow
def test_packed_examples_give_each_ones_own_logits(generated, tmp_path, capsys):
    """Two examples packed in one row (segments 1, 2, then padding 0) give the logits transformers
    computes for each alone: attention stays in the segment, positions restart at 0."""
    import jax.numpy as jnp

    model, cfg = generated, generated.CONFIGS["bert_tiny"]
    hf = _hf_model()
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", "bert_tiny", tmp_path / "ckpt") == 0, capsys.readouterr().err
    params = _restore(model, cfg, tmp_path / "ckpt")
    tokens, types = _inputs(cfg.vocab, batch=1)
    segments = np.array([[1] * 6 + [2] * 7 + [0] * 3])
    ours = np.asarray(model.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(types), jnp.asarray(segments)))
    worst = 0.0
    for lo, hi in ((0, 6), (6, 13)):
        alone = _hf_logits(hf, tokens[:, lo:hi], types[:, lo:hi])
        worst = max(worst, float(np.abs(ours[:, lo:hi] - alone).max()))
    print(f"bert, packed rows: max |logits - HF logits of each example alone| = {worst:.2e}")
    assert worst < 1e-4


def test_pretraining_checkpoint_imports_without_pooler_and_nsp_head(generated, tmp_path, capsys):
    """The hub's bert-base-uncased is a BertForPreTraining: its pooler and NSP head are skipped."""
    import jax.numpy as jnp

    model, cfg = generated, generated.CONFIGS["bert_tiny"]
    hf = _hf_model("BertForPreTraining")
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", "bert_tiny", tmp_path / "ckpt") == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "skipped 4 tensors" in err and "bert.pooler.dense.weight" in err and "cls.seq_relationship.bias" in err
    params = _restore(model, cfg, tmp_path / "ckpt")
    tokens, types = _inputs(cfg.vocab)
    ours = np.asarray(model.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(types),
                                    jnp.asarray(np.ones_like(tokens))))
    import torch

    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(tokens), token_type_ids=torch.tensor(types)).prediction_logits.numpy()
    assert np.abs(ours - ref).max() < 1e-4


def test_config_mismatches_are_named(tmp_path, capsys):
    hf = _hf_model(layer_norm_eps=1e-5, hidden_act="gelu_new")
    hf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(TINY_SPEC, tmp_path / "hf", "bert_tiny", tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "layer_norm_eps=1e-05, the spec has norm eps = 1e-12" in err
    assert 'hidden_act="gelu_new", the spec has MLP act = "gelu_exact"' in err
    cfg = {**TINY, "model_type": "bert", "is_decoder": True, "position_embedding_type": "relative_key"}
    problems = axhf.mismatches(axhf.pick(axhf.load_spec(TINY_SPEC), "bert_tiny", TINY_SPEC), "bert", cfg)
    assert "config.json: is_decoder=true (BertMLM is bidirectional) is not supported" in problems
    assert any("position_embedding_type='relative_key'" in p for p in problems)


def test_bert_base_matches_the_published_config_and_parameter_count(in_root):
    """bert-base-uncased's config is BertConfig()'s defaults; its parameter count is transformers'."""
    arch = axhf.pick(axhf.load_spec(Path("specs/bert_base.axl")), "bert_base", SPEC)
    published = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 30522,
                 "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
                 "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    assert axhf.mismatches(arch, "bert", published) == []
    assert axhf.family_of_arch(arch) == "bert"
    r = subprocess.run([sys.executable, "-m", "axdsl", "stats", "specs/bert_base.axl", "--model", "bert_base"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{BERT_BASE_PARAMS:,} total" in r.stdout


def test_bert_base_count_is_transformers_num_parameters():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from axdsl.analysis.flops import param_count
    from axdsl.pipeline import compile_spec

    hf = transformers.BertForMaskedLM(transformers.BertConfig())
    assert hf.num_parameters() == BERT_BASE_PARAMS
    assert param_count(compile_spec(SPEC).models[0]).total == BERT_BASE_PARAMS
