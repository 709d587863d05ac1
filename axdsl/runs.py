"""`axdsl train`, `axdsl plot` and `axdsl sample`: run a spec's training program and look at the run.

    train   build generated/<spec>/<target>/ (left alone when unchanged) and run its train.py as a
            subprocess from the directory that holds generated/; rerunning the command resumes.
            A train.py you edited is run as it is, and never rebuilt over: when the spec or
            axdsl changed the other files too, it stops and says what to do
    plot    draw RUN_DIR/metrics.jsonl (train and eval loss against step) as a PNG, with a small
            rasterizer and PNG encoder of its own (zlib + struct; no plotting library)
    sample  restore the newest complete checkpoint of RUN_DIR and generate text from a prompt

A run directory holds what train.py writes: run.json (package, spec, target, model, train
config), metrics.jsonl and checkpoints/. `plot` and `sample` find the generated code through
run.json. Only `sample` imports jax.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
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


def _error(message: str) -> int:
    print(f"axdsl: error: {message}", file=sys.stderr)
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
    SIGTERM if this process dies, even by SIGKILL (prctl PR_SET_PDEATHSIG): it never trains on
    orphaned.
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


def sample(run_dir: Path, prompt: str, max_tokens: int = 200, temperature: float = 0.8,
           top_k: int | None = None, seed: int = 0, top_p: float = 1.0, eos: int | None = None) -> int:
    """Print `prompt` and `max_tokens` tokens generated by the newest checkpoint of `run_dir`.

    Byte-level runs (default or text data) take and print text; runs on token files take the
    prompt as space-separated token ids and print ids. See `Sampling` for temperature, top_k,
    top_p and eos; `seed` seeds the sampler.
    """
    sampling = Sampling(temperature, top_k, top_p, eos)
    problem = sampling_problem(sampling, max_tokens)
    if problem:
        return _error(problem)
    if not (run_dir / "run.json").exists():
        for where in (run_dir, run_dir.parent):  # runs/x-hf or runs/x-hf/params
            if (where / "import.json").exists():
                return _sample_imported(where, prompt, max_tokens, sampling, seed)
        return _error(f"{run_dir}/run.json not found: is {run_dir} a run directory or an "
                      "`axdsl import-hf` output?")
    import numpy as np

    info, tm = load_run(run_dir)
    model = importlib.import_module(tm.__package__ + ".model")
    known = {f.name for f in dataclasses.fields(tm.TrainConfig)}
    tc = tm.TrainConfig(**{k: v for k, v in info["train"].items() if k in known})
    cfg = tm.model_config(tc)
    checkpoints = (run_dir / tc.checkpoint_dir).absolute()
    params = _newest_good_params(tm, cfg, tc, checkpoints)
    if params is None:
        return _error(f"no complete, undamaged checkpoint in {checkpoints}")

    byte_level = tc.data != "tokens"
    if byte_level:
        ids = list(prompt.encode("utf-8"))
    else:
        try:
            ids = [int(t) for t in prompt.split()]
        except ValueError:
            return _error("this run trained on a token file: give the prompt as token ids (\"1 2 3\")")
    vocab = getattr(cfg, "vocab", None)
    if not ids or (vocab is not None and max(ids) >= vocab):
        return _error(f"the prompt must be non-empty token ids below the vocabulary size {vocab}")
    window = min(tc.seq, getattr(cfg, "max_seq", tc.seq))

    tokens = generate_tokens(model, cfg, params, ids, window, max_tokens, sampling,
                             np.random.default_rng(seed), byte_level)
    _stream(tokens, ids, prompt, byte_level)
    return 0


def _sample_imported(out: Path, prompt: str, max_tokens: int, sampling: Sampling, seed: int) -> int:
    """`sample` from an `axdsl import-hf` output: its import.json names the spec and model, which
    are built for the cpu target (as `train` builds) and restored from the params checkpoint.
    A Hugging Face vocabulary is not bytes, so the prompt and output are token ids."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from axdsl import build

    info = json.loads((out / "import.json").read_text(encoding="utf-8"))
    spec = Path(info["spec"])
    if not spec.exists():
        return _error(f"{out}/import.json names {spec}, which no longer exists")
    out_dir = build.default_out_dir(spec, "cpu")
    files = build.build_files(spec, "cpu")
    if build.diff_against(out_dir, files) or not (out_dir / "__init__.py").exists():
        build.write_atomic(out_dir, files, make_packages=True)
        print(f"built {out_dir}/", file=sys.stderr)
    model = _load_model(out_dir / "model.py")
    if info["model"] not in model.CONFIGS:
        return _error(f"{out}/import.json names model `{info['model']}`, which {spec} no longer has")
    cfg = model.CONFIGS[info["model"]]
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore((out / info["params"]).absolute(), abstract)
    try:
        ids = [int(t) for t in prompt.split()]
    except ValueError:
        return _error("an imported Hugging Face model has its own vocabulary: give the prompt as token "
                      "ids (\"1 2 3\")")
    vocab = getattr(cfg, "vocab", None)
    if not ids or min(ids) < 0 or (vocab is not None and max(ids) >= vocab):
        return _error(f"the prompt must be non-empty token ids below the vocabulary size {vocab}")
    hf_config = _hf_config(Path(info["hf_dir"]))
    if sampling.eos is None and isinstance(hf_config.get("eos_token_id"), int):
        sampling = dataclasses.replace(sampling, eos=hf_config["eos_token_id"])  # stop where transformers stops
    rng = np.random.default_rng(seed)
    if "dec_tokens" in inspect.signature(model.forward).parameters:  # an encoder-decoder (T5)
        start = hf_config.get("decoder_start_token_id")
        tokens = generate_seq2seq(model, cfg, params, ids, start if isinstance(start, int) else 0,
                                  max_tokens, sampling, rng)
        print(" ".join(map(str, ids)) + " ->", end="", flush=True)
        _stream(tokens, [], "", byte_level=False)
        return 0
    window = getattr(cfg, "max_seq", len(ids) + max_tokens)
    _stream(generate_tokens(model, cfg, params, ids, window, max_tokens, sampling, rng), ids, prompt,
            byte_level=False)
    return 0


