"""Objectives other than next-token (axdsl/objectives/, codegen/emit_objective.py): the generated
model.py's loss_fn for masked_lm, seq2seq and classify, on the small test models in tests/specs,
against numpy cross-entropies. Training them end to end through train.py: tests/test_train_objectives.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np

from axdsl import objectives
from axdsl.build import build_files
from axdsl.ir import nodes as ir
from tests.targets_util import import_model

SPECS = Path(__file__).resolve().parent / "specs"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def test_every_objective_has_one_entry_and_the_templates_name_none():
    """The registry is the objectives' one home: an entry per ObjectiveKind, and the templates'
    jinja tags read its flags, never an objective's name."""
    assert set(objectives.REGISTRY) == set(ir.ObjectiveKind)
    assert all(o.kind is k for k, o in objectives.REGISTRY.items())
    names = "|".join(str(k) for k in ir.ObjectiveKind)
    for template in TEMPLATES.glob("*.j2"):
        tags = re.findall(r"{[%{].*?[%}]}", template.read_text(), re.S)
        named = [t for t in tags if re.search(rf"[\"']({names})[\"']", t)]
        assert not named, (template.name, named)


def model_module(tmp_path: Path, spec: str, train: str):
    """Build tests/specs/<spec>.axl with `train` appended; import its model.py."""
    text = (SPECS / f"{spec}.axl").read_text().replace('import "mlm_tiny.axl"', f'import "{SPECS}/mlm_tiny.axl"')
    path = tmp_path / f"{spec}.axl"
    path.write_text(text + train)
    return import_model(build_files(path, "cpu"), tmp_path / f"{spec}_out")


def ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, labels[..., None], -1)[..., 0]


def test_masked_lm_loss_is_on_masked_positions_only(tmp_path):
    m = model_module(tmp_path, "mlm_tiny", "train {\n  objective = masked_lm(rate = 0.3, mask_token = 1)\n}\n")
    cfg = m.CONFIGS["mlm_tiny"]
    params = m.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, 256, (4, 32)).astype(np.int32)
    segments = np.ones((4, 32), np.int32)
    segments[:, 28:] = 0  # padding is never masked
    batch = {"tokens": tokens, "segments": segments}
    key = jax.random.key(3)
    inputs, selected = map(np.asarray, m.mask_tokens(cfg, tokens, key, segments > 0))
    assert not selected[:, 28:].any() and 0.15 < selected.mean() < 0.45
    assert (inputs[~selected] == tokens[~selected]).all()
    assert (inputs[selected] == 1).mean() > 0.6  # 80% become [MASK]
    _, got = m.loss_fn(cfg, params, batch, key)
    logits = np.asarray(m.forward(cfg, params, inputs, segments))
    want = ce(logits, tokens)[selected].mean()
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_seq2seq_loss_teacher_forcing_excludes_padding(tmp_path):
    m = model_module(tmp_path, "seq2seq_tiny",
                     'train {\n  objective = seq2seq(start_token = 2)\n  data = pairs("s.bin", "t.bin")\n}\n')
    cfg = m.CONFIGS["seq2seq_tiny"]
    params = m.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 256, (2, 16)).astype(np.int32)
    targets = rng.integers(3, 256, (2, 12)).astype(np.int32)
    mask = np.ones((2, 12), np.int32)
    mask[0, 7:] = 0
    batch = {"tokens": tokens, "segments": np.ones_like(tokens), "targets": targets, "dec_segments": mask}
    _, got = m.loss_fn(cfg, params, batch)
    dec = np.concatenate([np.full((2, 1), 2, np.int32), targets[:, :-1]], axis=1)
    logits = np.asarray(m.forward(cfg, params, tokens, np.ones_like(tokens), dec))
    want = ce(logits, targets)[mask == 1].mean()
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_seq2seq_greedy_decoding_passes_inputs_by_name(tmp_path):
    """seq2seq_tiny's forward takes (tokens, segments, dec_tokens), not T5's order: axdsl sample's
    greedy decoder passes each input by name, and every token is the full forward's argmax."""
    from axdsl.sampling import Sampling, generate_seq2seq

    m = model_module(tmp_path, "seq2seq_tiny",
                     'train {\n  objective = seq2seq(start_token = 2)\n  data = pairs("s.bin", "t.bin")\n}\n')
    cfg = m.CONFIGS["seq2seq_tiny"]
    params = m.init_params(cfg, jax.random.key(4))
    source = [5, 9, 7, 3]
    got = list(generate_seq2seq(m, cfg, params, source, 2, 4, Sampling(temperature=0.0),
                                 np.random.default_rng(0)))
    dec = [2]
    for _ in range(4):  # teacher-forced on its own choices: one full forward per token
        tokens = np.asarray([source], np.int32)
        logits = np.asarray(m.forward(cfg, params, tokens, np.ones_like(tokens), np.asarray([dec], np.int32)))
        dec.append(int(logits[0, -1].argmax()))
    assert got == dec[1:]


def test_classify_loss_and_accuracy(tmp_path):
    m = model_module(tmp_path, "classify_tiny", "train {\n  objective = classify(smoothing = 0.1)\n}\n")
    cfg = m.CONFIGS["classify_tiny"]
    params = m.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(2)
    batch = {"images": rng.normal(size=(6, 8, 8, 3)).astype(np.float32), "labels": rng.integers(0, 4, 6)}
    loss, got = m.loss_fn(cfg, params, batch)
    logits = np.asarray(m.forward(cfg, params, batch["images"]))
    np.testing.assert_allclose(float(got), ce(logits, batch["labels"]).mean(), rtol=1e-5)
    assert float(loss) != float(got)  # smoothing changes the loss, not the reported cross-entropy
    np.testing.assert_allclose(float(m.accuracy(cfg, params, batch)),
                               (logits.argmax(-1) == batch["labels"]).mean())


def test_masked_lm_sep_needs_a_segments_input(tmp_path, capsys):
    """masked_lm(sep = ...) packs documents with segment ids: a model without `segments` is told so
    at the objective's line; a model with them builds, and train.py carries the separator."""
    from axdsl.cli import main

    spec = tmp_path / "tok.axl"
    spec.write_text('import "std/transformer.axl"\n'
                    "layer Tok(vocab: int = 64, dim: int = 16) {\n"
                    "  child embed = Embedding()\n"
                    "  param head: [dim, vocab] axes(embed, vocab) init normal(0.02)\n"
                    "  forward(tokens: [B, S]) -> [B, S, vocab] { return embed(tokens) @ head }\n"
                    "}\n"
                    "model tok = Tok {}\n"
                    "train {\n  objective = masked_lm(mask_token = 3, sep = 10)\n}\n")
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "tok.axl:9:3: error: masked_lm(sep = 10) packs documents" in err and "takes no `segments`" in err, err
    spec.write_text((SPECS / "mlm_tiny.axl").read_text().replace('import "std', 'import "std')
                    + "train {\n  objective = masked_lm(mask_token = 3, sep = 10)\n}\n")
    assert "sep: int = 10" in build_files(spec, "cpu")["train.py"]
