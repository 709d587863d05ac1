"""Fine-tuning: `axdsl train --init-from HF_DIR` imports a transformers model into the run and
starts from its parameters (fresh optimizer state, step 0); the first loss is the imported model's
own loss on that batch and then falls; `freeze` keeps the named parameters exactly as imported and
gives them no optimizer state; a rerun resumes from the run's own checkpoints. Errors: a freeze
pattern that matches nothing, a freeze of everything, parameters that do not fit the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from axdsl import runs
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
MODEL = """import "std/transformer.axl"

model ft_tiny = DecoderLM {
  vocab = 256  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 128
  rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}
"""
TRAIN = """
train {
  batch = 8  seq = 64  steps = 12  log_every = 1  eval_every = 0  seed = 0
  optimizer = adamw(lr = 3e-3)  schedule = constant(warmup = 0)
  data = tokens("data.bin")
  freeze = "embed/table, blocks/attn/*"
  checkpoint(every = 6, async = false)
}
"""
HF_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                 rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 tie_word_embeddings=False)


def _hf_model(hf_dir: Path):
    """A random tiny LlamaForCausalLM with a sharpened head: its loss is far above log(vocab)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(hf_dir)
    return model


def _hf_loss(model, batch: np.ndarray) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor(batch[:, :-1], dtype=torch.long)).logits.double()
        logp = torch.log_softmax(logits, -1)
        target = torch.tensor(batch[:, 1:], dtype=torch.long)
        return float(-logp.gather(-1, target[..., None]).mean())


def _runtime(project: Path):
    """The project's generated runtime.py, loaded on its own (not as this repo's `generated`)."""
    spec = importlib.util.spec_from_file_location("ft_runtime", project / "generated" / "runtime.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arrays(directory: Path) -> dict[str, np.ndarray]:
    """Every array of an orbax checkpoint directory, as numpy, by its path."""
    import jax
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(directory).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(restore_args=args))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(restored)}


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r.get("loss") is not None}


@pytest.mark.slow
def test_fine_tune_from_a_transformers_model(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XLA_FLAGS", xla_flags(2))
    text = (ROOT / "README.md").read_bytes() + (ROOT / "docs" / "language.md").read_bytes()
    np.frombuffer(text, np.uint8).astype(np.uint16).tofile(tmp_path / "data.bin")
    (tmp_path / "ft.axl").write_text(MODEL + TRAIN)
    hf = _hf_model(tmp_path / "hf")
    run = tmp_path / "runs" / "ft"

    assert runs.train(Path("ft.axl"), "cpu", run, None, None, tmp_path / "hf") == 0
    err = capfd.readouterr().err
    assert "starting from the parameters in" in err
    runtime = _runtime(tmp_path)
    train_tokens, _ = runtime.split(np.fromfile(tmp_path / "data.bin", np.uint16))
    batch = runtime.batch_rows(train_tokens, SimpleNamespace(seed=0, seq=64, batch=8), 0, slice(0, 8))
    reference = _hf_loss(hf, batch)
    losses = _losses(run)
    assert reference > np.log(256) + 1  # the imported model is far from a fresh init's log(vocab)
    assert losses[1] == pytest.approx(reference, abs=1e-4)  # step 1 is the imported model's loss
    assert losses[12] < reference - 1.0  # and fine-tuning lowers it
    with capfd.disabled():  # the figures, for `pytest -s`
        print(f"fine-tune: imported model's loss {reference:.4f}, step 1 {losses[1]:.4f}, step 12 {losses[12]:.4f}")

    imported = _arrays(run / runs.HF_PARAMS)
    final = _arrays(run / "checkpoints" / "12" / "state")
    for key, value in imported.items():
        trained = final["['params']" + key]
        frozen = key.startswith("['embed']['table']") or key.startswith("['blocks']['attn']")
        assert (trained.tobytes() == value.tobytes()) == frozen, key
    # frozen parameters have no optimizer state: AdamW's two moments cover only the trained ones
    n_opt = sum(v.size for k, v in final.items() if k.startswith("['opt_state']") and v.ndim)
    n_trained = sum(v.size for k, v in imported.items()
                    if not (k.startswith("['embed']['table']") or k.startswith("['blocks']['attn']")))
    assert n_opt == 2 * n_trained

    _run_docs_example(tmp_path)

    assert runs.train(Path("ft.axl"), "cpu", run, 18, None, tmp_path / "hf") == 0  # resumes its own
    err = capfd.readouterr().err
    assert "resumed from step 12" in err and "starting from the parameters" not in err
    assert max(_losses(run)) == 18


def _run_docs_example(project: Path) -> None:
    """docs/checkpoints.md's plain-JAX loading example, on this run's params and step 12."""
    text = (ROOT / "docs" / "checkpoints.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    code = (code.replace("tiny_llama-hf/params", "ft/hf_params").replace("tiny_llama-cpu/checkpoints/1000", "ft/checkpoints/12")
            .replace("tiny_llama", "ft_tiny").replace("# tokens: int32 [B, S]", "\nprint(logits.shape)"))
    # this project's generated/, not the one of the checkout the tests run from (also on sys.path)
    code = code.replace("from generated.ft_tiny.cpu import model", "import importlib, importlib.util, sys\n"
                        "spec = importlib.util.spec_from_file_location('ft', 'generated/ft/cpu/__init__.py', "
                        "submodule_search_locations=['generated/ft/cpu'])\n"
                        "sys.modules['ft'] = importlib.util.module_from_spec(spec)\n"
                        "spec.loader.exec_module(sys.modules['ft'])\nmodel = importlib.import_module('ft.model')")
    assert "generated." not in code
    code = "import numpy as np\ntokens = np.zeros((2, 8), np.int32)\n" + code
    r = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "XLA_FLAGS": ""})
    assert r.returncode == 0 and r.stdout.strip().endswith("(2, 8, 256)"), r.stderr[-3000:]


