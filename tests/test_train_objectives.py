"""Training beyond next-token, end to end: the generated train.py of specs/bert_tiny.axl (masked_lm),
specs/t5_tiny.axl (seq2seq on packed synthetic pairs) and specs/vit_tiny.axl (classify on synthetic
images) trains below its trivial baseline, and a run killed with SIGKILL after a checkpoint and
restarted ends bitwise identical to an uninterrupted one. Packing is exact: a packed seq2seq row
gives each example the loss it has alone in a row.

Runs are subprocesses on 2 fake CPU devices sharing one compilation cache.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")
SPECS = ("bert_tiny", "t5_tiny", "vit_tiny")


def load(name: str, path: Path):
    """A module of this checkout's generated/ by file path (train.py imports ../../runtime.py)."""
    found = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    found.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runtime():
    return load("objectives_runtime", ROOT / "generated" / "runtime.py")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile_cache")


def command(spec: str, run: Path, cache: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", f"generated.{spec}.cpu.train", "--out", str(run), "--compile-cache",
            str(cache), "--no-progress", *args]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def baseline(spec: str, runtime) -> float:
    """The trivial baseline in nats: the unigram entropy of what is predicted (masked_lm: the
    bytes of the default data; seq2seq: the target tokens), or the label entropy (classify)."""
    if spec == "bert_tiny":
        return entropy(np.bincount(runtime.stdlib_bytes(), minlength=256).astype(float))
    if spec == "t5_tiny":
        tc = type("TC", (), {"synthetic_count": 4096, "synthetic_seed": 0, "eos": 1})  # the spec's default
        _, targets = runtime.synthetic_pairs(tc)
        return entropy(np.bincount(np.concatenate(targets), minlength=256).astype(float))
    return math.log(10)  # vit_tiny: 10 classes drawn uniformly


# Steps of each test run, and its eval loss after them as a fraction of the baseline. masked_lm is
# the slowest: a context-free model reaches about 0.9 x the unigram entropy (a tenth of the selected
# bytes are left as they are), and the tiny BERT has to learn to read its neighbours through learned
# absolute positions, which takes it 250-500 steps (see specs/bert_tiny.axl); its full 1500-step run
# ends near 0.64 x.
STEPS = {"bert_tiny": 500, "t5_tiny": 150, "vit_tiny": 150}
BELOW = {"bert_tiny": 0.88, "t5_tiny": 0.8, "vit_tiny": 0.5}


@pytest.mark.parametrize("spec", SPECS)
def test_tiny_models_train_below_their_baseline(spec, tmp_path, cache, runtime):
    run = tmp_path / "run"
    steps = str(STEPS[spec])
    proc = subprocess.run(command(spec, run, cache, "--steps", steps, "--eval-every", steps), cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(run)
    evals = [r for r in rows if "eval_loss" in r]
    losses = [r["loss"] for r in rows if "loss" in r]
    base = baseline(spec, runtime)
    assert losses[0] > base - 0.1  # starts near or above the baseline
    assert evals[-1]["eval_loss"] < BELOW[spec] * base, (spec, evals[-1], base)
    assert f"done: {steps} steps" in proc.stderr and "eval loss" in proc.stderr
    if spec == "bert_tiny":  # better than always guessing the commonest byte (a space, 29%)
        common = np.bincount(runtime.stdlib_bytes(), minlength=256).max() / len(runtime.stdlib_bytes())
        assert evals[-1]["eval_accuracy"] > common + 0.01 and "eval accuracy" in proc.stderr
    if spec == "vit_tiny":
        assert evals[-1]["eval_accuracy"] > 0.6  # chance is 0.1
        assert "eval accuracy" in proc.stderr and any("images_per_s" in r for r in rows)


def complete(run: Path) -> list[int]:
    root = run / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists()) \
        if root.exists() else []


def state_bytes(run: Path, step: int) -> dict[str, bytes]:
    """Every file of the checkpoint's state, by relative path: bitwise equal states have equal bytes."""
    root = run / "checkpoints" / str(step) / "state"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "ocdbt" not in p.name and p.suffix != ".json"}


