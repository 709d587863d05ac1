"""The generated training program (generated/tiny_llama/cpu/train.py and variants built from specs):
learning-rate schedules against closed formulas, gradient accumulation against one large batch,
the bad-step guard (in the step, then in the loop with real corrupt data), and learning on the
embedded default data below the data's unigram entropy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from axdsl.build import build_files, write_atomic
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent


def build_package(tmp_path: Path, name: str, text: str):
    """Write spec `name`.axl, build it into tmp_path/generated/<name>/cpu and import its train.py."""
    spec = tmp_path / f"{name}.axl"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "generated" / name / "cpu"
    write_atomic(out, build_files(spec, "cpu"), make_packages=True)
    top = tmp_path / "generated"  # holds runtime.py, which train.py imports as `from ... import runtime`
    alias = "_axdsl_test_" + hashlib.sha256(str(out).encode()).hexdigest()[:12]
    pkg = importlib.util.spec_from_file_location(alias, top / "__init__.py", submodule_search_locations=[str(top)])
    module = importlib.util.module_from_spec(pkg)
    sys.modules[alias] = module
    pkg.loader.exec_module(module)
    return importlib.import_module(f"{alias}.{name}.cpu.train")


def run_train(args: list[str], devices: int, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run generated/tiny_llama/cpu/train.py as its users do, on `devices` fake CPU devices."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "generated.tiny_llama.cpu.train", "--no-progress", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- schedules

LR = 0.01


def closed_form(kind: str, s: int, warmup: int, steps: int, final: float = 0.0, decay: float = 0.0) -> float:
    """The schedules as formulas: linear warmup from 0 over `warmup` steps, then the kind's shape."""
    if s < warmup:
        return LR * s / warmup
    end = LR * final
    if kind == "cosine":
        span = max(steps, warmup + 1) - warmup
        return end + (LR - end) * 0.5 * (1 + math.cos(math.pi * min(s - warmup, span) / span))
    if kind == "linear":
        return LR + (end - LR) * min((s - warmup) / max(steps - warmup, 1), 1.0)
    if kind == "constant":
        return LR
    if kind == "wsd":
        start = max(int(steps * (1 - decay)), warmup)
        return LR if s < start else LR + (end - LR) * min((s - start) / max(steps - start, 1), 1.0)
    if kind == "rsqrt":
        w = max(warmup, 1)
        return LR * math.sqrt(w / max(s, w))
    raise AssertionError(kind)


SCHEDULES = {
    "cosine": ("cosine(warmup = 20, final = 0.1)", {"final": 0.1}),
    "linear": ("linear(warmup = 20, final = 0.05)", {"final": 0.05}),
    "constant": ("constant(warmup = 20)", {}),
    "wsd": ("wsd(warmup = 20, decay = 0.25, final = 0.01)", {"decay": 0.25, "final": 0.01}),
    "rsqrt": ("rsqrt(warmup = 20)", {}),
}
SPEC = """import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 256  dim = 32  layers = 1  heads = 2  kv_heads = 1  ffn = 64  max_seq = 64  dtype = f32
}
"""


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_schedule_matches_closed_form(tmp_path, kind):
    """Every step 0..260 of a 200-step run (and of other warmups and lengths, as flags set them)."""
    import jax.numpy as jnp
    import optax

    text, extra = SCHEDULES[kind]
    tm = build_package(tmp_path, kind, SPEC + f"train {{\n  steps = 200\n  optimizer = adamw(lr = {LR})\n"
                                              f"  schedule = {text}\n}}\n")
    steps = np.arange(0, 261)
    for warmup, total in ((20, 200), (0, 50), (7, 120)):
        tc = dataclasses.replace(tm.TRAIN, warmup=warmup, steps=total)
        got = np.asarray(tm.lr_schedule(tc)(jnp.asarray(steps)))
        want = np.array([closed_form(kind, int(s), warmup, total, **extra) for s in steps])
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9, err_msg=f"{kind} {warmup} {total}")
    if kind == "cosine":  # and optax's own warmup + cosine reference
        ref = optax.warmup_cosine_decay_schedule(0.0, LR, 20, 200, end_value=LR * 0.1)
        np.testing.assert_allclose(np.asarray(tm.lr_schedule(tm.TRAIN)(steps)), ref(steps), rtol=1e-6)
    if kind == "constant":
        ref = optax.join_schedules([optax.linear_schedule(0.0, LR, 20), optax.constant_schedule(LR)], [20])
        np.testing.assert_allclose(np.asarray(tm.lr_schedule(tm.TRAIN)(steps)), ref(steps), rtol=1e-6)


