"""run.json, metrics.jsonl and TensorBoard events: what a run writes for `axdsl plot`, `axdsl
sample` and people, with throughput, MFU and the gradient norm.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from axdsl.runtime.files import UnsafePathError, open_append, replace_file
from axdsl.runtime.finetune import param_path
from axdsl.runtime.identity import recorded
from axdsl.runtime.preemption import RunLock
from axdsl.runtime.processes import is_lead


def check_run_dir(run_dir: Path, tc) -> None:
    """Before any data or compute: RUN_DIR is absent or a directory, what a run writes there has
    its kind (a directory of checkpoints, files for metrics.jsonl, run.json and the lock; not a
    symlink as metrics.jsonl, which is appended to: see open_append), and a run.json there is one
    axdsl wrote. Otherwise one line and exit 1, not a traceback at the first save after the whole
    training, nor the user's run.json replaced."""
    problems = []
    if run_dir.exists() and not run_dir.is_dir():
        problems.append(f"--out {run_dir} is a file, not a run directory")
    elif run_dir.is_symlink() and not run_dir.exists():  # mkdir would fail: FileExistsError
        problems.append(f"--out {run_dir} is a link to {os.readlink(run_dir)}, which is not there")
    else:
        kinds = ((tc.checkpoint_dir, True), ("metrics.jsonl", False), ("run.json", False))
        for name, is_dir in kinds + (("lock", False),):
            path = run_dir / name
            if path.exists() and path.is_dir() != is_dir:
                want, got = ("a directory", "a file") if is_dir else ("a file", "a directory")
                problems.append(f"{path} is {got}; a run writes {want} there")
            elif path.exists() and not is_dir and not path.is_file():  # a FIFO blocks the open
                problems.append(f"{path} is a device or a FIFO; a run writes a file there")
            elif name == "metrics.jsonl" and path.is_symlink():  # appended to, never through one
                problems.append(f"{path} is a symlink; a run appends to a file of its own there")
        info = run_dir / "run.json"
        if info.is_file() and not _axdsl_run_json(info):
            problems.append(f"{info} was not written by axdsl")
        problems += _unwritable(run_dir)
    if problems:
        sys.exit("error: " + "; ".join(problems) + ": give --out a new directory or a run's own")


def _unwritable(run_dir: Path) -> list[str]:
    """[] when a file can be made in RUN_DIR (or, before it exists, in its nearest existing
    parent), else why not: tried, since permissions alone do not tell (root, read-only mounts)."""
    where = next((p for p in [run_dir, *run_dir.absolute().parents] if p.exists()), None)
    if where is None:
        return []
    if not where.is_dir():  # --out FILE/run: mkdir would fail (NotADirectoryError)
        return [f"{where} is a file, so {run_dir} cannot be made"]
    try:
        with tempfile.TemporaryFile(dir=where):
            return []
    except OSError as exc:
        return [f"{where} is not writable ({exc.strerror or exc})"]


def _axdsl_run_json(path: Path) -> bool:
    """Whether `path` is a run.json as start_run writes it."""
    info = recorded(path.parent)
    return info is not None and {"package", "spec", "target", "train"} <= info.keys()


# What every train step reports (train.py's train_step); anything else is an objective's own.
STEP_METRICS = frozenset({"loss", "grad_norm", "lr", "ok", "bad_steps"})


def start_run(
    run_dir: Path,
    tc,
    package: str,
    file: str,
    spec: str,
    target: str,
    identity: dict,
    forced: dict | None = None,
    data: dict | None = None,
) -> None:
    """Make RUN_DIR; process 0 writes RUN_DIR/run.json, what runs here, so that `axdsl plot` and
    `axdsl sample` find the code and config, and a resume can check that it continues this run
    (`identity`: see run_identity). `package` and `file`: train.py's `__package__`, `__file__`.
    `data`: figures of the data recorded under "data" (chat data: conversations, cuts, ...).
    Process 0 first takes RUN_DIR/lock (see RunLock): one trainer per run directory.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    if not is_lead():
        return
    RunLock(run_dir).acquire()
    info = {
        "package": package,
        "root": str(Path(file).resolve().parents[len(package.split("."))]),
        "spec": spec,
        "target": target,
        "model": tc.model,
        "train": dataclasses.asdict(tc),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "identity": identity,
    }
    if data is not None:
        info["data"] = data
    # every forced resume of this run stays on record (check_resume: --force-resume)
    earlier = (recorded(run_dir) or {}).get("forced_resumes", [])
    if earlier or forced:
        info["forced_resumes"] = earlier + ([forced] if forced else [])
    replace_file(
        run_dir / "run.json", json.dumps(json_safe(info), indent=2, allow_nan=False) + "\n"
    )


def global_norm(tree, skip=()) -> jax.Array:
    """The L2 norm of all leaves together, in float32 (the gradient norm logged and checked),
    leaving out the parameter paths in `skip`."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return jnp.sqrt(
        sum(
            jnp.sum(jnp.square(x.astype(jnp.float32)))
            for path, x in leaves
            if param_path(path) not in skip
        )
    )