def final_params(spec: str, run: Path, step: int) -> dict[str, np.ndarray]:
    """The saved train state's arrays (params, optimizer moments, counters) at `step`."""
    import jax
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        meta = checkpointer.metadata((run / "checkpoints" / str(step) / "state").absolute())
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), tree)
        state = checkpointer.restore((run / "checkpoints" / str(step) / "state").absolute(), abstract)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state)}


@pytest.mark.parametrize("spec", SPECS)
def test_sigkill_and_resume_is_bitwise(spec, tmp_path, cache):
    args = ("--steps", "24", "--batch", "8", "--checkpoint-every", "6", "--eval-every", "12", "--log-every", "1")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    # the uninterrupted run and the one to kill are independent processes: they run side by side
    with open(tmp_path / "reference.log", "w") as ref_log, open(tmp_path / "log", "w") as log:
        uninterrupted = subprocess.Popen(command(spec, reference, cache, *args), cwd=ROOT, env=ENV,
                                         stdout=ref_log, stderr=ref_log)
        child = subprocess.Popen(command(spec, killed, cache, *args), cwd=ROOT, env=ENV, stdout=log, stderr=log)
        deadline = time.monotonic() + 240
        while not [s for s in complete(killed) if s >= 12] and child.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint at step 12 in time"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert uninterrupted.wait(timeout=300) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    assert child.returncode == -signal.SIGKILL, (tmp_path / "log").read_text()[-2000:]
    proc = subprocess.run(command(spec, killed, cache, *args), cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "resumed from step" in proc.stderr, proc.stderr[-3000:]
    want, got = final_params(spec, reference, 24), final_params(spec, killed, 24)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].dtype == got[key].dtype and want[key].tobytes() == got[key].tobytes(), f"{spec}: {key}"
    last = {r["step"]: r for r in metrics(reference) if "loss" in r}[24]
    assert {r["step"]: r for r in metrics(killed) if "loss" in r}[24]["loss"] == last["loss"]
    sample = subprocess.run([sys.executable, "-m", "axdsl", "sample", str(killed), "abc",
                             "--temperature", "0", "--max-tokens", "4"], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=300)
    if spec == "t5_tiny":  # greedy decoding of the prompt as the encoder's input
        assert sample.returncode == 0 and sample.stdout.startswith("abc -> "), sample.stderr[-2000:]
    else:
        assert sample.returncode == 1 and "generates from next_token and seq2seq models" in sample.stderr


