"""Preemption, the run lock and strict metrics: generated/tiny_llama/cpu/train.py stopped by SIGTERM
or SIGINT saves the step it is at, prints one line and exits 143 or 130; rerun, it ends bitwise
identical to an uninterrupted run. `axdsl train`'s child (runs.run_child) gets the signals sent to
the parent and never outlives it. One trainer per run directory. metrics.jsonl is strict JSON and
`axdsl plot` reads a damaged one with warnings. Last, the kill loop: SIGKILL and SIGTERM at random
steps and during asynchronous saves, 20 rounds, every final state bitwise identical.

All runs are subprocesses on 2 fake CPU devices with one tiny config (the same --steps, so the same
compiled programs) sharing one compilation cache: only the first run compiles.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from axdsl import runs
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
STEPS = 24
EVERY = 4
ARGS = ["--steps", str(STEPS), "--batch", "8", "--seq", "64", "--checkpoint-every", str(EVERY),
        "--log-every", "1", "--eval-every", "0", "--no-progress"]
ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")
STOP_LINE = "train.py: {name} at step {step}: saved checkpoint {step} in {run}/checkpoints; " \
            "rerun the same command to resume"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile_cache")


def command(run: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "generated.tiny_llama.cpu.train", *ARGS, "--out", str(run),
            "--compile-cache", str(cache)]


def start(run: Path, cache: Path, log: Path, cmd: list[str] | None = None) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(cmd or command(run, cache), cwd=ROOT, env=ENV, stdout=f, stderr=f)


def run_to_end(run: Path, cache: Path) -> str:
    proc = subprocess.run(command(run, cache), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr


def complete(run: Path) -> list[int]:
    folder = run / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()
                  and (p / "commit_success.txt").exists()) if folder.exists() else []


def saving(run: Path) -> bool:
    """Whether an asynchronous save is in flight (orbax's temporary directory exists)."""
    return any((run / "checkpoints").glob("*.orbax-checkpoint-tmp*"))


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


def logged_lines(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def new_steps(run: Path, seen: int) -> list[int]:
    """The steps logged after the first `seen` lines of metrics.jsonl (by the current process)."""
    path, steps = run / "metrics.jsonl", []
    for line in path.read_text().splitlines()[seen:] if path.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return steps


def wait_for(condition, proc: subprocess.Popen, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def final_state(run: Path) -> dict[str, np.ndarray]:
    """Every array of the train state saved at the last step (params, optimizer state, counters)."""
    import jax
    import orbax.checkpoint as ocp

    from generated.tiny_llama.cpu import train as tm

    tc, cfg = tm.TRAIN, tm.CONFIGS[tm.TRAIN.model]
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(lambda k: tm.new_state(cfg, tc, k), jax.random.key(0))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore((run / "checkpoints" / str(STEPS) / "state").absolute(), abstract)
    return {jax.tree_util.keystr(p): np.asarray(leaf) for p, leaf in jax.tree_util.tree_leaves_with_path(state)}


def identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache) -> dict[str, np.ndarray]:
    """The final state of an uninterrupted run."""
    run = tmp_path_factory.mktemp("reference") / "run"
    run_to_end(run, cache)
    assert not (run / "lock").exists()
    return final_state(run)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not training
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- SIGTERM and SIGINT


@pytest.mark.slow
@pytest.mark.parametrize("signum, when", [(signal.SIGTERM, "at step 9"), (signal.SIGINT, "while compiling")])
def test_signal_saves_the_step_exits_and_resumes_bitwise(tmp_path, reference, cache, signum, when):
    """SIGTERM at a step, and Ctrl-C before the first step is done (run.json written, the train
    step compiling): one line, exit 128 + signal, a checkpoint at that step, no traceback, the
    lock released; the rerun resumes there and ends identical to the uninterrupted run."""
    run = tmp_path / "run"
    proc = start(run, cache, tmp_path / "stopped.log")
    ready = (lambda: last_logged_step(run) >= 9) if signum == signal.SIGTERM else (run / "run.json").exists
    wait_for(ready, proc, f"signalling it {when}")
    logged = last_logged_step(run)
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == 128 + signum
    out = (tmp_path / "stopped.log").read_text()
    assert "Traceback" not in out and not (run / "lock").exists()
    saved = max(complete(run))
    # the call in flight, or the one after it (a call runs up to steps_per_call steps, here up to the
    # next checkpoint; a call's rows are written together, the signal may come among them)
    from generated.tiny_llama.cpu import train as tm

    assert logged < saved <= logged + 2 * min(EVERY, tm.TRAIN.steps_per_call)
    progress = ("warning: steps ", "compiling the train step...", "compiled in ")  # warmup note, compile lines
    lines = [line for line in out.strip().splitlines() if not line.startswith(progress)]
    assert lines == [STOP_LINE.format(name=signal.Signals(signum).name, step=saved, run=run)]
    assert last_logged_step(run) == saved  # the pending metrics were written

    assert f"resumed from step {saved}" in run_to_end(run, cache)
    assert identical(final_state(run), reference)


def driver(run: Path, cache: Path) -> list[str]:
    """`axdsl train`'s way to run train.py (runs.run_child), in a process of its own."""
    code = f"import sys; from axdsl import runs; sys.exit(runs.run_child({command(run, cache)!r}))"
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_sigterm_to_axdsl_train_reaches_the_child(tmp_path, cache):
    run = tmp_path / "run"
    parent = start(run, cache, tmp_path / "train.log", driver(run, cache))
    wait_for(lambda: last_logged_step(run) >= 5, parent, "step 5")
    child = json.loads((run / "lock").read_text())["pid"]
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=120) == 143  # the child's exit code, passed on
    assert not alive(child)
    out = (tmp_path / "train.log").read_text()
    assert "Traceback" not in out and "train.py: SIGTERM at step" in out
    assert max(complete(run)) > 5


@pytest.mark.slow
def test_sigkill_of_axdsl_train_stops_the_child(tmp_path, cache):
    """The parent dies without a word (SIGKILL): the child is told (SIGTERM), saves and exits."""
    run = tmp_path / "run"
    parent = start(run, cache, tmp_path / "train.log", driver(run, cache))
    wait_for(lambda: last_logged_step(run) >= 5, parent, "step 5")
    child = json.loads((run / "lock").read_text())["pid"]
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=60)
    deadline = time.monotonic() + 120
    while alive(child):
        assert time.monotonic() < deadline, "the orphaned child kept training"
        time.sleep(0.05)
    assert "train.py: SIGTERM at step" in (tmp_path / "train.log").read_text()
    assert last_logged_step(run) < STEPS and not (run / "lock").exists()


