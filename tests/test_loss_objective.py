"""objective = loss(): a loss written in the spec, trained by the generated train.py.

The root forward takes batch fields by name and returns one number. A classifier whose loss is
`mean(cross_entropy(logits, labels), B)` gives exactly classify()'s cross-entropy and gradients
on the same parameters and batch; it trains on synthetic images far below the label entropy and
resumes bitwise after SIGKILL; a loss over token rows (the default data) trains too.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.targets_util import import_generated, xla_flags
from tests.test_train_objectives import complete, final_params, metrics

ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")

LAYER = """
layer PixelClassifier(height: int, width: int, channels: int, classes: int, hidden: int = 64) {{
  param w_in: [height, width, channels, hidden] axes(norm, seq, embed, mlp) init normal(0.05)
  param b_in: [hidden] axes(mlp) init zeros
  param w_out: [hidden, classes] axes(mlp, vocab) init normal(0.05)
  forward({args}) -> {result} {{
    h = relu(einsum("B height width channels, height width channels hidden -> B hidden", images, w_in) + b_in)
    logits = h @ w_out
    {ret}
  }}
}}

model pix = PixelClassifier {{ height = 4  width = 4  channels = 3  classes = 10 }}

train {{
  objective = {objective}
  data = synthetic_images(count = 2048, noise = 2.0)
  batch = 32  steps = 200  eval_every = 100  checkpoint(every = 100)
  optimizer = adamw(lr = 3e-3)
}}
"""
EXPLICIT = LAYER.format(args="images: [B, height, width, channels], labels: [B]", result="[1]",
                        ret="return mean(cross_entropy(logits, labels), B)", objective="loss()")
CLASSIFY = LAYER.format(args="images: [B, height, width, channels]", result="[B, classes]",
                        ret="return logits", objective="classify()")


def _spec(tmp: Path, name: str, text: str) -> Path:
    path = tmp / f"{name}.axl"
    path.write_text(text)
    return path


def test_a_loss_written_in_the_spec_equals_classify(tmp_path):
    import jax
    import jax.numpy as jnp

    mine, mine_train = import_generated(_spec(tmp_path, "explicit", EXPLICIT), "cpu", tmp_path / "a")
    ref, _ = import_generated(_spec(tmp_path, "classify", CLASSIFY), "cpu", tmp_path / "b")
    assert mine_train.OBJECTIVE == "loss" and mine_train.BATCHES == "classify"
    assert "objective loss()" in mine.loss_fn.__doc__
    cfg = mine.CONFIGS["pix"]
    params = mine.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = {"images": jnp.asarray(rng.normal(size=(8, 4, 4, 3)), jnp.float32),
             "labels": jnp.asarray(rng.integers(0, 10, 8), jnp.int32)}
    (loss, spec_loss), grads = jax.value_and_grad(lambda p: mine.loss_fn(cfg, p, batch), has_aux=True)(params)
    (_, ce), ref_grads = jax.value_and_grad(lambda p: ref.loss_fn(ref.CONFIGS["pix"], p, batch), has_aux=True)(params)
    assert loss.shape == () and float(loss) == float(spec_loss)
    np.testing.assert_allclose(float(loss), float(ce), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def _train(tmp: Path, spec: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "axdsl", "train", str(spec), "--target", "cpu", *args]


def test_loss_objective_trains_below_the_label_entropy_and_resumes_bitwise(tmp_path):
    spec = _spec(tmp_path, "explicit", EXPLICIT)
    run = tmp_path / "runs" / "explicit-cpu"
    proc = subprocess.run(_train(tmp_path, spec), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run)
    losses = [r["loss"] for r in rows if "loss" in r]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert losses[0] > math.log(10) - 0.2 and evals[-1] < 0.3 * math.log(10), (losses[0], evals)
    assert "done: 200 steps" in proc.stderr

    # SIGKILL after the step-100 checkpoint, then resume: the same state at step 200, bit for bit
    module = [sys.executable, "-m", "generated.explicit.cpu.train", "--no-progress", "--out"]
    killed = tmp_path / "killed"
    with open(tmp_path / "log", "w") as log:
        child = subprocess.Popen(module + [str(killed), "--log-every", "1"], cwd=tmp_path, env=ENV,
                                 stdout=log, stderr=log)
        deadline = time.monotonic() + 240
        while not [s for s in complete(killed) if s >= 100] and child.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint at step 100 in time"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
    resumed = subprocess.run(module + [str(killed), "--log-every", "1"], cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed from step" in resumed.stderr, resumed.stderr[-3000:]
    want, got = final_params("explicit", run, 200), final_params("explicit", killed, 200)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].tobytes() == got[key].tobytes(), key
    sample = subprocess.run([sys.executable, "-m", "axdsl", "sample", str(killed), "x"], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert sample.returncode == 1 and "trained a loss model" in sample.stderr


TOKENS = """
import "std/layers.axl"

# Each position predicts its own byte back through a 16-wide bottleneck: a loss over token rows.
layer Echo(vocab: int = 256, width: int = 16) {
  child embed = Embedding(dim = width)
  param head: [width, vocab] axes(embed, vocab) init normal(0.2)
  forward(tokens: [B, S]) -> [1, 1] {
    return mean(mean(cross_entropy(embed(tokens) @ head, tokens), S), B)
  }
}

model echo = Echo {}

train {
  objective = loss()
  batch = 8  seq = 32  steps = 60  eval_every = 60
  optimizer = adamw(lr = 1e-2)
}
"""


def test_loss_objective_over_token_rows(tmp_path):
    spec = _spec(tmp_path, "echo", TOKENS)
    proc = subprocess.run(_train(tmp_path, spec), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train_py = (tmp_path / "generated" / "echo" / "cpu" / "train.py").read_text()
    assert 'BATCHES = "masked_lm"' in train_py and 'INPUTS = ("tokens",)' in train_py
    rows = metrics(tmp_path / "runs" / "echo-cpu")
    losses = [r["loss"] for r in rows if "loss" in r]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    # ln 256 = 5.55 nats at the start (a uniform guess); about 3.1 after 60 steps
    assert losses[0] > evals[-1] + 1.0 and evals[-1] < 0.65 * math.log(256), (losses[0], evals)