def test_pack_pairs_fills_rows_in_order_with_segment_ids(runtime):
    sources = [np.array([5, 6, 1]), np.array([7, 1]), np.array([8, 9, 9, 9, 1])]
    targets = [np.array([6, 5, 1]), np.array([7, 1]), np.array([9, 9, 9, 8, 1])]
    rows = runtime.pack_pairs(sources, targets, seq=6, packed=True)
    np.testing.assert_array_equal(rows["tokens"], [[5, 6, 1, 7, 1, 0], [8, 9, 9, 9, 1, 0]])
    np.testing.assert_array_equal(rows["segments"], [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(rows["targets"], [[6, 5, 1, 7, 1, 0], [9, 9, 9, 8, 1, 0]])
    np.testing.assert_array_equal(rows["dec_segments"], rows["segments"])
    alone = runtime.pack_pairs(sources, targets, seq=6, packed=False)
    assert alone["tokens"].shape == (3, 6) and alone["segments"].max() == 1


def test_packed_seq2seq_rows_give_each_example_its_own_loss(runtime):
    """Two pairs packed in one row: the row's cross-entropy is the token-weighted mean of each pair's
    cross-entropy alone, so segment ids keep the examples apart in all three attentions."""
    import jax

    sys.path.insert(0, str(ROOT))
    from generated.t5_tiny.cpu import model

    cfg = model.CONFIGS["t5_tiny"]
    params = model.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    sources = [np.append(rng.integers(97, 123, n), 1) for n in (9, 6)]
    targets = [s[:-1][::-1].copy() for s in sources]
    targets = [np.append(t, 1) for t in targets]
    packed = runtime.pack_pairs(sources, targets, 32, True)
    assert packed["tokens"].shape[0] == 1  # both in one row
    ces = [float(model.loss_fn(cfg, params, runtime.pack_pairs([s], [t], 32, True))[1])
           for s, t in zip(sources, targets)]
    weights = [len(t) for t in targets]
    want = sum(c * w for c, w in zip(ces, weights)) / sum(weights)
    got = float(model.loss_fn(cfg, params, packed)[1])
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_arrays_data_is_checked_before_the_first_step(tmp_path, cache):
    """arrays(...) with labels out of range is refused with one line, not a traceback."""
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((20, 32, 32, 3), np.float32), labels=np.full(20, 12))
    proc = subprocess.run(command("vit_tiny", tmp_path / "run", cache, "--data", str(bad), "--steps", "2"),
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "labels must be integers in [0, 10)" in proc.stderr, proc.stderr[-2000:]


def test_mlm_rows_start_at_documents_and_pack_them_as_segments(runtime):
    """masked_lm(sep = 10): each row starts just after a separator (or at the stream's start) and
    numbers the documents it packs 1, 2, ...; a separator belongs to the document it ends."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(20, 90, n), 10) for n in rng.integers(2, 9, 200)]
    stream = np.concatenate(docs).astype(np.uint16)
    tc = SimpleNamespace(seed=3, batch=16, seq=12, sep=10)
    rows = runtime.mlm_rows(stream, tc, 5, slice(0, 16), ("tokens", "types", "segments"))
    starts = set(runtime.document_starts(stream, 10, 12).tolist())
    assert 0 in starts and all(s == 0 or stream[s - 1] == 10 for s in starts)
    assert max(starts) <= len(stream) - 12 and len(starts) > 150  # a whole row after each
    for tokens, segments in zip(rows["tokens"], rows["segments"]):
        at = next(s for s in sorted(starts) if np.array_equal(stream[s:s + 12], tokens))
        assert at == 0 or stream[at - 1] == 10
        ends = np.flatnonzero(tokens == 10)
        want = np.ones(12, np.int32)
        for e in ends:
            want[e + 1:] += 1
        np.testing.assert_array_equal(segments, want)
    assert (rows["types"] == 0).all() and rows["segments"].max() > 1
    plain = runtime.mlm_rows(stream, SimpleNamespace(seed=3, batch=16, seq=12, sep=-1), 5, slice(0, 16),
                             ("tokens", "segments"))
    assert (plain["segments"] == 1).all()


def test_packed_mlm_documents_see_only_themselves(runtime):
    """Two documents packed in one bert_tiny row give the logits each gives alone: the segment ids
    from mlm_rows reach attention and restart the positions."""
    import jax.numpy as jnp
    from types import SimpleNamespace

    import jax

    sys.path.insert(0, str(ROOT))
    from generated.bert_tiny.cpu import model

    cfg = model.CONFIGS["bert_tiny"]
    params = model.init_params(cfg, jax.random.key(0))
    stream = np.array([10, 40, 41, 42, 43, 10, 50, 51, 52, 53, 54, 55, 56, 10, 60, 61], np.uint16)
    tc = SimpleNamespace(seed=0, batch=1, seq=12, sep=10)
    row = runtime.mlm_rows(stream, tc, 0, slice(0, 1), ("tokens", "types", "segments"))
    tokens, segments = row["tokens"], row["segments"]
    assert tokens[0, 0] != 10 and segments.max() >= 2
    packed = np.asarray(model.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(row["types"]),
                                      jnp.asarray(segments)))
    for k in np.unique(segments[0]):
        at = np.flatnonzero(segments[0] == k)
        alone = tokens[:, at]
        ones = np.ones_like(alone)
        want = np.asarray(model.forward(cfg, params, jnp.asarray(alone), jnp.asarray(0 * ones), jnp.asarray(ones)))
        np.testing.assert_allclose(packed[:, at], want, atol=2e-5, rtol=2e-5)