# ----------------------------------------------------------------------------- one step


@pytest.fixture(scope="module")
def tiny():
    """tiny_llama's generated train module on an 8-device mesh: a batch of 32, the initial state and
    the jitted step. warmup 0, so that step 0 really updates; eps 1e-4: see the next test."""
    from generated.tiny_llama.cpu import train as tm

    return _first_step(tm)


def _first_step(tm):
    """(tm, mesh, tc, batch, initial state, jitted step) of a generated train module."""
    import jax

    mesh = tm.make_mesh()
    assert mesh.size == 8
    tc = dataclasses.replace(tm.TRAIN, batch=32, warmup=0, eps=1e-4)
    tokens, _ = tm.runtime.split(tm.runtime.stdlib_bytes(1 << 20))
    with jax.set_mesh(mesh):
        batch = tm.runtime.get_batch(tokens, tc, 0, tm.batch_sharding(mesh))
        state = tm.init_state(tm.CONFIGS[tc.model], tc, mesh, jax.random.key(0))
    return tm, mesh, tc, batch, state, tm.make_train_step(tm.CONFIGS[tc.model], tc, mesh)


def copy(tree):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(jnp.copy, tree)


def max_diff(a, b) -> float:
    import jax

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_microbatches_equal_one_large_batch(tiny):
    """4 accumulated micro-batches of 8 = one batch of 32: gradients and updated params within 1e-6.

    Gradients agree to float32 rounding (about 1e-7 here). Adam's first update is
    lr * g / (|g| + eps), which moves a parameter by up to lr * d / eps for a gradient difference d:
    3e4 * d at the default eps = 1e-8, enough to turn rounding in a near-zero gradient into 1e-6.
    The parameter check therefore runs AdamW with eps = 1e-4, where the update is 3-Lipschitz in
    the gradient, and the gradient check bounds what any eps would see.
    """
    import jax

    tm, mesh, tc, batch, state, step1 = tiny
    cfg, tc4 = tm.CONFIGS[tc.model], dataclasses.replace(tc, microbatches=4)
    with jax.set_mesh(mesh):
        g1, ce1 = jax.jit(lambda p, b: tm.grads_and_loss(cfg, tc, p, b))(state["params"], batch)
        g4, ce4 = jax.jit(lambda p, b: tm.grads_and_loss(cfg, tc4, p, b))(state["params"], batch)
        s1, m1 = step1(copy(state), batch)
        s4, m4 = tm.make_train_step(cfg, tc4, mesh)(copy(state), batch)
    print(f"max |grad difference| {max_diff(g1, g4):.3g}; max |param difference| "
          f"{max_diff(s1['params'], s4['params']):.3g}")
    assert max_diff(g1, g4) <= 1e-6 and abs(float(ce1) - float(ce4)) <= 1e-6
    assert max_diff(s1["params"], state["params"]) > 1e-5  # the step really moved the parameters
    assert max_diff(s1["params"], s4["params"]) <= 1e-6
    assert max_diff(s1["opt_state"], s4["opt_state"]) <= 1e-6
    assert abs(float(m1["loss"]) - float(m4["loss"])) <= 1e-6
    assert abs(float(m1["grad_norm"]) - float(m4["grad_norm"])) <= 1e-6


@pytest.fixture(scope="module")
def tiny_gpu():
    """tiny_llama's gpu-h100 train module (fp8 matmuls, XLA attention: it computes in f32), on
    the same 8 devices: its step skips a bad update with a select (choose_update_skip)."""
    from generated.tiny_llama.gpu_h100 import train as tm

    assert "jnp.where(ok, n, o), updated, old)" in Path(tm.__file__).read_text()
    return _first_step(tm)