def json_safe(row: dict) -> dict:
    """`row` with every non-finite float (at any depth) replaced by None, the names of those
    values listed under "nonfinite" (e.g. ["loss"], ["train.clip"]): strict JSON, no bare NaN."""
    bad = []

    def clean(value, name: str):
        if isinstance(value, dict):
            return {k: clean(v, f"{name}.{k}" if name else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            bad.append(name)
            return None
        return value

    cleaned = clean({k: v for k, v in row.items() if k != "nonfinite"}, "")
    return (
        {**cleaned, "nonfinite": sorted(set(bad + list(row.get("nonfinite", []))))}
        if bad
        else cleaned
    )


class Throughput:
    """Steps per second between two reports; the first call after a (re)start is compilation."""

    def __init__(self):
        self.mark = None

    def restart(self) -> None:
        self.mark = None

    def exclude(self, seconds: float) -> None:
        """Leave out time spent on something else (an evaluation)."""
        if self.mark is not None:
            self.mark = (self.mark[0], self.mark[1] + seconds)

    def rate(self, step: int) -> float | None:
        now, mark = time.perf_counter(), self.mark
        self.mark = (step, now)
        return None if mark is None or step <= mark[0] else (step - mark[0]) / (now - mark[1])


def open_metrics(path: Path, start: int = 0):
    """metrics.jsonl opened to append; a last line cut short (a kill mid-write) is ended first, so
    that the new rows start on a line of their own and readers skip only the damaged one. A run
    resumed at step `start` first drops the rows of later steps, which a killed process logged
    after its last checkpoint and this run logs again (TensorBoard's purge_step, likewise)."""
    if start and path.is_file():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        kept = [line for line in lines if (_row_step(line) or 0) <= start]
        if len(kept) < len(lines):
            replace_file(path, "".join(line + "\n" for line in kept))
    file = open_append(path, binary=True)
    file.seek(0, os.SEEK_END)
    if file.tell():
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.write(b"\n")
    file.close()
    return open_append(path)


def _row_step(line: str) -> int | None:
    """The step of a metrics.jsonl row; None for a line that is not one (a damaged line)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) else None


TENSORBOARD_DIR = "tensorboard"  # in RUN_DIR: event files for `tensorboard --logdir runs/`
NOT_SCALARS = (
    "step",
    "restored",
    "skipped_update",
    "nonfinite",
)  # metrics.jsonl keys TensorBoard skips


def tensorboard_writer(run_dir: Path, purge_step: int):
    """A tensorboardX SummaryWriter on RUN_DIR/tensorboard. TensorBoard drops
    the events of steps >= purge_step written before: the steps a killed process logged after its
    last checkpoint, which a resumed run logs again. Each step then shows once.

    tensorboardX tries `import torch` (for torch tensors, never given here), which takes seconds
    where torch is installed: torch is hidden from it while it loads.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    # A file of its own, named in time order: tensorboardX names files by the second and overwrites
    # one of the same name, as a rollback reopening the writer at once would.
    suffix = f".{time.time_ns()}"
    return SummaryWriter(
        str(run_dir / TENSORBOARD_DIR), purge_step=purge_step, filename_suffix=suffix
    )


class Mixer(NamedTuple):
    """A sequence mixer's training FLOPs: `per_key` (all its layers) for each key a token reads.

    Attention reads S keys (S / 2 when causal), less those a sliding window of w drops: the
    (S - w)^2 / 2 oldest (query, key) pairs, so a causal window reads about w - w^2 / 2S keys per
    token. An SSD scan in chunks of c computes its whole c x c diagonal blocks: min(c, S) keys.
    """

    per_key: int
    causal: bool = False
    window: int = 0  # a sliding window of this many keys; 0: none
    chunk: int = 0  # > 0: an SSD scan in chunks of this many positions

    def keys(self, seq: int) -> float:
        """The keys a token reads at sequence length `seq`."""
        if self.chunk:
            return min(self.chunk, seq)
        dropped = (seq - min(seq, self.window or seq)) ** 2 / (2 * seq)
        return (seq / 2 if self.causal else seq) - dropped


class ModelFlops(NamedTuple):
    """A model's training FLOPs per token (3 x forward, MaxText's formula) at any sequence length:
    `dense` (matmuls with a parameter, an SSD's chunk states) does not grow with it, the mixers do.
    """

    dense: int
    mixers: tuple[Mixer, ...] = ()

    def per_token(self, seq: int) -> float:
        """Training FLOPs per token of a sequence of `seq` tokens."""
        return self.dense + sum(m.per_key * m.keys(seq) for m in self.mixers)


def sequences_per_row(tc) -> int:
    """Sequences of tc.seq tokens the train step runs for one row of the batch: a preference
    pair (dpo, simpo, orpo) is two, its chosen and its rejected answer; any other row is one.
    Tokens per second, FLOPs and MFU count them all."""
    return 2 if getattr(tc, "data", "") == "preferences" else 1


class MetricsLog:
    """RUN_DIR/metrics.jsonl (one JSON object per line), the same scalars as TensorBoard events
    in RUN_DIR/tensorboard, the progress bar, eval losses and an end-of-run summary on screen.

    Only process 0 writes and prints; the others call the same methods, which then do nothing.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        tc,
        start: int,
        flops: ModelFlops,
        peak_flops: float,
        nominal: bool = False,
    ):
        """Append to args.out/metrics.jsonl; a progress bar from `start` unless --no-progress.
        Says "compiling..." until the first step is dispatched (jit compiles it first).

        flops: the model's training FLOPs per token as a function of the sequence length, for
        TFLOP/s and MFU against `peak_flops`, one chip's peak. A `nominal` peak (the cpu
        profile's, not this machine's) shows and logs the MFU as `mfu_nominal`.
        """
        self.lead = is_lead()
        # Rows of tc.seq tokens; a classifier's rows are images (its FLOPs are per image)
        tokens = hasattr(tc, "seq")
        self.per_row: int = tc.seq * sequences_per_row(tc) if tokens else 1
        self.unit = "tokens" if tokens else "images"
        self.flops_per_step = flops.per_token(self.per_row) * tc.batch * self.per_row
        self.tc, self.peak_flops, self.run_dir, self.start = tc, peak_flops, args.out, start
        self.mfu_key = "mfu_nominal" if nominal else "mfu"
        try:
            self.file = open_metrics(args.out / "metrics.jsonl", start) if self.lead else None
        except UnsafePathError as exc:
            sys.exit(f"error: {exc}")
        # Steps after `start` that an earlier process logged are logged again: TensorBoard drops
        # those.
        self.tensorboard = tensorboard_writer(args.out, start + 1) if self.lead else None
        self.last: dict[str, float] = {}  # the newest loss and eval_loss, for the summary
        disable = not self.lead or args.no_progress or start >= tc.steps  # nothing to train
        self.bar = tqdm(total=tc.steps, initial=start, disable=disable, unit="step")
        self.meter = Throughput()
        self.began = time.perf_counter()
        self.compiling: float | None = self.began  # None once the first step is dispatched
        if self.lead and start < tc.steps:
            self.bar.write("compiling the train step...", file=sys.stderr)

    def write(self, row: dict) -> None:
        """One line of strict JSON: a non-finite value is written as null and named in "nonfinite".
        Its finite numbers also go to TensorBoard (not those of a skipped update); an eval loss is
        printed."""
        if self.file is None or self.tensorboard is None:
            return
        self.file.write(json.dumps(json_safe(row), allow_nan=False) + "\n")
        self.file.flush()
        if row.get("skipped_update"):
            return
        for key, value in row.items():
            if key not in NOT_SCALARS and isinstance(value, (int, float)) and math.isfinite(value):
                self.tensorboard.add_scalar(key, value, row["step"])
                self.last[key] = value
        self.tensorboard.flush()  # as metrics.jsonl: a kill loses no logged step
        if "eval_loss" in row and math.isfinite(row["eval_loss"]):
            self.bar.write(f"step {row['step']}: eval loss {row['eval_loss']:.4f}", file=sys.stderr)

    def steps(self, done: int, n: int, metrics: dict, last: bool = False) -> tuple[int, int] | None:
        """Log the n steps of one call, which ended at step `done` (waits for it): `metrics` holds
        each metric stacked, the call's steps first. Stops after a step that made tc.max_bad_steps
        non-finite steps in a row and returns (that step, the count); None when none did. `last`:
        the call's last step is logged whatever log_every says."""
        report = jax.device_get(metrics)
        rate = self.meter.rate(done)
        for i in range(n):
            at, one = done - n + 1 + i, {key: value[i] for key, value in report.items()}
            self.step(at, one, rate, last=last and i == n - 1)
            if one["bad_steps"] >= self.tc.max_bad_steps:
                return at, int(one["bad_steps"])
        return None

    def step(self, done: int, report: dict, rate: float | None, last: bool = False) -> None:
        """Log step `done`'s metrics: skipped updates always, the rest every log_every steps.
        `rate`: steps per second over the call that ran it (None: not measured)."""
        if not report["ok"]:
            if self.lead:
                print(f"step {done}: non-finite loss or gradient; update skipped", file=sys.stderr)
            self.write(
                {
                    "step": done,
                    "loss": float(report["loss"]),
                    "grad_norm": float(report["grad_norm"]),
                    "skipped_update": True,
                }
            )
            return
        if done % self.tc.log_every and not last:
            return
        row = {
            "step": done,
            "loss": float(report["loss"]),
            "grad_norm": float(report["grad_norm"]),
            "lr": float(report["lr"]),
        }
        # an objective's own metrics (dpo: reward_accuracy, margin, ...), as the step gave them
        row.update({k: float(v) for k, v in report.items() if k not in STEP_METRICS})
        if rate is not None:
            speed = rate * self.tc.batch * self.per_row
            row[f"{self.unit}_per_s"] = speed
            shown = {"tok_s" if self.unit == "tokens" else "img_s": f"{speed:.0f}"}
            if self.flops_per_step:  # 0: FLOPs not counted for this model (no MFU)
                tflops = rate * self.flops_per_step / jax.device_count() / 1e12
                row.update(
                    {"tflops_per_device": tflops, self.mfu_key: tflops * 1e12 / self.peak_flops}
                )
                shown.update({"tflops": f"{tflops:.3g}", self.mfu_key: f"{row[self.mfu_key]:.1%}"})
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", **shown)
        self.write(row)

    def advance(self, n: int) -> None:
        """n more steps on the progress bar (the first call also says how long compiling took)."""
        if self.compiling is not None and self.lead:
            self.bar.write(
                f"compiled in {time.perf_counter() - self.compiling:.1f} s", file=sys.stderr
            )
        self.compiling = None
        self.bar.update(n)

    def restored(self, at: int, bad_steps: int, step: int) -> None:
        """After `bad_steps` bad steps in a row at step `at`, training went back to `step`."""
        if self.lead:
            print(f"{bad_steps} bad steps in a row: restored step {step}", file=sys.stderr)
        self.write({"step": at, "restored": step})
        if self.tensorboard:  # the steps after `step` are logged again: TensorBoard drops them
            self.tensorboard.close()
            self.tensorboard = tensorboard_writer(self.run_dir, step + 1)
        self.bar.n = step
        self.bar.refresh()
        self.meter.restart()

    def exclude(self, seconds: float) -> None:
        """Leave time spent evaluating or checkpointing out of the throughput."""
        self.meter.exclude(seconds)

    @property
    def untimed(self) -> bool:
        """No call has been read since the run (re)started: that call compiled the step, so
        train.py reads it at once, and the throughput of the first logged steps leaves it out."""
        return self.meter.mark is None

    def close(self, summary: bool = True) -> None:
        """Close the files; after a run that reached its last step, print the summary."""
        self.bar.close()
        if self.file and self.tensorboard:
            self.file.close()
            self.tensorboard.close()
            if summary and self.start < self.tc.steps:
                print(self.summary(), file=sys.stderr, flush=True)
            elif summary:  # a rerun of a finished run: it printed nothing, two empty bars
                print(
                    f"{self.run_dir} is already at step {self.start} of {self.tc.steps}: nothing "
                    "to train (a larger --steps goes on, --out another directory starts anew)",
                    file=sys.stderr,
                    flush=True,
                )

    def summary(self) -> str:
        """Steps, tokens, time, final train and eval loss, where the checkpoints and logs are."""
        tc, seconds = self.tc, time.perf_counter() - self.began
        count = (tc.steps - self.start) * tc.batch * self.per_row
        losses = ", ".join(
            f"{name} {self.last[key]:.4f}"
            for key, name in (
                ("loss", "final train loss"),
                ("eval_loss", "eval loss"),
                ("eval_accuracy", "eval accuracy"),
            )
            if key in self.last
        )
        resumed = f" (resumed at {self.start})" if self.start else ""
        return (
            f"done: {tc.steps} steps{resumed}, {count:,} {self.unit} in {seconds:.1f} s"
            f"{', ' + losses if losses else ''}\n"
            f"  checkpoints: {(self.run_dir / tc.checkpoint_dir).absolute()}\n"
            f"  metrics: {self.run_dir / 'metrics.jsonl'}; TensorBoard: tensorboard --logdir "
            f"{self.run_dir / TENSORBOARD_DIR}; plot: axdsl plot {self.run_dir}"
        )
