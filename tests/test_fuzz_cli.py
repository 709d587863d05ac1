"""Fuzz train blocks and the command line's flags: a wrong value never exits 0, a right one is
never refused, and nothing ends in a traceback or an internal error (exit 70).

tests/test_fuzz.py mutates whole specs and checks that the front end never crashes; it cannot tell
a wrong value that passed from a right one. Here every value comes from a table that says whether
it is valid, so the oracle has two sides (issue 38: "check that no case exits with 0 while wrong"):

- train blocks: a tiny model with 1-4 train settings, run through `axdsl check`. All valid (the
  cross conditions included: microbatches divide the batch, the warmup fits the steps): exit 0.
  Any invalid: exit 1, every error located in the spec (`file:line:col: error:`), none in std/.
- flags of `axdsl train`, `check` and `build` (`--steps 0`, `--lr nan`, `--target ""`, names that
  are not UTF-8, ...): all valid, exit 0; any invalid, a non-zero exit whose `error:` line names
  what it refuses. `axdsl train`'s own work (building, then train.py in a child) is replaced by
  a recorder, which must receive the values given; a build that would succeed costs 0.4-2 s, so a
  `build` case always carries an invalid part (tests/test_cli.py builds for real).

- flags of `axdsl sample` and `aot`, and of train.py itself (`--microbatches 0`, `--seed -3`,
  `--profile 4:2`, `--batch 16 --microbatches 8` over 8 data-parallel devices): the same two
  sides, with the command's work (loading the run, lowering the step, the memory check and the
  data) replaced by a recorder that must receive the values given.

Everything runs in this process through `cli.main` (or the committed tiny_llama trainer's
`main`), with the output written to UTF-8 streams as Python opens them under a UTF-8 locale
(stdout strict, stderr backslashreplace). The cases come from fixed seeds (deterministic); all
of them take about 10 s.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import random
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from axdsl import cli, runs

MODEL = (
    'import "std/transformer.axl"\n'
    "model m = DecoderLM { vocab = 64  dim = 16  layers = 1  heads = 2  ffn = 32  max_seq = 64 }\n"
)
LOCATED = re.compile(r"^(\S.*?):(\d+):(\d+): error: ", re.MULTILINE)
NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # what Python makes of an argument that is not UTF-8


@dataclass(frozen=True)
class Outcome:
    rc: int
    out: str
    err: str


def run_main(argv: list[str]) -> Outcome:
    """`axdsl ARGV` in this process: its exit code (argparse's SystemExit included) and output."""
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="backslashreplace")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse: a value of the wrong type, --help
            rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout, sys.stderr = saved
        out.flush()
        err.flush()
    return Outcome(rc, out_bytes.getvalue().decode(), err_bytes.getvalue().decode())


def assert_no_crash(o: Outcome, case: str) -> None:
    assert o.rc != cli.EXIT_INTERNAL and "Traceback" not in o.err + o.out, f"{case}\n{o.err}"
    assert o.rc == 0 or "error:" in o.err, f"{case}: exit {o.rc} without an error line\n{o.err}"


# ------------------------------------------------------------------------------ train blocks
# setting -> (value, valid on its own); `microbatches` and `schedule` also depend on the others
BATCH_DEFAULT, STEPS_DEFAULT = 8, 1000
SETTINGS: dict[str, tuple[tuple[str, bool], ...]] = {
    "batch": (
        ("1", True),
        ("4", True),
        ("8", True),
        ("0", False),
        ("-2", False),
        ("2.5", False),
        ('"8"', False),
        ("true", False),
    ),
    "seq": (("2", True), ("32", True), ("64", True), ("65", False), ("1", False), ("0", False)),
    "steps": (("1", True), ("100", True), ("0", False), ("-5", False), ("1.5", False)),
    "seed": (("0", True), ("7", True), ("-1", False)),
    "eval_every": (("0", True), ("10", True), ("-1", False)),
    "log_every": (("1", True), ("0", False)),
    "microbatches": (("1", True), ("2", True), ("3", True), ("0", False)),
    "clip": (("0.0", True), ("1.0", True), ("-1.0", False), ("x", False)),
    "z_loss": (("0.0", True), ("1e-4", True), ("-0.5", False)),
    "optimizer": (
        ("adamw(lr = 3e-4)", True),
        ("adamw(lr = 0.0)", False),
        ("adamw(lr = -1.0)", False),
        ("adamw(lr = 1e400)", False),
        ("adamw(lr = nan)", False),
        ("nosuch()", False),
    ),
    "schedule": (
        ("cosine(warmup = 0, final = 0.1)", True),
        ("cosine(warmup = 50)", True),
        ("cosine(final = 2.0)", False),
    ),
    "checkpoint": (
        ("checkpoint(every = 0)", True),
        ("checkpoint(every = 10)", True),
        ("checkpoint(every = -3)", False),
    ),
    "lr": (("lr = 1.0", False),),  # not a train setting: the optimizer's
}


