"""`axdsl eval` on a training run (one small training subprocess): the run's newest checkpoint is
read through sample's loader and its byte codec, and the bits per byte of a text equal a direct
forward of the same parameters.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from axdsl.cli import main
from tests.test_eval import CHOICES, _write_jsonl

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_byte_level_run_is_scored_on_its_newest_checkpoint(tmp_path, capsys):
    """tiny_llama trained 2 steps: eval reads the run's newest checkpoint through sample's loader
    and the run's byte codec; the text's bits per byte equal a direct forward of the same params
    over one window (the text is shorter than the run's seq 64)."""
    import subprocess
    import sys

    import jax.numpy as jnp

    from axdsl import sampling

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "generated.tiny_llama.cpu.train", "--steps", "2", "--batch", "8",
           "--seq", "64", "--checkpoint-every", "2", "--eval-every", "0", "--no-progress",
           "--out", str(run)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "def f(x):\n    return x * 2\n"
    (tmp_path / "code.txt").write_text(text)
    mc = _write_jsonl(tmp_path / "mc.jsonl", CHOICES[:2])
    gen = _write_jsonl(tmp_path / "gen.jsonl", [{"prompt": "def ", "answer": "?", "until": ["\n"]}])
    argv = [str(run), "--task", str(tmp_path / "code.txt"), "--task", str(mc), "--task", str(gen)]
    assert main(["eval", *argv, "--max-tokens", "4"]) == 0, capsys.readouterr().err
    result = json.loads((run / "evals" / "code.json").read_text())
    assert result["step"] == 2 and result["tokenizer"] == "bytes (UTF-8)"
    assert result["first_token_scored"] is False and result["n"] == len(text) - 1

    loaded = sampling.load_run_model(run, "")
    ids = list(text.encode())
    logits = np.asarray(loaded.model.forward(loaded.cfg, loaded.params, jnp.asarray([ids[:-1]])))[0]
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nats = -float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
    bpb = nats / (math.log(2) * len(text))
    assert result["metrics"]["bits_per_byte"] == pytest.approx(bpb, rel=1e-4)
    assert len(json.loads((run / "evals" / "gen.json").read_text())["items"][0]["ids"]) <= 4