# ----------------------------------------------------------------------------- the run lock


@pytest.mark.slow
def test_second_trainer_is_refused_and_a_stale_lock_taken_over(tmp_path, reference, cache):
    run = tmp_path / "run"
    run.mkdir()
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    (run / "lock").write_text(json.dumps(lock))  # a live trainer: this test's own process
    proc = subprocess.run(command(run, cache), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"in use by pid {os.getpid()} on {socket.gethostname()} since" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["lock"]  # nothing else was written

    (run / "lock").write_text(json.dumps({**lock, "pid": dead_pid()}))
    stderr = run_to_end(run, cache)
    assert "taking over the stale lock of pid" in stderr
    assert not (run / "lock").exists()  # released at the end
    assert identical(final_state(run), reference)


# ----------------------------------------------------------------------------- metrics


def strict(line: str) -> dict:
    def refuse(constant):
        raise AssertionError(f"bare {constant} in {line!r}")

    return json.loads(line, parse_constant=refuse)


def calls(reports: list[dict], most: int) -> dict[str, np.ndarray]:
    """The metrics of one call as train.py reads them: each stacked [most], the steps' first
    (a call of fewer steps leaves zeros after them)."""
    pad = [{key: np.zeros_like(value) for key, value in reports[0].items()}] * (most - len(reports))
    return {key: np.stack([np.asarray(r[key]) for r in reports + pad]) for key in reports[0]}


def test_nonfinite_metrics_are_strict_json(tmp_path):
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    args = SimpleNamespace(out=tmp_path, no_progress=True)
    log = runtime.MetricsLog(args, tm.TRAIN, 0, runtime.ModelFlops(1, (runtime.Mixer(1),)), 1.0)
    bad = {"ok": False, "loss": np.float32("nan"), "grad_norm": np.float32("inf"), "lr": 0.1, "bad_steps": 1}
    assert log.steps(3, 1, calls([bad], 2)) is None  # one step of a call of up to 2
    log.write({"step": 4, "eval_loss": float("nan")})
    log.write({"step": 5, "eval_loss": 2.5})
    log.close()
    rows = [strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 3, "loss": None, "grad_norm": None, "skipped_update": True,
                       "nonfinite": ["grad_norm", "loss"]}
    assert rows[1:] == [{"step": 4, "eval_loss": None, "nonfinite": ["eval_loss"]}, {"step": 5, "eval_loss": 2.5}]
    assert runtime.json_safe({"train": {"clip": math.inf}}) == {"train": {"clip": None}, "nonfinite": ["train.clip"]}
    assert runs.read_metrics(tmp_path) == ([], [(5, 2.5)])


def test_a_calls_rows_end_at_the_step_that_reaches_max_bad_steps(tmp_path):
    """Steps 11-18 in one call, non-finite at 13, 14, 15 (max_bad_steps 3): rows 11-15 are written,
    (15, 3) is returned for the rollback, and 16-18, which ran after it, are not logged."""
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    tc = dataclasses.replace(tm.TRAIN, log_every=1, max_bad_steps=3)
    flops = runtime.ModelFlops(1, (runtime.Mixer(1),))
    log = runtime.MetricsLog(SimpleNamespace(out=tmp_path, no_progress=True), tc, 10, flops, 1.0)
    bad = [0, 0, 1, 2, 3, 0, 0, 0]
    reports = [{"ok": not b, "loss": np.float32(1.0 if not b else "nan"), "grad_norm": 1.0, "lr": 0.01,
                "bad_steps": b} for b in bad]
    assert log.steps(18, 8, calls(reports, 8)) == (15, 3)
    log.close(summary=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [11, 12, 13, 14, 15]
    assert [r["step"] for r in rows if r.get("skipped_update")] == [13, 14, 15]


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard shows it: read by tensorboard's own event reader,
    which applies the purges a resumed run writes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=True).Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_events_match_metrics_after_a_resume(tmp_path, capsys):
    """A run killed at step 8 after its checkpoint of step 5, then resumed: TensorBoard shows each
    step once, with the values metrics.jsonl keeps (the resumed run's); the eval loss is printed
    and the summary comes only from a run that reached its last step."""
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    args = SimpleNamespace(out=tmp_path, no_progress=True)
    tc = dataclasses.replace(tm.TRAIN, steps=10, log_every=1)
    report = lambda loss: {"ok": True, "loss": np.float32(loss), "grad_norm": 1.0, "lr": 0.01, "bad_steps": 0}
    killed = runtime.MetricsLog(args, tc, 0, runtime.ModelFlops(1, (runtime.Mixer(1),)), 1.0)
    assert "compiling" in capsys.readouterr().err
    for end in (4, 8):  # two calls of 4 steps
        killed.steps(end, 4, calls([report(10.0 - step) for step in range(end - 3, end + 1)], 4))
    killed.write({"step": 5, "eval_loss": 6.5})
    killed.close(summary=False)  # as if killed: no summary
    assert "eval loss 6.5000" in capsys.readouterr().err
    resumed = runtime.MetricsLog(args, tc, 5, runtime.ModelFlops(1, (runtime.Mixer(1),)), 1.0)
    for end, n in ((7, 2), (8, 1), (10, 2)):  # calls of up to 4 steps
        resumed.advance(n)
        resumed.steps(end, n, calls([report(20.0 - step) for step in range(end - n + 1, end + 1)], 4))
    resumed.write({"step": 10, "eval_loss": 9.25})
    resumed.close()
    err = capsys.readouterr().err
    assert "compiled in" in err and "done: 10 steps (resumed at 5), " in err
    assert f"{5 * tc.batch * tc.seq:,} tokens" in err and "final train loss 10.0000, eval loss 9.2500" in err
    assert str((tmp_path / tc.checkpoint_dir).absolute()) in err
    train_loss, eval_loss = runs.read_metrics(tmp_path)
    assert train_loss == [(s, 10.0 - s) for s in range(1, 6)] + [(s, 20.0 - s) for s in range(6, 11)]
    assert tensorboard_scalars(tmp_path, "loss") == train_loss
    assert tensorboard_scalars(tmp_path, "eval_loss") == eval_loss == [(5, 6.5), (10, 9.25)]
    assert [s for s, _ in tensorboard_scalars(tmp_path, "lr")] == list(range(1, 11))


def test_plot_reads_a_damaged_metrics_file_with_warnings(tmp_path, capsys):
    good = [json.dumps({"step": s, "loss": 5.0 - 0.1 * s}) for s in range(1, 6)]
    lines = [good[0], good[1], '{"step": 3, "lo', good[2], good[2], "\x00\xff garbage", "[1, 2]",
             '{"loss": 1.0}', '{"step": 6, "loss": NaN}', '{"step": 7, "eval_loss": Infinity}', "",
             '{"step": true, "loss": 1.0}', '{"step": 8, "loss": "x"}', good[3], good[4]]
    (tmp_path / "metrics.jsonl").write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b'\n{"st')
    assert runs.plot(tmp_path, tmp_path / "chart.png") == 0
    err = capsys.readouterr().err
    path = tmp_path / "metrics.jsonl"
    for number in (3, 6, 7, 8, 9, 10, 12, 16):
        assert f"axdsl: warning: {path}:{number}: " in err, number
    assert err.count("warning") == 8 and "Traceback" not in err
    assert runs.read_metrics(tmp_path)[0] == [(s, 5.0 - 0.1 * s) for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("garbage\n")
    assert runs.plot(tmp_path, tmp_path / "chart.png") == 1  # no losses: a clean error


# ----------------------------------------------------------------------------- the kill loop


# 3 chains of 2 killed runs, each chain then resumed to the end (about 45 s in CI, whose suite
# must stay under 30 minutes on 2 cores); AXDSL_KILLS=40 runs a longer soak
KILLS, PER_CHAIN = int(os.environ.get("AXDSL_KILLS", 6)), 2


def kill_once(run: Path, cache: Path, log: Path, rng: random.Random) -> str | None:
    """Start the run and send SIGKILL or SIGTERM at a random step after its newest checkpoint, or
    while an asynchronous save is in flight; what was done, or None when the run ended first."""
    name, how = rng.choice(["SIGKILL", "SIGTERM"]), rng.choice(["step", "save"])
    target = rng.randint(max(complete(run), default=0) + 1, STEPS - 1)
    seen = logged_lines(run)  # the rows this process writes come after these
    proc = start(run, cache, log)

    def ready() -> bool:
        steps = new_steps(run, seen)  # waiting for a first step: the handlers are installed
        return bool(steps) and (saving(run) or max(steps) >= STEPS - 1 if how == "save" else max(steps) >= target)

    deadline = time.monotonic() + 120
    while not ready() and proc.poll() is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)
    in_save = saving(run)
    if proc.poll() is None:
        proc.send_signal(getattr(signal, name))
    code = proc.wait(timeout=120)
    assert "Traceback" not in log.read_text()
    if code == 0:  # it ended before the signal
        return None
    assert code == (-signal.SIGKILL if name == "SIGKILL" else 143), log.read_text()[-4000:]
    return f"{name} {'during an async save' if in_save else f'at step {target}'}"


