"""Fuzz the front end and the build: mutated specs and random bytes never crash axdsl.

Each case is a spec text made from a seed: one of the committed specs or tests/errors fixtures with
one to three grammar-aware mutations (tokens swapped, deleted or duplicated, numbers set to extreme
values, random identifiers inserted, the text truncated), or random bytes. It goes through the real
front end and build (`axdsl.build.build_files`, which runs `compile_spec`, renders and checks every
file). The oracle (`failure`) accepts exactly two outcomes:

- a `CompileError` whose every diagnostic is located (`file:line:col` in a file of the case);
- generated files, every `.py` of which passes `axdsl.codegen.format.check_generated`;

and each case must take under 5 s of CPU time on its own thread (CPU, not wall time, so that a
loaded CI machine does not fail it; this thread's, not the process's, so that threads left running
by earlier tests in the same pytest process, such as XLA's or orbax's, are not billed to the build;
a wall-clock alarm catches a true hang). Anything else is a failure.

CI runs a few hundred cases here; `python benchmarks/fuzz.py` runs thousands and prints the seeds
of failures, which `make_case(seed)` rebuilds.
"""

from __future__ import annotations

import gc
import random
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from axdsl.build import build_files
from axdsl.codegen.format import check_generated
from axdsl.errors import CompileError

ROOT = Path(__file__).resolve().parent.parent
CPU_LIMIT_S = 5.0  # a case over this much CPU time counts as a hang (the largest spec builds in 1.1-1.6 s)
WALL_LIMIT_S = 30  # the alarm that stops a case that really hangs
TARGETS = ("cpu", "cpu", "gpu-h100-8", "tpu-v5e-256")

# A spec's tokens: strings, comments, numbers, names, whitespace, any other single character.
TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|[A-Za-z_]\w*|\s+|.', re.S)
NUMBER = re.compile(r"\d")
EXTREMES = (
    "0", "-1", "1", "-0", "0.0", "-0.0", "1e-400", "1e308", "1e309", "-1e309", "nan", "inf",
    "2147483648", "9223372036854775807", "9223372036854775808", "1099511627776", "1" + "0" * 400,
    "0.5", "3.0", "007", "1_000", "1e", "1.2.3",
)
NAMES = (
    "x", "dim", "vocab", "heads", "kv_heads", "layers", "ffn", "model", "layer", "param", "forward",
    "return", "repeat", "if", "else", "import", "train", "target", "extends", "int", "float", "bool",
    "true", "false", "None", "__import__", "os", "self", "B", "S", "mesh", "rules", "remat",
    "quantize", "kernels", "data", "tokens", "text", "batch", "seq", "steps", "lambda", "exec",
)
PUNCT = tuple("{}()[]<>=,.:;@+-*/%\"#|&^~!?$\\'") + ("->", "**", "\n", "\x00", "é", "\u202e")


@dataclass(frozen=True)
class Case:
    """One fuzz input: where it came from, its text (or bytes), the target to build for."""

    seed: int
    origin: str
    data: bytes
    target: str


def corpus() -> tuple[list[Path], list[Path]]:
    """The committed specs and the error fixtures, each in a fixed order."""
    return sorted((ROOT / "specs").glob("*.axl")), sorted((ROOT / "tests" / "errors").glob("*.axl"))


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def _pick(rng: random.Random, toks: list[str], solid: bool = True) -> int:
    """An index into `toks`, preferring tokens that are not whitespace or comments."""
    indexes = [i for i, t in enumerate(toks) if not (t.isspace() or t.startswith("#"))] if solid else []
    return rng.choice(indexes or range(len(toks)))


def _kind(tok: str) -> str:
    """A token's class: swaps stay within one, so that most mutants still parse."""
    if tok[:1].isdigit():
        return "number"
    if tok[:1].isalpha() or tok[:1] == "_":
        return "name"
    return "string" if tok.startswith('"') else tok


def swap(rng: random.Random, toks: list[str]) -> None:
    i = _pick(rng, toks)
    same = [j for j, t in enumerate(toks) if _kind(t) == _kind(toks[i])]
    j = rng.choice(same) if rng.random() < 0.8 else _pick(rng, toks)
    toks[i], toks[j] = toks[j], toks[i]


def rename(rng: random.Random, toks: list[str]) -> None:
    names = [i for i, t in enumerate(toks) if _kind(t) == "name"] or [_pick(rng, toks)]
    toks[rng.choice(names)] = rng.choice(NAMES + tuple(t for t in toks if _kind(t) == "name"))


def delete_line(rng: random.Random, toks: list[str]) -> None:
    """Delete the tokens from one newline to the next (a statement, a member, a setting)."""
    breaks = [i for i, t in enumerate(toks) if "\n" in t] or [0]
    k = rng.randrange(len(breaks))
    end = breaks[k + 1] if k + 1 < len(breaks) else len(toks)
    del toks[breaks[k] + 1:end]


def duplicate_line(rng: random.Random, toks: list[str]) -> None:
    breaks = [i for i, t in enumerate(toks) if "\n" in t] or [0]
    k = rng.randrange(len(breaks))
    end = breaks[k + 1] if k + 1 < len(breaks) else len(toks)
    toks[breaks[k] + 1:breaks[k] + 1] = toks[breaks[k] + 1:end + 1]


def delete(rng: random.Random, toks: list[str]) -> None:
    del toks[_pick(rng, toks)]


def duplicate(rng: random.Random, toks: list[str]) -> None:
    i = _pick(rng, toks)
    toks.insert(i, toks[i] + rng.choice(("", " ", "\n")))


def extreme_number(rng: random.Random, toks: list[str]) -> None:
    numbers = [i for i, t in enumerate(toks) if NUMBER.match(t)]
    i = rng.choice(numbers) if numbers else _pick(rng, toks)
    toks[i] = rng.choice(EXTREMES)


