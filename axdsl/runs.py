"""`axdsl train` and `axdsl plot`: run a spec's training program and look at the run.

    train   build generated/<spec>/<target>/ (left alone when unchanged) and run its train.py as a
            subprocess from the directory that holds generated/; rerunning the command resumes.
            A train.py you edited is run as it is, and never rebuilt over: when the spec or
            axdsl changed the other files too, it stops and says what to do
    plot    draw RUN_DIR/metrics.jsonl (train and eval loss against step) as a PNG, with a small
            rasterizer and PNG encoder of its own (zlib + struct; no plotting library)
    (sample is axdsl/sampling.py; it finds a run's code through load_run below)

A run directory holds what train.py writes: run.json (package, spec, target, model, train
config), metrics.jsonl and checkpoints/. `plot` and `sample` find the generated code through
run.json. Nothing here imports jax.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import os
import signal
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

from axdsl.errors import shorten_words


def _error(message: str) -> int:
    print(f"axdsl: error: {shorten_words(message)}", file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------- train


def default_run_dir(spec: Path, target: str) -> Path:
    return Path("runs") / f"{spec.stem}-{target}"


def train(spec: Path, target: str, out: Path | None = None, steps: int | None = None,
          checkpoint_every: int | None = None, init_from: Path | None = None) -> int:
    """Build `spec` for `target`, then run `python -m generated.<spec>.<target>.train`; its exit code.

    The command runs in the current directory (the one holding generated/), with its output
    streamed; the run directory defaults to runs/<spec>-<target>, and rerunning resumes there.
    A train.py the user edited (see `build.edited_files`) is kept and run as it is; if the rest of
    the output is out of date as well, nothing is rebuilt and the exit code is 1. `init_from`, a
    Hugging Face model directory, is imported once into RUN_DIR/hf_params (see `hf_init_params`).
    """
    from axdsl import build

    files = build.build_files(spec, target)
    out_dir = build.default_out_dir(spec, target)
    if "train.py" not in files:
        return _error(f"{spec}: its first model is not a language model (tokens [B, S] -> logits "
                      "[B, S, vocab]), so there is no train.py to run")
    files, edits = build.keep_edits(out_dir, files)
    inits = [out_dir.parent.parent / "__init__.py", out_dir.parent / "__init__.py"]
    stale = build.diff_against(out_dir, files) or not all(p.exists() for p in inits)
    if stale and edits:
        return _error(f"{out_dir}/train.py has your edits and the rest of the output is out of date "
                      f"with {spec} or axdsl: not rebuilding. Run `axdsl build {spec} --target {target}` "
                      "(it keeps your train.py and shows what a fresh one would change), or add --force "
                      "to replace your train.py; then train again")
    if stale:
        build.write_atomic(out_dir, files, make_packages=True)
        print(f"built {out_dir}/", file=sys.stderr)
    if edits:
        print(f"running your edited {out_dir}/train.py", file=sys.stderr)
    run_dir = out if out is not None else default_run_dir(spec, target)
    cmd = [sys.executable, "-m", ".".join(out_dir.parts) + ".train", "--out", str(run_dir)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if checkpoint_every is not None:
        cmd += ["--checkpoint-every", str(checkpoint_every)]
    if init_from is not None:
        if (init_from / "config.json").exists() and (code := hf_init_params(spec, init_from, run_dir)):
            return code
        params = run_dir / HF_PARAMS if (init_from / "config.json").exists() else init_from
        cmd += ["--init-from", str(params.absolute())]
    print("running " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    return run_child(cmd)


HF_PARAMS = "hf_params"  # in a run directory: the parameters imported from --init-from HF_DIR


def hf_init_params(spec: Path, hf_dir: Path, run_dir: Path) -> int:
    """Import `hf_dir` into RUN_DIR/hf_params for a fine-tuning run; 0 when done or already there
    (a rerun resumes and reads its own checkpoints). The import's exit code otherwise."""
    if (run_dir / HF_PARAMS).exists():
        return 0
    from axdsl.hf.importer import import_hf

    return import_hf(spec, hf_dir, None, run_dir / HF_PARAMS)


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
    previous = {s: signal.signal(s, lambda signum, _: proc.send_signal(signum)) for s in FORWARDED if forward}
    try:
        code = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code


def _die_with_parent(parent: int):
    """A preexec_fn for Popen: ask Linux to SIGTERM the child when `parent` dies (None elsewhere)."""
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
    """(train losses, eval losses) as sorted (step, value) pairs from RUN_DIR/metrics.jsonl.

    A resumed run logs again the steps after its last checkpoint: the later value of a step wins.
    Skipped (non-finite) steps and null values are left out. A damaged line (cut short by a kill,
    not JSON, not an object, no integer step, a non-finite number) is skipped with a warning that
    names its line number; reading never fails on the file's content.
    """
    train_loss: dict[int, float] = {}
    eval_loss: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        row = _metrics_row(line)
        if isinstance(row, str):
            print(f"axdsl: warning: {path}:{number}: {row}: line skipped", file=sys.stderr)
            continue
        if row is None or row.get("skipped_update"):
            continue
        for key, series in (("loss", train_loss), ("eval_loss", eval_loss)):
            if _is_number(row.get(key)):
                series[row["step"]] = float(row[key])
    return sorted(train_loss.items()), sorted(eval_loss.items())


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _metrics_row(line: str) -> dict | str | None:
    """One metrics.jsonl line as a dict; None for a blank line; what is wrong with it, as a string."""
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
    bad = [k for k in ("loss", "eval_loss") if isinstance(row.get(k), float) and not math.isfinite(row[k])]
    if bad:
        return f"non-finite {', '.join(bad)} (bare NaN or Infinity)"
    return row