def _hf_config(hf_dir: Path) -> dict:
    """The imported model's config.json (for its EOS and decoder start ids); {} when it is gone."""
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def generate_seq2seq(model, cfg, params, ids: list[int], start: int, max_tokens: int, s: Sampling, rng):
    """Yield up to `max_tokens` decoder tokens for the encoder input `ids`, starting the decoder at
    `start`: one full forward per token (encoder included) over decoder tokens padded to a fixed
    length, so it compiles once; the decoder is causal, so the padding changes nothing."""
    import jax
    import numpy as np

    @jax.jit
    def logits_at(params, tokens, dec_tokens, pos):
        ones, dec_ones = jax.numpy.ones_like(tokens), jax.numpy.ones_like(dec_tokens)
        return model.forward(cfg, params, tokens[None], dec_tokens[None], ones[None], dec_ones[None])[0, pos]

    tokens = np.asarray(ids, np.int32)
    dec = np.zeros(max_tokens + 1, np.int32)
    dec[0] = start
    for n in range(max_tokens):
        token = _pick(np.asarray(logits_at(params, tokens, dec, n), np.float64), s, rng)
        dec[n + 1] = token
        yield token
        if token == s.eos:
            return


def _load_model(path: Path):
    """The generated model.py at `path`, imported by file path (it imports nothing of its package)."""
    alias = "_axdsl_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(alias, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module
        spec.loader.exec_module(module)
    return sys.modules[alias]


def _newest_good_params(tm, cfg, tc, checkpoints: Path):
    """The parameters of the newest checkpoint that verifies and restores; damaged ones are
    reported and skipped, never moved (a training may be running). None when none is good."""
    from axdsl.checkpoints import good_steps

    def warn(message: str) -> None:
        print(f"axdsl: warning: {message}", file=sys.stderr)

    for step in good_steps(checkpoints, warn):
        try:
            with _quiet_orbax():
                return _restore_params(tm, cfg, tc, checkpoints / str(step) / "state")
        except Exception as exc:  # noqa: BLE001 - whatever orbax or tensorstore raise on a bad step
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            warn(f"checkpoint {step} in {checkpoints} cannot be read ({type(exc).__name__}: {first}); "
                 "skipping it")
    return None


class _quiet_orbax:
    """Silence orbax's and absl's error logs (with their tracebacks) while a step is tried: a
    failure is reported as one warning line instead."""

    def __enter__(self):
        import logging

        self.loggers = [logging.getLogger(n) for n in ("absl", "orbax", "jax")]
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.CRITICAL)
        return self

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)
        return False