@pytest.mark.parametrize("setup", ["tiny", "tiny_gpu"])
def test_non_finite_step_leaves_the_state_alone(setup, request):
    """A token outside the vocabulary makes the loss NaN: the update is skipped, bad_steps counts.
    cpu's step skips it with lax.cond, gpu's with a select of each leaf: both bit for bit."""
    import jax

    tm, mesh, tc, batch, state, step = request.getfixturevalue(setup)
    corrupt = np.asarray(batch).copy()
    corrupt[3, 50] = 300  # vocab is 256
    with jax.set_mesh(mesh):
        bad_batch = jax.device_put(corrupt, tm.batch_sharding(mesh))
        before = jax.device_get(state)
        after, m = step(copy(state), bad_batch)
        assert not bool(m["ok"]) and not np.isfinite(float(m["loss"]))
        assert int(after["step"]) == 1 and int(after["bad_steps"]) == 1
        for x, y in zip(jax.tree.leaves(before["params"]) + jax.tree.leaves(before["opt_state"]),
                        jax.tree.leaves(after["params"]) + jax.tree.leaves(after["opt_state"])):
            assert np.array_equal(x, np.asarray(y))  # bitwise: nothing was touched
        again, m2 = step(after, batch)
        assert bool(m2["ok"]) and int(again["bad_steps"]) == 0 and int(again["step"]) == 2
        assert max_diff(again["params"], before["params"]) > 1e-5


# ----------------------------------------------------------------------------- the loop


def test_a_call_runs_steps_up_to_the_next_event():
    """steps_in_call: calls of up to steps_per_call steps that end exactly at every evaluation,
    checkpoint and the last step (those happen between calls), whatever the alignment."""
    from generated.tiny_llama.cpu import train as tm

    def calls(**settings) -> list[int]:
        tc, step, out = dataclasses.replace(tm.TRAIN, **settings), 0, []
        while step < tc.steps:
            out.append(tm.runtime.steps_in_call(tc, step))
            step += out[-1]
        return out

    assert calls(steps=30, steps_per_call=8, eval_every=10, checkpoint_every=15) == [8, 2, 5, 5, 8, 2]
    assert calls(steps=20, steps_per_call=4, eval_every=0, checkpoint_every=0) == [4] * 5
    assert calls(steps=7, steps_per_call=1, eval_every=2, checkpoint_every=3) == [1] * 7
    assert calls(steps=5, steps_per_call=100, eval_every=0, checkpoint_every=0) == [5]
    tc = dataclasses.replace(tm.TRAIN, steps=1000, steps_per_call=8, eval_every=100, checkpoint_every=64)
    assert all(1 <= tm.runtime.steps_in_call(tc, s) <= 8 for s in range(1000))
    assert not any(tm.runtime.is_event(tc, s + k) for s in range(1000)
                   for k in range(1, tm.runtime.steps_in_call(tc, s)))  # from any step: no event inside a call