@pytest.mark.slow
def test_kill_loop_every_final_state_is_bitwise_identical(tmp_path, reference, cache):
    """SIGKILL and SIGTERM at random steps and during asynchronous saves (seeded), KILLS rounds: each
    killed run is rerun with the same command, which the next round kills again, then resumed to
    the end; every run that reaches the end holds exactly the uninterrupted run's final state."""
    seed = int(os.environ.get("AXDSL_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"kill loop seed {seed} (AXDSL_KILL_SEED={seed} repeats it)")
    kills, finals = [], []
    while len(kills) < KILLS:
        run = tmp_path / f"chain{len(finals)}"
        for _ in range(PER_CHAIN):
            if len(kills) == KILLS or max(complete(run), default=0) >= STEPS - 1:
                break
            log = tmp_path / f"round{len(kills)}.log"
            if (what := kill_once(run, cache, log, rng)) is None:
                break
            kills.append(what)
            print(f"round {len(kills)}: {what}")
        run_to_end(run, cache)
        finals.append(identical(final_state(run), reference))
    during_save = sum("save" in k for k in kills)
    print(f"{len(kills)} kills ({during_save} during an async save), {len(finals)} finals, {sum(finals)} identical")
    assert len(kills) == KILLS and all(finals)


def test_ctrl_c_while_jax_loads_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C before anything started (jax takes a second or more to import) prints one line and
    exits 130: nothing to save, no traceback, no run directory half made."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "generated.tiny_llama.cpu.train", *ARGS, "--out", str(run)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)  # past the interpreter's start, inside `import jax`
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip() == "train.py: interrupted while starting; nothing to save"
    assert not (run / "checkpoints").exists()



@pytest.mark.parametrize("before, want", [("signal.signal(signal.SIGHUP, signal.SIG_DFL); ", ["SIGHUP", "True"]),
                                          ("signal.signal(signal.SIGHUP, signal.SIG_IGN); ", ["0", "False"])])
def test_sighup_is_a_preemption_unless_ignored(before, want):
    """A dropped ssh session sends SIGHUP: the trainer's handler takes it like SIGTERM (save at
    the next call boundary, exit 129); before, SIGHUP killed the trainer with nothing saved.
    Under `nohup` (SIGHUP ignored before the trainer starts) a hang-up must not stop the run."""
    code = (f"import os, signal, sys; sys.path.insert(0, sys.argv[1]); from generated import runtime; {before}"
            "p = runtime.Preemption(); p.arm(); os.kill(os.getpid(), signal.SIGHUP); "
            "print(signal.Signals(p.signum).name if p.signum else 0, p.requested)")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == want


def test_a_signal_before_training_began_exits_at_once():
    """Ctrl-C while the data was read or a BPE trained waited for the first step (10 silent
    seconds of BPE, then a compile); before `arm()` there is nothing to save: one line, exit."""
    code = ("import os, signal, sys; sys.path.insert(0, sys.argv[1]); from generated import runtime; "
            "p = runtime.Preemption(); os.kill(os.getpid(), signal.SIGINT); print('not reached')")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 130 and "not reached" not in out.stdout, out
    assert out.stderr.strip() == "train.py: SIGINT before training began; nothing to save"



def test_a_rerun_of_a_finished_run_says_there_is_nothing_to_train(tmp_path, capsys):
    """Rerunning a run already at its last step printed two empty progress bars and no summary;
    it now shows no bar and says so in one line, with the ways on."""
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    tc = dataclasses.replace(tm.TRAIN, steps=10)
    flops = runtime.ModelFlops(1, (runtime.Mixer(1),))
    log = runtime.MetricsLog(SimpleNamespace(out=tmp_path, no_progress=False), tc, 10, flops, 1.0)
    assert log.bar.disable
    log.close()
    err = capsys.readouterr().err
    assert err.strip() == f"{tmp_path} is already at step 10 of 10: nothing to train (a larger --steps goes on, --out another directory starts anew)"