def _restore_params(tm, cfg, tc, state_dir: Path):
    """The parameters of one checkpoint, all on one device (resharded as they are read)."""
    import jax
    import orbax.checkpoint as ocp

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(lambda k: tm.new_state(cfg, tc, k), jax.random.key(0))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
    with ocp.StandardCheckpointer() as checkpointer:  # read-only: a running training is not disturbed
        return checkpointer.restore(state_dir, abstract)["params"]


def sampling_problem(s: "Sampling", max_tokens: int) -> str | None:
    """What is wrong with the sampling options, as the `axdsl: error:` text, or None."""
    if not math.isfinite(s.temperature) or s.temperature < 0:
        return f"--temperature must be a finite number >= 0 (0: greedy), got {s.temperature}"
    if s.top_k is not None and s.top_k < 1:
        return f"--top-k must be >= 1, got {s.top_k}"
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        return f"--top-p must be in (0, 1], got {s.top_p}"
    if s.eos is not None and s.eos < 0:
        return f"--eos must be a token id >= 0, got {s.eos}"
    if max_tokens < 0:
        return f"--max-tokens must be >= 0, got {max_tokens}"
    return None


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: temperature 0 is greedy (argmax); otherwise the logits are
    divided by the temperature, cut to the `top_k` most likely and to the smallest set whose
    probability reaches `top_p` (nucleus), and sampled. Generation stops after `eos`."""

    temperature: float = 0.8
    top_k: int | None = None
    top_p: float = 1.0
    eos: int | None = None


def _pick(logits, s: Sampling, rng) -> int:
    """The next token of float64 `logits` [vocab] under `s`."""
    import numpy as np

    if s.temperature == 0:
        return int(np.argmax(logits))
    logits = logits / s.temperature
    if s.top_k is not None and s.top_k < len(logits):
        logits[logits < np.sort(logits)[-s.top_k]] = -np.inf
    p = np.exp(logits - logits.max())
    p /= p.sum()
    if s.top_p < 1.0:  # keep the most likely tokens until their mass reaches top_p
        order = np.argsort(-p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), s.top_p)) + 1]
        cut = np.zeros_like(p)
        cut[keep] = p[keep]
        p = cut / cut.sum()
    return int(rng.choice(len(p), p=p))


def generate_tokens(model, cfg, params, ids: list[int], window: int, max_tokens: int, s: Sampling,
                    rng, byte_level: bool = False):
    """Yield up to `max_tokens` tokens after the prompt `ids`, one full forward of the last
    `window` tokens per token (causal attention: the padding after the last one changes nothing).
    Stops after `s.eos`. A byte-level model picks among the first 256 logits only."""
    import jax
    import numpy as np

    logits_at = _jit_logits_at(model, cfg)
    ids = list(ids)
    for _ in range(max_tokens):
        context = ids[-window:]
        tokens = np.zeros(window, np.int32)
        tokens[: len(context)] = context
        logits = np.asarray(logits_at(params, tokens, len(context) - 1), np.float64)
        if byte_level:
            logits = logits[:256]  # a larger vocabulary trained on bytes never uses the rest
        token = _pick(logits, s, rng)
        ids.append(token)
        yield token
        if token == s.eos:
            return


def _jit_logits_at(model, cfg):
    """jit(params, tokens [S], pos) -> float32 logits [vocab] at position `pos`."""
    import jax

    @jax.jit
    def logits_at(params, tokens, pos):
        return model.forward(cfg, params, tokens[None])[0, pos].astype(jax.numpy.float32)

    return logits_at


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab escaped (\\x1b, \\r, ...), so
    generated bytes never drive the terminal."""
    return "".join(c if c in "\n\t" or c.isprintable() else
                   c.encode("unicode_escape").decode("ascii") for c in text)


def _stream(tokens, ids: list[int], prompt: str, byte_level: bool) -> None:
    """Write the prompt and each generated token to stdout as it comes, escaping control bytes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = sys.stdout
    out.write(printable(prompt) if byte_level else " ".join(map(str, ids)))
    out.flush()
    for token in tokens:
        out.write(printable(decoder.decode(bytes([token]))) if byte_level else f" {token}")
        out.flush()
    out.write((printable(decoder.decode(b"", final=True)) if byte_level else "") + "\n")
    out.flush()
