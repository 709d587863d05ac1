"""`evals = [...]` in a train block and `axdsl eval` on the run it trains (one small training
subprocess): the task scores logged to metrics.jsonl at each evaluation equal what `axdsl eval`
gives for the same checkpoint, and its bits per byte equal a direct forward of those parameters.
The train block's mistakes are located errors.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from axdsl import runs
from axdsl.cli import main
from axdsl.errors import CompileError

ROOT = Path(__file__).resolve().parent.parent
SPEC = """import "std/transformer.axl"

model ev_tiny = DecoderLM {
  vocab = 256  dim = 32  layers = 1  heads = 2  kv_heads = 1  ffn = 64  max_seq = 64
  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}

train {
  batch = 8  seq = 32  steps = 4  log_every = 1  eval_every = 2  eval_batches = 1  seed = 0
  checkpoint(every = 4, async = false)
  EVALS
}
"""
TEXT = "def f(x):\n    return x * 2\n\n\nclass A:\n    pass\n"
CHOICES = [{"context": "x = [1, 2", "choices": ["]", ")"], "gold": 0, "delimiter": ""},
           {"context": "import", "choices": ["os", "(("], "gold": 0}]


@pytest.mark.slow
def test_train_block_evals_are_logged_and_match_axdsl_eval(tmp_path, monkeypatch, capsys):
    import jax.numpy as jnp

    from axdsl import sampling

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "code.txt").write_text(TEXT)
    (tmp_path / "tasks" / "mc.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHOICES))
    (tmp_path / "ev.axl").write_text(SPEC.replace("EVALS", 'evals = ["tasks/mc.jsonl", "tasks/code.txt"]'))
    assert runs.train(Path("ev.axl"), "cpu", Path("runs/ev")) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs/ev/metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r for r in rows if "eval_code_bits_per_byte" in r}
    assert sorted(logged) == [2, 4] and {"eval_mc_acc", "eval_mc_acc_norm"} <= logged[4].keys()
    assert list((tmp_path / "runs/ev/tensorboard").iterdir())  # and TensorBoard, as every metric

    argv = ["eval", "runs/ev", "--task", "tasks/mc.jsonl", "--task", "tasks/code.txt"]
    assert main(argv) == 0, capsys.readouterr().err
    text = json.loads((tmp_path / "runs/ev/evals/code.json").read_text())
    choice = json.loads((tmp_path / "runs/ev/evals/mc.json").read_text())
    assert text["step"] == 4 and text["tokenizer"] == "bytes (UTF-8)" and text["n"] == len(TEXT) - 1
    assert text["metrics"]["bits_per_byte"] == pytest.approx(logged[4]["eval_code_bits_per_byte"], rel=1e-6)
    assert text["metrics"]["perplexity"] == pytest.approx(logged[4]["eval_code_perplexity"], rel=1e-6)
    assert choice["metrics"]["acc"] == logged[4]["eval_mc_acc"]

    loaded = sampling.load_run_model(tmp_path / "runs/ev", "")  # a direct forward, one window
    ids = list(TEXT.encode())
    logits = np.asarray(loaded.model.forward(loaded.cfg, loaded.params, jnp.asarray([ids[:32]])), np.float64)[0]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nats = -logp[np.arange(32), ids[1:33]].sum()
    tail = np.asarray(loaded.model.forward(loaded.cfg, loaded.params, jnp.asarray([ids[32:-1]])), np.float64)[0]
    tail = tail - tail.max(-1, keepdims=True)
    tail -= np.log(np.exp(tail).sum(-1, keepdims=True))
    nats -= tail[np.arange(len(ids) - 33), ids[33:]].sum()
    assert text["metrics"]["bits_per_byte"] == pytest.approx(nats / (math.log(2) * len(TEXT)), rel=1e-4)


@pytest.mark.parametrize("evals,message", [
    ('evals = "tasks/mc.jsonl"', "`evals` takes a non-empty list of task file paths"),
    ("evals = []", "`evals` takes a non-empty list of task file paths"),
    ('evals = ["tasks/mc.csv"]', "`evals` task 'tasks/mc.csv' is neither JSON lines nor a text"),
    ('evals = ["a.txt"]  objective = masked_lm(rate = 0.15, mask_token = 4)',
     "`evals` score next-token models, and this train block's objective is masked_lm"),
])
def test_bad_evals_settings_are_located(evals, message, tmp_path):
    from axdsl.pipeline import compile_spec

    spec = tmp_path / "ev.axl"
    spec.write_text(SPEC.replace("EVALS", evals))
    with pytest.raises(CompileError) as exc:
        compile_spec(spec, "cpu")
    rendered = exc.value.render()
    assert message in rendered and f"{spec}:11:" in rendered, rendered