def _build_errors(tmp_path: Path, train: str) -> subprocess.CompletedProcess:
    (tmp_path / "bad.axl").write_text(MODEL + train)
    return subprocess.run([sys.executable, "-m", "axdsl", "check", str(tmp_path / "bad.axl")],
                          capture_output=True, text=True, timeout=120)


def test_freeze_pattern_matching_nothing_is_located(tmp_path):
    r = _build_errors(tmp_path, '\ntrain {\n  freeze = "embed/table, blocks/atn/*"\n}\n')
    assert r.returncode == 1
    assert "bad.axl:9:3: error: freeze pattern `blocks/atn/*` matches no parameter of ft_tiny" in r.stderr
    assert "Traceback" not in r.stderr


def test_freezing_everything_is_an_error(tmp_path):
    r = _build_errors(tmp_path, '\ntrain {\n  freeze = "*"\n}\n')
    assert r.returncode == 1 and "nothing would train" in r.stderr and "bad.axl:9:3" in r.stderr


def test_init_from_must_be_a_path(tmp_path):
    r = _build_errors(tmp_path, "\ntrain {\n  init_from = 3\n}\n")
    assert r.returncode == 1 and "`init_from` takes a non-empty string" in r.stderr


def test_init_from_that_does_not_fit_is_named(tmp_path, monkeypatch, capfd):
    """A params checkpoint of another model: train.py names the first parameter that differs."""
    import jax.numpy as jnp

    from axdsl.hf.checkpoint import save_params

    monkeypatch.chdir(tmp_path)
    np.frombuffer((ROOT / "README.md").read_bytes(), np.uint8).astype(np.uint16).tofile(tmp_path / "data.bin")
    (tmp_path / "ft.axl").write_text(MODEL + TRAIN.replace('  freeze = "embed/table, blocks/attn/*"\n', ""))
    save_params(tmp_path / "other", {"embed": {"table": jnp.zeros((100, 64), jnp.float32)}})
    assert runs.train(Path("ft.axl"), "cpu", tmp_path / "run", 2, None, tmp_path / "other") == 1
    err = capfd.readouterr().err
    assert "does not fit model ft_tiny" in err and "Traceback" not in err