@pytest.mark.slow
def test_bad_steps_in_a_row_restore_the_last_checkpoint(tmp_path):
    """Corrupt tokens in the data at the windows of steps 13, 14 and 15 (found from the data order,
    a pure function of seed and step): those updates are skipped and logged; the third in a row
    (max_bad_steps = 3) rolls back to checkpoint 10 and the run goes on with the data after step
    15's. With 8 steps per call (cpu) the limit is reached inside a call (steps 11-18): the steps
    after it in that call are not logged, and they are redone too; with one step per call the run
    is the same, row for row and bit for bit."""
    from generated.tiny_llama.cpu import train as tm

    seq, batch, steps = 32, 8, 30
    tokens = tm.runtime.stdlib_bytes(400_000).astype(np.uint16)
    tc = dataclasses.replace(tm.TRAIN, batch=batch, seq=seq)
    train_part, _ = tm.runtime.split(tokens)
    starts = {i: np.random.default_rng([tc.seed, i]).integers(0, len(train_part) - seq - 1, size=batch)
              for i in range(80)}
    poisoned = [12, 13, 14]  # data indices of updates 13, 14, 15
    for i in poisoned:
        # a label position in row 0's window of data index i that no other window covers
        pos = next(p for p in range(starts[i][0] + 1, starts[i][0] + seq + 1)
                   if all(not (s < p <= s + seq) for j, ss in starts.items() for s in ss if j != i))
        tokens[pos] = 999
    data = tmp_path / "tokens.bin"
    tokens.tofile(data)
    runs = {}
    for calls in (8, 1):  # the cpu target's steps per call, and one step per call: the same run
        run = runs[calls] = tmp_path / f"run{calls}"
        # --no-data-check: the up-front scan would stop the run on the ids >= vocab (tests/test_data_checks.py)
        proc = run_train(["--out", str(run), "--data", str(data), "--no-data-check", "--steps", str(steps),
                          "--batch", str(batch), "--seq", str(seq), "--checkpoint-every", "10", "--log-every", "1",
                          "--eval-every", "0", "--steps-per-call", str(calls)], devices=2)
        rows = metrics(run)
        assert [r["step"] for r in rows if r.get("skipped_update")] == [13, 14, 15]
        assert [r["restored"] for r in rows if "restored" in r] == [10]
        assert "3 bad steps in a row: restored step 10" in proc.stderr
        after = [r for r in rows if "restored" in r][0]
        later = rows[rows.index(after) + 1:]
        assert [r["step"] for r in later if "loss" in r] == list(range(11, steps + 1))  # redone, all good
        assert all(r["loss"] is not None and not r.get("skipped_update") for r in later)
        assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [10, 20, 30]

    from test_resume import assert_bitwise_equal, checkpoint_arrays

    def logged(run: Path) -> list[tuple]:
        return [(r["step"], r.get("loss"), r.get("restored")) for r in metrics(run)]

    assert logged(runs[8]) == logged(runs[1])  # the rollback is a function of the bad step alone
    assert_bitwise_equal(checkpoint_arrays(runs[8], steps), checkpoint_arrays(runs[1], steps))


@pytest.mark.slow
def test_learns_below_unigram_entropy_of_default_data(tmp_path):
    """200 steps of 8 x 128 bytes of the standard library: the held-out loss ends well below the
    entropy of the bytes' unigram distribution (what a model without context could reach)."""
    from generated.tiny_llama.cpu import train as tm

    train_part, _ = tm.runtime.split(tm.runtime.stdlib_bytes())
    p = np.bincount(train_part, minlength=256) / len(train_part)
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())  # nats, like the loss
    run = tmp_path / "run"
    run_train(["--out", str(run), "--steps", "200", "--lr", "3e-3", "--eval-every", "200",
               "--checkpoint-every", "0", "--log-every", "50"], devices=1)
    rows = metrics(run)
    final_eval = [r["eval_loss"] for r in rows if "eval_loss" in r][-1]
    first = next(r["loss"] for r in rows if "loss" in r)
    print(f"unigram entropy {entropy:.3f} nats; first logged loss {first:.3f}; final eval loss {final_eval:.3f}")
    assert 3.0 < entropy < 3.6  # Python source bytes
    assert final_eval < entropy - 0.5
    assert all(k in rows[0] for k in ("tokens_per_s", "tflops_per_device", "mfu_nominal"))  # cpu: a nominal peak


def test_default_data_is_the_standard_library_sources():
    """What the README says: this Python's standard-library .py files, read as bytes (the test
    packages and site-packages left out), in path order, joined by newlines."""
    import sysconfig

    from generated.tiny_llama.cpu import train as tm

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not {"test", "site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    data = tm.runtime.stdlib_bytes()
    expect = b"\n".join(p.read_bytes() for p in files)[: 32 << 20]
    assert data.dtype == np.uint8 and data.tobytes() == expect
    assert len(files) > 500 and len(data) > 5_000_000


def test_loss_fn_returns_the_loss_and_the_cross_entropy():
    """model.loss_fn(cfg, params, tokens, z_loss=...) -> (ce + z_loss * mean(logsumexp ** 2), ce)."""
    import jax
    import jax.numpy as jnp
    import optax

    from generated.tiny_llama.cpu import model

    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (2, 17)), jnp.int32)
    logits = model.forward(cfg, params, tokens[:, :-1])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss, got_ce = model.loss_fn(cfg, params, tokens)
    assert float(loss) == float(got_ce) == float(ce)
    loss, got_ce = model.loss_fn(cfg, params, tokens, z_loss=1e-2)
    z = 1e-2 * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    assert float(got_ce) == float(ce) and float(loss) == float(ce + z) and float(z) > 0
