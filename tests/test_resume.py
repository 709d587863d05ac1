"""Exact resume: a run of generated/tiny_llama/cpu/train.py killed with SIGKILL at a random step and
restarted with the same command ends bitwise identical to an uninterrupted run; a partially
written checkpoint is never restored. Then `axdsl train/plot/sample` (axdsl.runs) end to end.

All runs are subprocesses on 2 fake CPU devices, sharing one compilation cache (`--compile-cache`)
so that only the first one compiles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from axdsl import runs, sampling
from test_preemption import tensorboard_scalars
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
STEPS = 60
ARGS = ["--steps", str(STEPS), "--batch", "8", "--seq", "64", "--checkpoint-every", "10",
        "--log-every", "1", "--eval-every", "0", "--no-progress"]
ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile_cache")


def command(run: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "generated.tiny_llama.cpu.train", *ARGS, "--out", str(run),
            "--compile-cache", str(cache)]


def run_to_end(run: Path, cache: Path) -> str:
    proc = subprocess.run(command(run, cache), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def complete(run: Path) -> list[int]:
    return sorted(int(p.name) for p in (run / "checkpoints").iterdir()
                  if p.name.isdigit() and (p / "commit_success.txt").exists())


def checkpoint_arrays(run: Path, step: int) -> dict[str, np.ndarray]:
    """Every array of the train state saved at `step` (params, optimizer state, counters)."""
    import jax
    import orbax.checkpoint as ocp

    from generated.tiny_llama.cpu import train as tm

    tc, cfg = tm.TRAIN, tm.CONFIGS[tm.TRAIN.model]
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(lambda k: tm.new_state(cfg, tc, k), jax.random.key(0))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore((run / "checkpoints" / str(step) / "state").absolute(), abstract)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def assert_bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), f"{key} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> tuple[Path, dict[str, np.ndarray]]:
    """An uninterrupted run: checkpoints 40, 50, 60 are kept."""
    run = tmp_path_factory.mktemp("reference") / "run"
    run_to_end(run, cache)
    assert complete(run) == [40, 50, 60]
    return run, checkpoint_arrays(run, STEPS)


def last_logged_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):  # a line being written
            pass
    return max(steps)


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_rerun_is_bitwise_identical(tmp_path, reference, cache):
    seed = random.randrange(1 << 30)
    kill_at = random.Random(seed).randint(11, STEPS - 12)
    print(f"seed {seed}: SIGKILL once step {kill_at} is logged and a checkpoint is complete")
    run = tmp_path / "run"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(command(run, cache), cwd=ROOT, env=ENV, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 240
        while not (last_logged_step(run) >= kill_at and (run / "checkpoints").exists() and complete(run)):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at, saved = last_logged_step(run), complete(run)
    print(f"killed after step {killed_at}; complete checkpoints {saved}")
    assert saved and max(saved) < STEPS

    stderr = run_to_end(run, cache)
    assert f"resumed from step {max(saved)}" in stderr
    assert_bitwise_equal(checkpoint_arrays(run, STEPS), reference[1])
    # The steps after the last checkpoint were logged twice, with the same losses.
    logged = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            assert logged.setdefault(row["step"], row["loss"]) == row["loss"]


@pytest.mark.slow
def test_steps_per_call_changes_nothing_but_the_calls(tmp_path, reference, cache):
    """The reference runs 8 steps per jitted call on cpu (calls of 8 and 2 between checkpoints);
    --steps-per-call 1 runs the plain step, one call per step: the final state and every logged
    loss are the same bit for bit. The schedule never changes the result."""
    from generated.tiny_llama.cpu import train as tm

    assert tm.TRAIN.steps_per_call == 8
    run = tmp_path / "run"
    proc = subprocess.run(command(run, cache) + ["--steps-per-call", "1"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_bitwise_equal(checkpoint_arrays(run, STEPS), reference[1])

    def losses(run_dir: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows if "loss" in r]

    assert losses(run) == losses(reference[0]) and len(losses(run)) == STEPS


@pytest.mark.slow
def test_partial_checkpoint_is_never_restored(tmp_path, reference, cache):
    """Checkpoint 60 is cut short (no commit marker, an array file missing) and a save of 60 was
    in flight (orbax's temporary directory): the run resumes from 50, drops both, and redoes
    60 exactly.

    orbax 0.12.8 on a local disk lists every `<step>` directory as finished (its atomic rename
    is the commit) and ignores `<step>.orbax-checkpoint-tmp-*`; the generated code also requires
    `commit_success.txt`, which orbax writes into the temporary directory just before the rename.
    """
    import orbax.checkpoint as ocp

    run = tmp_path / "run"
    shutil.copytree(reference[0], run, ignore=shutil.ignore_patterns("compile_cache"))
    ckpts = run / "checkpoints"
    shutil.copytree(ckpts / "50", ckpts / "60.orbax-checkpoint-tmp-1700000000")
    (ckpts / "60" / "commit_success.txt").unlink()
    data_files = sorted((p for p in (ckpts / "60" / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data_files[-1].unlink()  # the largest array file never made it

    manager = ocp.CheckpointManager(ckpts.absolute())
    assert manager.latest_step() == 60  # orbax alone would pick the partial checkpoint
    manager.close()

    stderr = run_to_end(run, cache)
    assert "checkpoint 60 is damaged: it is incomplete (no commit_success.txt); set aside as" in stderr
    assert (ckpts / "60.damaged" / "state").is_dir()  # kept, never deleted: it may be someone's
    assert "resumed from step 50" in stderr
    assert complete(run) == [40, 50, 60]
    assert not list(ckpts.glob("*tmp*"))
    assert_bitwise_equal(checkpoint_arrays(run, STEPS), reference[1])


# ----------------------------------------------------------------------------- axdsl train, plot, sample


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB pixels) of a PNG, decoded by Pillow (which matplotlib installs)."""
    import io

    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return image.width, image.height, image.tobytes()


def has_color(pixels: bytes, color: tuple[int, int, int]) -> int:
    rgb = np.frombuffer(pixels, np.uint8).reshape(-1, 3)
    return int(np.all(rgb == np.array(color, np.uint8), axis=1).sum())


def test_plot_draws_both_curves(tmp_path):
    rows = [{"step": s, "loss": 5.5 - 0.01 * s, "grad_norm": 1.0, "lr": 1e-3} for s in range(1, 101)]
    rows += [{"step": 50, "eval_loss": 5.1}, {"step": 100, "eval_loss": 4.6}]
    rows += [{"step": 60, "loss": None, "skipped_update": True}, {"step": 60, "restored": 50}]
    rows += [{"step": 100, "loss": 4.0}]  # logged again after a resume: the later value wins
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 10')
    train_loss, eval_loss = runs.read_metrics(tmp_path)
    assert len(train_loss) == 100 and train_loss[-1] == (100, 4.0) and eval_loss == [(50, 5.1), (100, 4.6)]
    assert runs.plot(tmp_path, tmp_path / "chart.png") == 0
    width, height, pixels = read_png((tmp_path / "chart.png").read_bytes())
    assert (width, height) == (800, 480)
    assert has_color(pixels, runs.TRAIN_COLOR) > 500 and has_color(pixels, runs.EVAL_COLOR) > 300
    assert has_color(pixels, runs.LR_COLOR) > 100 and has_color(pixels, runs.THROUGHPUT_COLOR) == 0
    assert has_color(pixels, (0, 0, 0)) > 1000  # axes, labels, title
    assert runs.plot(tmp_path / "nowhere") == 1
    assert runs.plot(tmp_path, tmp_path / "missing" / "chart.png") == 1  # a clean error, no traceback
    assert runs.run_title(tmp_path) == tmp_path.name  # no run.json: the directory names the run
    info = {"spec": "specs/tiny_llama.axl", "target": "cpu", "train": {"model": "tiny_llama"}}
    (tmp_path / "run.json").write_text(json.dumps(info))
    assert runs.run_title(tmp_path) == f"{tmp_path.name}: tiny_llama.axl model tiny_llama on cpu"


@pytest.mark.slow
def test_axdsl_train_plot_sample(tmp_path, monkeypatch, capfd):
    """`axdsl train` from another directory: builds generated/ there, trains, rerunning resumes;
    then the run is plotted and sampled (greedy, and top-k 1, which must equal greedy)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XLA_FLAGS", xla_flags(2))
    spec = ROOT / "specs" / "tiny_llama.axl"
    assert runs.train(spec, "cpu", None, 12, 6) == 0
    run = tmp_path / "runs" / "tiny_llama-cpu"
    assert (tmp_path / "generated" / "tiny_llama" / "cpu" / "train.py").exists()
    info = json.loads((run / "run.json").read_text())
    assert info["package"] == "generated.tiny_llama.cpu" and Path(info["root"]) == tmp_path.resolve()
    assert info["train"]["steps"] == 12 and info["train"]["checkpoint_every"] == 6
    assert complete(run) == [6, 12]
    err = capfd.readouterr().err
    assert "compiling the train step..." in err and "eval loss " in err
    assert f"done: 12 steps, {12 * info['train']['batch'] * info['train']['seq']:,} tokens in " in err
    assert "final train loss " in err and f"checkpoints: {(run / 'checkpoints').absolute()}" in err

    assert runs.train(spec, "cpu", run, 18, 6) == 0  # the same run, further: resumes
    err = capfd.readouterr().err
    assert "resumed from step 12" in err and "built" not in err  # generated/ was already current
    assert complete(run) == [6, 12, 18] and "done: 18 steps (resumed at 12)" in err
    train_loss, eval_loss = runs.read_metrics(run)  # TensorBoard shows the losses metrics.jsonl holds
    assert tensorboard_scalars(run, "loss") == train_loss and tensorboard_scalars(run, "eval_loss") == eval_loss

    assert runs.plot(run, None) == 0
    _, _, pixels = read_png((run / "loss.png").read_bytes())
    assert has_color(pixels, runs.TRAIN_COLOR) > 100  # the train curve
    assert has_color(pixels, runs.EVAL_COLOR) > 50  # evaluations at the last step of each command

    capfd.readouterr()
    assert sampling.sample(run, "def main(", 24, 0.0, None, 0) == 0
    greedy = capfd.readouterr().out
    assert greedy.startswith("def main(") and len(greedy.encode("utf-8", "surrogateescape")) > len("def main(")
    assert sampling.sample(run, "def main(", 24, 1.5, 1, 7) == 0
    assert capfd.readouterr().out == greedy  # top-k 1 is greedy at any temperature
    assert sampling.sample(run, "def main(", 24, 1.0, None, 3) == 0
    a = capfd.readouterr().out
    assert sampling.sample(run, "def main(", 24, 1.0, None, 3) == 0
    assert capfd.readouterr().out == a  # the seed fixes the sample
    assert sampling.sample(tmp_path / "nowhere", "x", 5, 0.0, None, 0) == 1