TRAIN_COLOR = (31, 119, 180)  # blue
EVAL_COLOR = (255, 127, 14)  # orange
AXIS_COLOR = (0, 0, 0)
GRID_COLOR = (225, 225, 225)


def plot(run_dir: Path, out: Path | None = None) -> int:
    """Write the loss curves of RUN_DIR to `out` (default RUN_DIR/loss.png)."""
    if not (run_dir / "metrics.jsonl").exists():
        return _error(f"{run_dir}/metrics.jsonl not found: is {run_dir} a run directory?")
    train_loss, eval_loss = read_metrics(run_dir)
    if not train_loss and not eval_loss:
        return _error(f"{run_dir}/metrics.jsonl has no losses yet")
    out = out if out is not None else run_dir / "loss.png"
    out.write_bytes(loss_chart(train_loss, eval_loss))
    print(f"wrote {out} ({len(train_loss)} train and {len(eval_loss)} eval points)")
    return 0


def loss_chart(train_loss, eval_loss, width: int = 800, height: int = 480) -> bytes:
    """A PNG of loss against step: grid, axes with tick labels, train and eval polylines, legend."""
    c = Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 40, height - 50
    points = train_loss + eval_loss
    x_hi = max(s for s, _ in points) or 1
    y_lo, y_hi = min(v for _, v in points), max(v for _, v in points)
    pad = (y_hi - y_lo) * 0.05 or 0.5
    y_lo, y_hi = y_lo - pad, y_hi + pad

    def px(step: float, value: float) -> tuple[int, int]:
        x = left + (right - left) * step / x_hi
        y = bottom - (bottom - top) * (value - y_lo) / (y_hi - y_lo)
        return round(x), round(y)

    for value in _ticks(y_lo, y_hi):
        _, y = px(0, value)
        c.line(left, y, right, y, GRID_COLOR)
        label = f"{value:.4g}"
        c.text(left - 8 - c.text_width(label), y - 5, label, AXIS_COLOR)
    for step in _ticks(0, x_hi):
        x, _ = px(step, y_lo)
        c.line(x, top, x, bottom, GRID_COLOR)
        label = f"{step:.6g}"
        c.text(x - c.text_width(label) // 2, bottom + 8, label, AXIS_COLOR)
    c.line(left, top, left, bottom, AXIS_COLOR)
    c.line(left, bottom, right, bottom, AXIS_COLOR)
    c.text((left + right) // 2 - c.text_width("step") // 2, bottom + 28, "step", AXIS_COLOR)
    c.text(8, top - 28, "loss", AXIS_COLOR)
    for series, color in ((train_loss, TRAIN_COLOR), (eval_loss, EVAL_COLOR)):
        xy = [px(s, v) for s, v in series]
        for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
            c.line(x0, y0, x1, y1, color, thick=2)
        if len(xy) == 1:
            c.rect(xy[0][0] - 2, xy[0][1] - 2, 5, 5, color)
    x = right - 130
    for label, color, series in (("train", TRAIN_COLOR, train_loss), ("eval", EVAL_COLOR, eval_loss)):
        if series:
            c.rect(x, top - 24, 16, 4, color)
            c.text(x + 22, top - 28, label, AXIS_COLOR)
            x += 70
    return c.png()


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) inside [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    first = math.ceil(lo / step)
    return [round(i * step, 10) for i in range(first, math.floor(hi / step) + 1)]


# A 3x5 bitmap font: enough for numbers and the chart's words ("e" is drawn as E).
GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "+": "000010111010000", "e": "111100110100111", "a": "010101111101101", "i": "111010010010111",
    "l": "100100100100111", "n": "101111111101101", "o": "010101101101010", "p": "110101110100100",
    "r": "110101110101101", "s": "011100010001110", "t": "111010010010010", "v": "101101101101010",
    " ": "000000000000000",
}


class Canvas:
    """An RGB image in memory with just what a line chart needs."""

    def __init__(self, width: int, height: int, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x: int, y: int, w: int, h: int, color) -> None:
        for yy in range(y, y + h):
            for xx in range(x, x + w):
                self.set(xx, yy, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color, thick: int = 1) -> None:
        """Bresenham's line, `thick` pixels wide."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.rect(x0, y0, thick, thick, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color, scale: int = 2) -> None:
        for ch in text.lower():
            glyph = GLYPHS.get(ch, GLYPHS[" "])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    self.rect(x + (i % 3) * scale, y + (i // 3) * scale, scale, scale, color)
            x += 4 * scale

    def text_width(self, text: str, scale: int = 2) -> int:
        return len(text) * 4 * scale - scale

    def png(self) -> bytes:
        return encode_png(self.width, self.height, bytes(self.pixels))


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG: signature, IHDR, one zlib IDAT of filter-0 scanlines, IEND."""
    stride = 3 * width
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


# ----------------------------------------------------------------------------- sample


def load_run(run_dir: Path):
    """(run.json as a dict, the run's generated train module), imported from where it was built.

    The top package (generated/, which holds runtime.py) is imported under a private name, so
    runs built in different directories (or a `generated` package already imported) never shadow
    each other.
    """
    info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    top, *rest = info["package"].split(".")
    top_dir = Path(info["root"]) / top
    alias = "_axdsl_run_" + hashlib.sha256(str(top_dir.resolve()).encode()).hexdigest()[:16]
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            alias, top_dir / "__init__.py", submodule_search_locations=[str(top_dir)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[alias] = package
        spec.loader.exec_module(package)
    return info, importlib.import_module(".".join([alias, *rest, "train"]))
