"""`axdsl train` and `axdsl plot`: run a spec's training program and look at the run.

    train   build generated/<spec>/<target>/ (left alone when unchanged) and run its train.py as a
            subprocess from the directory that holds generated/; rerunning the command resumes.
            A train.py you edited is run as it is, and never rebuilt over: when the spec or
            axdsl changed the other files too, it stops and says what to do
    plot    draw RUN_DIR/metrics.jsonl (train and eval loss, learning rate, tokens/s against step)
            as a PNG with matplotlib's Agg backend (no display needed)
    (sample is axdsl/sampling.py; it finds a run's code through load_run below)

A run directory holds what train.py writes: run.json (package, spec, target, model, train
config), metrics.jsonl and checkpoints/. `plot` and `sample` find the generated code through
run.json. Nothing here imports jax; only `plot` imports matplotlib.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from axdsl.errors import shorten_words
from axdsl.runtime.files import replace_file


def _error(message: str) -> int:
    print(f"axdsl: error: {shorten_words(message)}", file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------- train


def default_run_dir(spec: Path, target: str, model: str | None = None) -> Path:
    """runs/<spec>-<target>, or runs/<spec>-<target>-<model> for a model named with --model: a
    rerun resumes there, and another model of the spec never resumes this one's run. train.py's
    own default is the same (runtime/command_line.py default_run_dir, which imports jax; a test
    holds the two equal), so `python -m ...train` and `axdsl train` resume each other."""
    return Path("runs") / "-".join([spec.stem, target] + ([model] if model else []))


def train(
    spec: Path,
    target: str,
    out: Path | None = None,
    steps: int | None = None,
    checkpoint_every: int | None = None,
    init_from: Path | None = None,
    overrides: dict[str, object] | None = None,
    force_resume: bool = False,
    no_preflight: bool = False,
) -> int:
    """Build `spec` for `target`, then run `python -m generated.<spec>.<target>.train`; its exit
    code.

    The command runs in the current directory (the one holding generated/), with its output
    streamed; the run directory defaults to runs/<spec>-<target>, and rerunning resumes there.
    A train.py the user edited (see `build.edited_files`) is kept and run as it is; if the rest of
    the output is out of date as well, nothing is rebuilt and the exit code is 1. `init_from`, a
    Hugging Face model directory, is imported once into RUN_DIR/hf_params (see `hf_init_params`).
    `overrides` (steps, batch, seq, lr, checkpoint_every, data) become train.py's flags of those
    names.
    """
    from axdsl import build

    files = build.build_files(spec, target)
    out_dir = build.default_out_dir(spec, target)
    if "train.py" not in files:
        return _error(
            f"{spec}: there is no train.py to run: its first model's forward is not tokens [B, S] "
            "-> logits [B, S, vocab] (next_token) and the train block names no objective it fits "
            "(objective = masked_lm(...), seq2seq(...) or classify(): see docs/language.md)"
        )
    files, edits = build.keep_edits(out_dir, files)
    inits = [out_dir.parent.parent / "__init__.py", out_dir.parent / "__init__.py"]
    stale = build.diff_against(out_dir, files) or not all(p.exists() for p in inits)
    if stale and edits:
        return _error(
            f"{out_dir}/train.py has your edits and the rest of the output is out of date "
            f"with {spec} or axdsl: not rebuilding. Run `axdsl build {spec} --target {target}` "
            "(it keeps your train.py and shows what a fresh one would change), or add --force "
            "to replace your train.py; then train again"
        )
    if stale:
        build.write_atomic(out_dir, files, make_packages=True)
        print(f"built {out_dir}/", file=sys.stderr)
    if edits:
        print(f"running your edited {out_dir}/train.py", file=sys.stderr)
    run_dir = out if out is not None else default_run_dir(spec, target)
    cmd = [sys.executable, "-m", ".".join(out_dir.parts) + ".train", "--out", str(run_dir)]
    flags = {"steps": steps, "checkpoint_every": checkpoint_every, **(overrides or {})}
    for name, value in flags.items():
        if value is not None:
            cmd += ["--" + name.replace("_", "-"), str(value)]
    if init_from is not None:
        if (init_from / "config.json").exists() and (
            code := hf_init_params(spec, init_from, run_dir)
        ):
            return code
        params = run_dir / HF_PARAMS if (init_from / "config.json").exists() else init_from
        cmd += ["--init-from", str(params.absolute())]
    cmd += ["--force-resume"] if force_resume else []
    cmd += ["--no-preflight"] if no_preflight else []
    print("running " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    return run_child(cmd)


HF_PARAMS = "hf_params"  # in a run directory: the parameters imported from --init-from HF_DIR


def hf_init_params(spec: Path, hf_dir: Path, run_dir: Path) -> int:
    """Import `hf_dir` into RUN_DIR/hf_params for a fine-tuning run; 0 when done or already there
    (a rerun resumes and reads its own checkpoints). The import's exit code otherwise.

    The import runs as `axdsl import-hf` in a child process: this one never imports jax, so
    starting the trainer after it forks no multithreaded process (jax warned of a deadlock)."""
    if (run_dir / HF_PARAMS).exists():
        return 0
    out = run_dir / HF_PARAMS
    return run_child(
        [sys.executable, "-m", "axdsl", "import-hf", str(spec), str(hf_dir), "--out", str(out)]
    )


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_child(cmd: list[str]) -> int:
    """Run `cmd` and return its exit code (128 + N when killed by signal N, as shells report it).

    The child runs in its own process group, so a terminal's Ctrl-C reaches it once, through
    here: SIGTERM, SIGINT and SIGHUP sent to this process are forwarded to it, and its exit
    (143 after a SIGTERM, once its checkpoint is saved) is waited for. On Linux the child gets
    SIGTERM if this process dies, even by SIGKILL (prctl PR_SET_PDEATHSIG): never orphaned.
    """
    proc = subprocess.Popen(cmd, process_group=0, preexec_fn=_die_with_parent(os.getpid()))
    forward = threading.current_thread() is threading.main_thread()  # where Python allows handlers
    forwarded = [
        s for s in FORWARDED if forward and signal.getsignal(s) is not signal.SIG_IGN
    ]  # nohup: stays ignored
    previous = {s: signal.signal(s, lambda signum, _: proc.send_signal(signum)) for s in forwarded}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _die_with_parent(parent: int):
    """A preexec_fn for Popen: ask Linux to SIGTERM the child when `parent` dies (None
    elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None

    def arrange() -> None:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(143)

    return arrange


# ----------------------------------------------------------------------------- plot


def read_metrics(run_dir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(train losses, eval losses) as sorted (step, value) pairs from RUN_DIR/metrics.jsonl."""
    series = read_series(run_dir)
    return series["loss"], series["eval_loss"]


# What `plot` draws, as metrics.jsonl names them (an image classifier logs images_per_s)
SERIES = ("loss", "eval_loss", "lr", "tokens_per_s", "images_per_s")


def read_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each of SERIES as sorted (step, value) pairs from RUN_DIR/metrics.jsonl.

    A resumed run logs again the steps after its last checkpoint: the later value of a step wins.
    Skipped (non-finite) steps and null values are left out. A damaged line (cut short by a kill,
    not JSON, not an object, no integer step, a non-finite number) is skipped with a warning that
    names its line number; reading never fails on the file's content.
    """
    found: dict[str, dict[int, float]] = {key: {} for key in SERIES}
    path = run_dir / "metrics.jsonl"
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        row = _metrics_row(line)
        if isinstance(row, str):
            print(f"axdsl: warning: {path}:{number}: {row}: line skipped", file=sys.stderr)
            continue
        if row is None or row.get("skipped_update"):
            continue
        for key, values in found.items():
            if _is_number(row.get(key)):
                values[row["step"]] = float(row[key])
    return {key: sorted(values.items()) for key, values in found.items()}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _metrics_row(line: str) -> dict | str | None:
    """One metrics.jsonl line as a dict; None for a blank line; what is wrong with it, as a
    string."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return "not valid JSON (a line cut short?)"
    if not isinstance(row, dict):
        return "not a JSON object"
    if not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
        return "no integer step"
    bad = [
        k
        for k in ("loss", "eval_loss")
        if isinstance(row.get(k), float) and not math.isfinite(row[k])
    ]
    if bad:
        return f"non-finite {', '.join(bad)} (bare NaN or Infinity)"
    return row


TRAIN_COLOR = (31, 119, 180)  # matplotlib's C0 blue
EVAL_COLOR = (255, 127, 14)  # matplotlib's C1 orange
LR_COLOR = (44, 160, 44)  # C2 green
THROUGHPUT_COLOR = (148, 103, 189)  # C4 purple


def plot(run_dir: Path, out: Path | None = None) -> int:
    """Write the curves of RUN_DIR to `out` (default RUN_DIR/loss.png): train and eval loss,
    learning rate and throughput against step, titled with the run's spec, model and target."""
    if not (run_dir / "metrics.jsonl").exists():
        return _error(f"{run_dir}/metrics.jsonl not found: is {run_dir} a run directory?")
    series = read_series(run_dir)
    if not series["loss"] and not series["eval_loss"]:
        return _error(f"{run_dir}/metrics.jsonl has no losses yet")
    out = out if out is not None else run_dir / "loss.png"
    if not out.parent.is_dir():
        return _error(f"{out}: the directory {out.parent} does not exist")
    figure = run_figure(series, run_title(run_dir))
    image = io.BytesIO()
    try:
        figure.savefig(image, format=out.suffix[1:] or "png", dpi=100)
    except ValueError as exc:  # a suffix matplotlib cannot write (x.foo)
        return _error(f"{out}: {exc}")
    try:  # written here, so that a failed write is an error (a full disk was "wrote", exit 0)
        replace_file(out, image.getvalue())
    except OSError as exc:
        return _error(f"{out}: {exc.strerror or exc}")
    print(f"wrote {out} ({len(series['loss'])} train and {len(series['eval_loss'])} eval points)")
    return 0


def run_title(run_dir: Path) -> str:
    """ "RUN_DIR: SPEC model M on TARGET" from run.json; the directory alone when that is
    unreadable."""
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        spec, model = Path(info["spec"]).name, info["train"]["model"]
        return f"{run_dir.name}: {spec} model {model} on {info['target']}"
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name or str(run_dir)


def run_figure(series: dict[str, list[tuple[int, float]]], title: str):
    """An 800x480 matplotlib figure (Agg, no display needed): loss on the left, learning rate
    and tokens/s stacked on the right; a panel whose metric was never logged says so."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    grid = figure.add_gridspec(2, 2, width_ratios=(3, 2))
    loss, lr, speed = (
        figure.add_subplot(grid[:, 0]),
        figure.add_subplot(grid[0, 1]),
        figure.add_subplot(grid[1, 1]),
    )
    figure.suptitle(title)
    for key, label, color in (("loss", "train", TRAIN_COLOR), ("eval_loss", "eval", EVAL_COLOR)):
        _draw(loss, series[key], color, label)
    loss.set(xlabel="step", ylabel="loss")
    loss.legend()
    _draw(lr, series["lr"], LR_COLOR)
    lr.set(ylabel="learning rate")
    unit = "images" if series["images_per_s"] and not series["tokens_per_s"] else "tokens"
    _draw(speed, series[f"{unit}_per_s"], THROUGHPUT_COLOR)
    speed.set(xlabel="step", ylabel=f"{unit}/s")
    return figure


def _draw(
    axes, points: list[tuple[int, float]], color: tuple[int, int, int], label: str | None = None
) -> None:
    """One curve (a marker when it is a single point), on a grid; "not logged" when empty."""
    axes.grid(True, color="0.9")
    if not points:
        axes.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axes.transAxes)
        return
    steps, values = zip(*points, strict=True)
    rgb = tuple(c / 255 for c in color)
    axes.plot(
        steps, values, color=rgb, linewidth=2, label=label, marker="o" if len(points) == 1 else None
    )


# ----------------------------------------------------------------------------- sample


def import_output(out_dir: Path, name: str = "model"):
    """Module `name` (model, train) of the generated output in `out_dir`, imported as a package
    under a private name, so model.py's `from .kernels import ...` resolves to the kernels.py
    beside it, and two outputs never shadow each other."""
    return importlib.import_module(f"{_package(out_dir, '_axdsl_output_')}.{name}")


class RunError(Exception):
    """A run directory that cannot be used: its run.json is not a run's, or its code is gone."""


def load_run(run_dir: Path):
    """(run.json as a dict, the run's generated train module), imported from where it was built.

    The top package (generated/, which holds runtime.py) is imported under a private name, so
    runs built in different directories (or a `generated` package already imported) never shadow
    each other. Raises RunError for a run.json that is not a run's (it was an internal error) or
    generated code that is no longer where the run was built.
    """
    path = run_dir / "run.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        info = None
    kinds = {"package": str, "root": str, "train": dict}
    if not isinstance(info, dict) or not all(isinstance(info.get(k), t) for k, t in kinds.items()):
        raise RunError(f"{path} was not written by axdsl train: {run_dir} is not a run directory")
    top, *rest = info["package"].split(".")
    folder = Path(info["root"]) / top
    try:
        alias = _package(folder, "_axdsl_run_")
        return info, importlib.import_module(".".join([alias, *rest, "train"]))
    except (ImportError, FileNotFoundError):
        raise RunError(
            f"{run_dir} was trained by {folder / Path(*rest)}/train.py, which is not there "
            f"(moved or deleted?): in {info['root']}, run `axdsl build {info.get('spec')} "
            f"--target {info.get('target')}` to build it again"
        ) from None


def _package(directory: Path, prefix: str) -> str:
    """Import `directory` as a package named `prefix` + a hash of its path (once); its name."""
    directory = directory.resolve()
    alias = prefix + hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            alias, directory / "__init__.py", submodule_search_locations=[str(directory)]
        )
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {directory}")
        package = importlib.util.module_from_spec(spec)
        sys.modules[alias] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules[alias]  # not left half imported for the next caller
            raise
    return alias