def pick(rng: random.Random, pool, ok=lambda v: v[1]):
    """A value of `pool`, a valid one three times in four (where there is one), so that about
    half the cases are wholly valid and the refusal of a right value is tested too."""
    good = [v for v in pool if ok(v)]
    bad = [v for v in pool if not ok(v)]
    return rng.choice(good if good and (not bad or rng.random() < 0.75) else bad)


def _int(text: str) -> int | None:
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def _valid_together(chosen: dict[str, tuple[str, bool]]) -> bool:
    """Every value valid on its own, and the cross conditions hold."""
    if not all(ok for _, ok in chosen.values()):
        return False
    batch = _int(chosen["batch"][0]) if "batch" in chosen else BATCH_DEFAULT
    micro = _int(chosen["microbatches"][0]) if "microbatches" in chosen else 1
    steps = _int(chosen["steps"][0]) if "steps" in chosen else STEPS_DEFAULT
    warmup = re.search(r"warmup = (\d+)", chosen.get("schedule", ("", True))[0])
    return bool(batch and micro and batch % micro == 0) and (
        warmup is None or int(warmup.group(1)) <= (steps or 0)
    )


def _line(key: str, value: str) -> str:
    return value if key in ("checkpoint", "lr") else f"{key} = {value}"


def train_block_case(seed: int) -> tuple[str, bool]:
    rng = random.Random(seed)
    keys = rng.sample(sorted(SETTINGS), rng.randint(1, 4))
    chosen = {k: pick(rng, SETTINGS[k]) for k in keys}
    lines = "".join(f"  {_line(k, v)}\n" for k, (v, _) in chosen.items())
    return MODEL + "train {\n" + lines + "}\n", _valid_together(chosen)


@pytest.mark.parametrize("seed", range(24))
def test_a_fuzzed_train_block_is_refused_exactly_when_wrong(tmp_path, seed):
    text, valid = train_block_case(seed)
    spec = tmp_path / "m.axl"
    spec.write_text(text)
    o = run_main(["check", str(spec)])
    assert_no_crash(o, text)
    if valid:
        assert o.rc == 0, f"a valid train block was refused:\n{text}\n{o.err}"
        return
    assert o.rc == 1, f"a wrong train block passed (exit {o.rc}):\n{text}"
    files = [m.group(1) for m in LOCATED.finditer(o.err)]
    assert files and all(f == str(spec) for f in files), f"{text}\n{o.err}"


# ------------------------------------------------------------------------------ flags
INT_LEAST = {"steps": 1, "batch": 1, "seq": 2, "checkpoint-every": 0}
INT_VALUES = (
    "0",
    "1",
    "2",
    "-5",
    "10",
    "2147483647",
    "2147483648",
    "1e3",
    "x",
    "",
    NOT_UTF8,
    "99999999999999999999",
    " 7",
)
LR_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e-3", "3e-4", "1e400", "x", "", " 1e-3\n")
TARGETS = (
    ("cpu", True),
    ("gpu-h100-8", True),
    ("", False),
    (NOT_UTF8, False),
    ("cpu-0", False),
    ("cpu-99999999999999999999", False),
    (" cpu", False),
    ("nosuch", False),
)
DATA = (
    ("default", True),
    ("corpus.bin", True),
    (NOT_UTF8 + ".txt", True),
    ("", False),
    ("  ", False),
)
MODELS = (("m", True), (NOT_UTF8, True), ("", False))