def insert_name(rng: random.Random, toks: list[str]) -> None:
    name = rng.choice(NAMES) if rng.random() < 0.7 else "".join(rng.choices("abcxyz_0", k=rng.randint(1, 12)))
    toks.insert(rng.randrange(len(toks) + 1), rng.choice(("", " ")) + name + " ")


def insert_punct(rng: random.Random, toks: list[str]) -> None:
    toks.insert(rng.randrange(len(toks) + 1), rng.choice(PUNCT))


def truncate(rng: random.Random, toks: list[str]) -> None:
    del toks[rng.randrange(len(toks) + 1):]


# Weighted towards mutations that keep the spec parseable, so that later stages get exercised.
MUTATIONS = (swap, swap, rename, rename, delete, duplicate, delete_line, delete_line, duplicate_line,
             extreme_number, extreme_number, extreme_number, extreme_number, insert_name,
             insert_punct, truncate)


def make_case(seed: int) -> Case:
    """The case of `seed`: nine in ten are mutated specs, the rest random bytes (some after a spec)."""
    rng = random.Random(seed)
    target = rng.choice(TARGETS)
    specs, fixtures = corpus()
    source = rng.choice(specs if rng.random() < 0.6 else fixtures)  # specs reach the later stages
    text = source.read_text(encoding="utf-8")
    if rng.random() < 0.1:
        junk = rng.randbytes(rng.randint(0, 300))
        data = junk if rng.random() < 0.5 else text.encode()[: rng.randrange(len(text) + 1)] + junk
        return Case(seed, f"random bytes after {source.name}", data, target)
    toks = tokens(text) or [""]
    names = []
    for _ in range(rng.randint(1, 3)):
        mutation = rng.choice(MUTATIONS)
        mutation(rng, toks)
        names.append(mutation.__name__)
        toks = toks or [""]
    return Case(seed, f"{source.name} + {', '.join(names)}", "".join(toks).encode(), target)


class Hang(Exception):
    pass


def _alarm(signum, frame) -> None:
    raise Hang()


def workdir(tmp: Path) -> Path:
    """A copy of specs/ and tests/errors/ in `tmp`, so that a case's relative imports resolve."""
    for name in ("specs", "errors"):
        if not (tmp / name).exists():
            shutil.copytree(ROOT / ("specs" if name == "specs" else "tests/errors"), tmp / name)
    return tmp


def failure(case: Case, tmp: Path) -> str | None:
    """None when axdsl handled `case` cleanly, else what went wrong (one line)."""
    folder = "errors" if case.origin.split(" ")[-1] in {p.name for p in (ROOT / "tests" / "errors").glob("*.axl")} else "specs"
    path = workdir(tmp) / folder / f"fuzz_{case.seed}.axl"
    path.write_bytes(case.data)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(WALL_LIMIT_S)
    start = time.thread_time()
    try:
        problem = _outcome(path, case.target)
    except Hang:
        problem = f"hang: no answer after {WALL_LIMIT_S} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        path.unlink()
    spent = time.thread_time() - start
    if problem is None and spent > CPU_LIMIT_S:
        problem = f"slow: {spent:.1f} s of CPU time"
    return problem


def _outcome(path: Path, target: str) -> str | None:
    try:
        files = build_files(path, target)
    except CompileError as exc:
        return _unlocated(exc)
    except RecursionError:
        return "crash: RecursionError"
    except Exception as exc:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        return f"crash: {type(exc).__name__}: {str(exc)[:300]}"
    for name, text in files.items():
        if name.endswith(".py"):
            check_generated(text, name)
    return None


def _unlocated(exc: CompileError) -> str | None:
    """A diagnostic without a real file, line and column, if any."""
    for diag in exc.diagnostics:
        span = diag.span
        if span.file == "<unknown>" or span.line < 1 or span.col < 1:
            return f"unlocated error: {span}: {diag.message[:200]}"
    try:
        exc.render()
    except Exception as err:  # noqa: BLE001
        return f"crash while rendering the error: {type(err).__name__}: {err}"
    return None


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Iterator[Path]:
    """The cases' working folder. Earlier tests' objects are frozen out of the garbage collector
    meanwhile, so that a collection during a case scans only that case's objects."""
    gc.collect()
    gc.freeze()
    yield tmp_path_factory.mktemp("fuzz")
    gc.unfreeze()


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzzed_specs_build_or_fail_cleanly(fuzz_dir, seed):
    case = make_case(seed)
    assert failure(case, fuzz_dir) is None, f"seed {seed} ({case.origin}, {case.target})"


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_random_bytes_fail_cleanly(fuzz_dir, data):
    case = Case(0, "random bytes", data, "cpu")
    assert failure(case, fuzz_dir) is None, repr(data)


# Crashes the fuzzer found, kept as regression cases.
def test_a_spec_that_is_not_utf8_is_a_located_error(tmp_path):
    spec = tmp_path / "bin.axl"
    spec.write_bytes(b'import "std/transformer.axl"\nmodel m = \xff\xfe DecoderLM {}\n')
    with pytest.raises(CompileError) as exc:
        build_files(spec, "cpu")
    assert "bin.axl:2:11: error: the file is not UTF-8 text: byte 0xff" in str(exc.value)


def test_a_model_without_parameters_builds(tmp_path):
    spec = tmp_path / "plain.axl"
    spec.write_text("layer Id(dim: int) {\n  forward(x: [B, dim]) -> [B, dim] { return x }\n}\n"
                    "model m = Id { dim = 4 }\n")
    files = build_files(spec, "cpu")
    check_generated(files["model.py"], "model.py")