def _int_flag_ok(name: str, text: str) -> bool:
    try:
        value = int(text)
    except ValueError:
        return False
    return INT_LEAST[name] <= value <= 2**31 - 1


def _lr_ok(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 0


def _flag(rng: random.Random, name: str, value: str) -> list[str]:
    """`--name=value` or `--name value` (argparse reads a value such as -inf only in the first)."""
    return [f"--{name}={value}"] if rng.random() < 0.5 else [f"--{name}", value]


def train_flags_case(seed: int) -> tuple[list[str], dict[str, tuple[str, bool]]]:
    rng = random.Random(seed)
    given: dict[str, tuple[str, bool]] = {}
    for name in rng.sample([*INT_LEAST, "lr", "target", "data", "model"], rng.randint(1, 4)):
        if name in INT_LEAST:
            text = pick(rng, INT_VALUES, lambda v, n=name: _int_flag_ok(n, v))
            given[name] = (text, _int_flag_ok(name, text))
        elif name == "lr":
            text = pick(rng, LR_VALUES, _lr_ok)
            given[name] = (text, _lr_ok(text))
        else:
            given[name] = pick(rng, {"target": TARGETS, "data": DATA, "model": MODELS}[name])
    argv = []
    for name, (text, _) in given.items():
        argv += _flag(rng, name, text)
    return argv, given


@pytest.fixture
def recorded_train(monkeypatch, tmp_path):
    """`runs.train` replaced by a recorder: the flags are checked, nothing is built or run."""
    calls: list[dict] = []

    def record(spec, target, out, **kwargs):
        calls.append({"spec": spec, "target": target, "out": out, **kwargs})
        return 0

    monkeypatch.setattr(runs, "train", record)
    monkeypatch.chdir(tmp_path)
    return calls


def _names_a_wrong_flag(err: str, given: dict[str, tuple[str, bool]]) -> bool:
    wrong = [name for name, (_, ok) in given.items() if not ok]
    return any(f"--{n}" in err or (n == "target" and "target" in err) for n in wrong)


@pytest.mark.parametrize("seed", range(32))
def test_fuzzed_train_flags_are_refused_exactly_when_wrong(recorded_train, seed):
    argv, given = train_flags_case(seed)
    o = run_main(["train", "m.axl", "--out", "run", *argv])
    case = f"axdsl train m.axl {argv!r}"
    assert_no_crash(o, case)
    if all(ok for _, ok in given.values()):
        assert o.rc == 0 and len(recorded_train) == 1, f"{case} was refused:\n{o.err}"
        call = recorded_train[0]
        overrides = call["overrides"]
        for name in ("steps", "batch", "seq", "checkpoint-every"):
            if name in given:
                assert overrides[name.replace("-", "_")] == int(given[name][0]), case
        if "lr" in given:
            assert overrides["lr"] == float(given["lr"][0]), case
        assert call["target"] == given.get("target", ("cpu", True))[0], case
        return
    assert o.rc != 0 and not recorded_train, f"{case} passed a wrong value:\n{o.err}"
    assert _names_a_wrong_flag(o.err, given), f"{case}: the error names no wrong flag\n{o.err}"


def _specs(folder: Path) -> dict[str, tuple[str, bool]]:
    """Spec arguments of `check` and `build`, made in `folder`, with whether each checks."""
    (folder / "m.axl").write_text(MODEL)
    (folder / (NOT_UTF8 + ".axl")).write_text(MODEL)  # a name that is not UTF-8, printed by `ok`
    (folder / "latin1.axl").write_bytes(MODEL.encode() + b"# caf\xe9\n")
    (folder / "dir.axl").mkdir()
    return {
        "m.axl": ("m.axl", True),
        "not-utf8-name": (NOT_UTF8 + ".axl", True),
        "empty": ("", False),
        "missing": ("missing.axl", False),
        "directory": ("dir.axl", False),
        "latin1": ("latin1.axl", False),
    }


@pytest.mark.parametrize("seed", range(16))
def test_fuzzed_check_arguments_pass_exactly_when_right(tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(1000 + seed)
    spec, spec_ok = pick(rng, sorted(_specs(tmp_path).values()))
    target, target_ok = pick(rng, TARGETS)
    argv = ["check", spec, *_flag(rng, "target", target)]
    o = run_main(argv)
    assert_no_crash(o, repr(argv))
    if spec_ok and target_ok:
        assert o.rc == 0 and f"{spec.encode('utf-8', 'backslashreplace').decode()}: ok" in o.out
    elif spec == "":  # refused as an argument (it was `.:0:0: cannot read spec: a directory`)
        assert o.rc == 2 and "an empty path" in o.err, f"{argv!r}\n{o.err}"
    elif not target_ok:
        assert o.rc == 2 and "target" in o.err, f"{argv!r}\n{o.err}"
    else:
        assert o.rc == 1 and LOCATED.search(o.err), f"{argv!r}\n{o.err}"


def test_a_spec_whose_name_is_not_utf8_checks_under_a_strict_utf8_stdout(tmp_path, monkeypatch):
    """`axdsl check $'\\xff\\xfe.axl'` printed its `ok` line to a strict UTF-8 stdout (the default
    under an en_US.UTF-8 locale) and ended in UnicodeEncodeError, exit 70 (found by this fuzzer)."""
    monkeypatch.chdir(tmp_path)
    _specs(tmp_path)
    o = run_main(["check", NOT_UTF8 + ".axl"])
    assert o.rc == 0 and o.out == "\\udcff\\udcfe.axl: ok (m)\n", o.err


@pytest.mark.parametrize("seed", range(8))
def test_fuzzed_build_arguments_fail_cleanly(tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(2000 + seed)
    specs = sorted(_specs(tmp_path).values())
    (tmp_path / "a_file").write_text("")
    while True:  # a build that would succeed is slow: keep a wrong spec or target in each case
        (spec, spec_ok), (target, target_ok) = rng.choice(specs), rng.choice(TARGETS)
        if not (spec_ok and target_ok):
            break
    out = rng.choice(("out", "a_file", ""))
    argv = ["build", spec, "--out", out, *_flag(rng, "target", target)]
    o = run_main(argv)
    assert_no_crash(o, repr(argv))
    assert o.rc in (1, 2) and not (tmp_path / "out").exists(), f"{argv!r}\n{o.err}"
    if "" in (spec, out):  # refused as an argument, before the target is read
        assert o.rc == 2 and "an empty path" in o.err, f"{argv!r}\n{o.err}"
    else:
        assert ("target" in o.err) if not target_ok else LOCATED.search(o.err), f"{argv!r}\n{o.err}"


# ------------------------------------------------------------------------------ more commands
# The same two-sided oracle over the flags of `sample`, `aot` and train.py itself: a value is
# wrong when it is outside the range the command documents (the table says which), and every
# case with a wrong value must be refused, naming it, before any work; every right one must
# reach the work with the values given (a recorder stands in for the work).

SAMPLE_VALUES: dict[str, tuple[tuple[str, bool], ...]] = {
    "max-tokens": (("0", True), ("5", True), ("-1", False), ("x", False)),
    "temperature": (
        ("0", True),
        ("0.8", True),
        ("-0.5", False),
        ("nan", False),
        ("inf", False),
        ("x", False),
    ),
    "top-k": (("1", True), ("40", True), ("0", False), ("-3", False), ("1.5", False)),
    "top-p": (("0.9", True), ("1", True), ("0", False), ("1.5", False), ("nan", False)),
    "eos": (("0", True), ("2", True), ("-1", False)),
    "seed": (("0", True), ("7", True), ("x", False)),
}
SAMPLE_REACHED = "probe: the run would load here"


@pytest.fixture
def recorded_sample(monkeypatch, tmp_path):
    """A run directory whose loading is a recorder: the flags are checked, nothing is loaded."""
    from axdsl import sampling

    calls: list[Path] = []

    def record(run_dir, use):
        calls.append(run_dir)
        return SAMPLE_REACHED  # sample prints it as its error: the checks were passed

    monkeypatch.setattr(sampling, "load_run_model", record)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    return calls


@pytest.mark.parametrize("seed", range(16))
def test_fuzzed_sample_flags_are_refused_exactly_when_wrong(recorded_sample, seed):
    rng = random.Random(3000 + seed)
    given = {
        name: pick(rng, SAMPLE_VALUES[name])
        for name in rng.sample(sorted(SAMPLE_VALUES), rng.randint(1, 3))
    }
    argv = ["sample", "run", "hi"]
    for name, (text, _) in given.items():
        argv += _flag(rng, name, text)
    o = run_main(argv)
    assert_no_crash(o, repr(argv))
    if all(ok for _, ok in given.values()):
        assert o.rc == 1 and SAMPLE_REACHED in o.err and recorded_sample, f"{argv!r}\n{o.err}"
        return
    assert o.rc != 0 and not recorded_sample, f"{argv!r} passed a wrong value:\n{o.err}"
    assert _names_a_wrong_flag(o.err, given), f"{argv!r}: the error names no wrong flag\n{o.err}"


AOT_LEAST = {"batch": 1, "seq": 2}


def _int_in(text: str, low: int) -> bool:
    """Whether argparse reads `text` as an integer from `low` to 2**31 - 1."""
    try:
        return low <= int(text) <= 2**31 - 1
    except ValueError:
        return False


@pytest.fixture
def recorded_aot(monkeypatch, tmp_path):
    from axdsl import aot

    calls: list[tuple] = []
    monkeypatch.setattr(aot, "run", lambda *args, **kwargs: calls.append(args) or 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.axl").write_text(MODEL)
    return calls


@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_aot_flags_are_refused_exactly_when_wrong(recorded_aot, seed):
    """`aot --batch 0` reported a fit with exit 0 and `--seq -1` printed negative FLOPs (found by
    the probe harness): the sizes are checked as train's are."""
    rng = random.Random(4000 + seed)
    given: dict[str, tuple[str, bool]] = {}
    for name in rng.sample(["batch", "seq", "target"], rng.randint(1, 3)):
        if name == "target":
            given[name] = pick(rng, TARGETS)
            continue
        ok = functools.partial(_int_in, low=AOT_LEAST[name])
        text = pick(rng, INT_VALUES, ok)
        given[name] = (text, ok(text))
    argv = ["aot", "m.axl"]
    for name, (text, _) in given.items():
        argv += _flag(rng, name, text)
    o = run_main(argv)
    assert_no_crash(o, repr(argv))
    if all(ok for _, ok in given.values()):
        assert o.rc == 0 and len(recorded_aot) == 1, f"{argv!r} was refused:\n{o.err}"
        _, target, _, batch, seq = recorded_aot[0]
        assert target == given.get("target", ("cpu", True))[0]
        assert (batch, seq) == tuple(
            int(given[n][0]) if n in given else None for n in ("batch", "seq")
        ), argv
        return
    assert o.rc != 0 and not recorded_aot, f"{argv!r} passed a wrong value:\n{o.err}"
    assert _names_a_wrong_flag(o.err, given), f"{argv!r}: the error names no wrong flag\n{o.err}"


# train.py's own flags (python -m generated.<spec>.<target>.train): tiny_llama's trainer, in this
# process, stopped by a recorder once its checks are done (before the memory check and the data)
TRAINER_LEAST = {
    "steps": 1,
    "batch": 1,
    "seq": 2,
    "microbatches": 1,
    "log-every": 1,
    "eval-every": 0,
    "seed": 0,
    "checkpoint-every": 0,
    "steps-per-call": 1,
}
TRAINER_INTS = ("0", "1", "2", "4", "8", "16", "64", "129", "-3", "2147483648", "x")
TRAINER_POOLS = {  # mostly values that pass the cross conditions too, so that each flag is tested
    "batch": ("8", "16", "64", "0", "-3", "x", "2147483648"),
    "microbatches": ("1", "2", "8", "0", "-3", "x"),
    "seq": ("2", "64", "128", "129", "1", "0", "x"),
}
PROFILES = (("2:4", True), ("0:1", True), ("4:2", False), ("x", False), ("-1:3", False))


class Checked(Exception):
    """Raised by the recorder after train.py's checks: they passed."""


def _trainer_valid(given: dict[str, tuple[str, bool]], ways: int, max_seq: int) -> bool:
    """Every value in its range, and together: the batch splits into micro-batches of a multiple
    of the data-parallel ways, seq fits max_seq, a profile window ends within the steps."""
    if not all(ok for _, ok in given.values()):
        return False
    value = {n: int(t) for n, (t, _) in given.items() if n != "profile" and n != "lr"}
    batch, micro = value.get("batch", 8), value.get("microbatches", 1)
    if batch % micro or (batch // micro) % ways or value.get("seq", 64) > max_seq:
        return False
    stop = int(given["profile"][0].split(":")[1]) if "profile" in given else 0
    return stop <= value.get("steps", 1000)


@pytest.mark.parametrize("seed", range(48))
def test_fuzzed_trainer_flags_are_refused_exactly_when_wrong(tmp_path, monkeypatch, seed):
    """train.py checks its own flags as a train block checks the same keys (--microbatches 0
    divided by zero; --lr -1 trained by gradient ascent): a wrong value exits 1 naming it before
    any data or compute, and a right one reaches the run with exactly the values given."""
    from generated.tiny_llama.cpu import train as tm

    reached: list = []

    def record(cfg, tc, mesh):
        original(cfg, tc, mesh)
        reached.append(tc)
        raise Checked()

    original = tm.check_config
    monkeypatch.setattr(tm, "check_config", record)
    mesh = tm.make_mesh()
    ways = mesh.shape["data"]  # conftest's 8 fake devices: the cpu target puts them on `data`
    rng = random.Random(5000 + seed)
    given: dict[str, tuple[str, bool]] = {}
    for name in rng.sample([*TRAINER_LEAST, "lr", "profile"], rng.randint(1, 4)):
        if name == "lr":
            text = pick(rng, LR_VALUES, _lr_ok)
            given[name] = (text, _lr_ok(text))
        elif name == "profile":
            given[name] = pick(rng, PROFILES)
        else:
            ok = functools.partial(_int_in, low=TRAINER_LEAST[name])
            text = pick(rng, TRAINER_POOLS.get(name, TRAINER_INTS), ok)
            given[name] = (text, ok(text))
    argv = ["--out", str(tmp_path / "run"), "--compile-cache", "none", "--seq", "64"]
    argv = argv[:-2] if "seq" in given else argv
    for name, (text, _) in given.items():
        argv += _flag(rng, name, text)
    valid = _trainer_valid(given, ways, tm.CONFIGS[tm.TRAIN.model].max_seq)
    signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            tm.main(argv)
        rc, message = 0, err.getvalue()
    except Checked:
        rc, message = 0, err.getvalue()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
        message = err.getvalue() + (exc.code if isinstance(exc.code, str) else "")
    finally:
        for signum, handler in signals.items():  # main installs its own before its checks
            signal.signal(signum, handler)
    case = f"train.py {argv[2:]!r}"
    assert "Traceback" not in message, f"{case}\n{message}"
    if valid:
        assert rc == 0 and reached, f"{case} was refused:\n{message}"
        tc = reached[0]
        for name, (text, _) in given.items():
            field = name.replace("-", "_")
            if name == "profile":
                continue
            want = float(text) if name == "lr" else int(text)
            assert getattr(tc, field) == want, f"{case}: {field} is {getattr(tc, field)}"
        return
    assert rc != 0 and not reached, f"{case} passed a wrong value:\n{message}"
    wrong = [n for n, (_, ok) in given.items() if not ok]
    if wrong:
        assert any(f"--{n}" in message for n in wrong), f"{case}: names no wrong flag\n{message}"
    else:  # right values that do not go together: the batch split, max_seq, the profile window
        assert any(w in message for w in ("batch", "seq", "--profile")), f"{case}\n{message}"
