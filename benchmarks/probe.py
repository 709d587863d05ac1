"""A hostile-input harness (issue 38, item 5): each probe does one thing a user, a script or the
machine can do wrong, and says what axdsl must do about it.

A probe is data: its class (spec, cli, data, rundir, resume, signal, disk, hf, write), what is done
(an argv and the files made before it), and the expected outcome: the exit code, words in the error,
and files that must stay untouched, exist or not exist afterwards. Every probe also holds to what
the README promises of every command: no Python traceback and no internal error (exit 70). A probe
whose expected exit is 0 checks words of the right result, so that no case exits 0 while wrong.

Probes run where the work really happens, in this process wherever a process is not the point:

- axdsl: `axdsl.cli.main(argv)`, output captured as Python writes it under a UTF-8 locale;
- trainer: the committed tiny_llama trainer's `main(argv)` (generated/tiny_llama/cpu/train.py),
  which refuses before data and compute, or resumes a run whose steps are all taken;
- process: a real process (`python -m axdsl ...` or the trainer), where a signal or a kernel
  limit is the point; optionally sent a signal once a line appears on its stderr;
- tmpfs: a process inside a user namespace with a tiny tmpfs mounted (`unshare -rm`): a disk that
  is really full. Skipped, with the reason, where user namespaces are not allowed.

All probes share one lab: a spec, text data, a real tiny_llama run of 2 steps (checkpoints 1 and
2) and its export to a Hugging Face directory. Each probe works in a fresh folder of its own.

    python benchmarks/probe.py [-k WORDS] [--class CLASS]

prints a table (class, case, expected, got, ok) and exits 1 if any probe failed.
tests/test_probe.py runs the same probes as parametrized tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # as tests/conftest
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # generated/ (the committed trainers) is imported from here

NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # what Python makes of an argument that is not UTF-8
SPEC = ROOT / "specs" / "tiny_llama.axl"
TRAINER = "generated.tiny_llama.cpu.train"  # the committed trainer of SPEC
HEAD = (
    'import "std/transformer.axl"\nmodel m = DecoderLM {\n'
    "  vocab = 256  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 128\n"
)
MODEL = HEAD + "}\n"
TEXT = "the quick brown fox jumps over the lazy dog; " * 400  # 18 KB of text data
# The lab's run: tiny_llama, 2 steps of batch 8 x 16 tokens, a checkpoint after each
RUN_FLAGS = (
    "--data", "d.txt", "--steps", "2", "--batch", "8", "--seq", "16", "--checkpoint-every", "1",
    "--eval-every", "0", "--no-progress", "--compile-cache", "none",
)  # fmt: skip
# The same in a process of its own: the processes share a compile cache (in-process trainers keep
# none, which would stay set for everything else this process runs)
PROCESS_FLAGS = (*RUN_FLAGS[:-1], "{lab}/cache")
INTERNAL = 70  # axdsl.cli.EXIT_INTERNAL
NEWLINE_IMPORT = 'e\nfrom os import system; system("touch X")\n#.axl'  # issue 51's imported file
UNFORMATTED = MODEL.replace("  dim = 64", "    dim=64")  # what `axdsl fmt` rewrites
# Run in a tmpfs of its own: the spec goes onto it, a file fills it, then `axdsl fmt` rewrites the
# spec; a file written in place would be left cut short (issue 51, item 3)
FMT_ON_FULL_DISK = """
import shutil, sys
from axdsl.cli import main
shutil.copyfile("m.axl", "disk/m.axl")
with open("disk/fill", "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError:
        pass
code = main(["fmt", "disk/m.axl"])
whole = open("disk/m.axl", "rb").read() == open("m.axl", "rb").read()
print("the spec is whole" if whole else "the spec was cut", file=sys.stderr)
sys.exit(code)
"""


# ------------------------------------------------------------------------------ the lab


@dataclass
class Lab:
    """The shared folder: m.axl, d.txt, run/ (a real 2-step tiny_llama run), hf/ (its export)."""

    root: Path

    def case_dir(self, name: str) -> Path:
        folder = Path(tempfile.mkdtemp(prefix=_slug(name) + "-", dir=self.root / "cases"))
        return folder


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:40]


def make_lab(root: Path) -> Lab:
    """Build the lab in `root` (about 6 s: one tiny training run and one export)."""
    (root / "cases").mkdir(parents=True, exist_ok=True)
    (root / "m.axl").write_text(MODEL)
    (root / "d.txt").write_text(TEXT)
    lab = Lab(root)
    with _cwd(root):  # a process of its own, to fill the compile cache the other processes use
        flags = [a.replace("{lab}", str(root)) for a in PROCESS_FLAGS]
        got = run_process([sys.executable, "-m", TRAINER, "--out", "run", *flags], None)
        assert got.rc == 0 and (root / "run/checkpoints/2").is_dir(), got.err[-3000:]
        got = run_axdsl(["export-hf", str(SPEC), "run", "--out", "hf"])
        assert got.rc == 0 and (root / "hf/config.json").is_file(), got.err[-3000:]
    return lab


@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


# ------------------------------------------------------------------------------ set-up steps
# Each makes something in the probe's folder (`here`), given the lab.

Step = Callable[[Path, Lab], None]


def write(name: str, content: str | bytes) -> Step:
    def step(here: Path, lab: Lab) -> None:
        path = here / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    return step


def mkdir(name: str) -> Step:
    return lambda here, lab: (here / name).mkdir(parents=True, exist_ok=True)


def fifo(name: str) -> Step:
    def step(here: Path, lab: Lab) -> None:
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(here / name)

    return step


def symlink(name: str, to: str) -> Step:
    def step(here: Path, lab: Lab) -> None:
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        (here / name).symlink_to(to)

    return step


def lab_copy(name: str, as_name: str | None = None) -> Step:
    """A copy of the lab's `name` (run, hf, d.txt, m.axl) in the probe's folder."""

    def step(here: Path, lab: Lab) -> None:
        source, dest = lab.root / name, here / (as_name or name)
        if source.is_dir():
            shutil.copytree(source, dest, symlinks=True)
        else:
            shutil.copyfile(source, dest)

    return step


RUN = (lab_copy("run"), lab_copy("d.txt"))  # a copy of the lab's run and its data


def edit_json(name: str, change: Callable[[Any], Any]) -> Step:
    def step(here: Path, lab: Lab) -> None:
        path = here / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))

    return step


def remove(pattern: str) -> Step:
    """Delete the files or folders that match `pattern` in the probe's folder."""

    def step(here: Path, lab: Lab) -> None:
        for path in here.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    return step


CHAT_EXAMPLE = ROOT / "examples" / "chat"
CHAT_TRAIN = (
    'train {\n  batch = 4  seq = 32  steps = 2  eval_every = 0\n'
    '  data = chat("conversations.jsonl", tokenizer = "tokenizer")\n}\n'
)


def chat_data(template: str) -> Step:
    """m.axl training on examples/chat's conversations, with their tokenizer's chat template
    replaced by `template` (issue 51: chat templates are untrusted programs)."""

    def step(here: Path, lab: Lab) -> None:
        shutil.copytree(CHAT_EXAMPLE / "tokenizer", here / "tokenizer")
        shutil.copyfile(CHAT_EXAMPLE / "conversations.jsonl", here / "conversations.jsonl")
        (here / "tokenizer" / "chat_template.jinja").write_text(template)
        (here / "m.axl").write_text(MODEL + CHAT_TRAIN)

    return step


def chat_run(template: str) -> Step:
    """A copy of the lab's run that keeps a chat template (as a chat run does): `template`,
    beside examples/chat's tokenizer.json."""

    def step(here: Path, lab: Lab) -> None:
        shutil.copyfile(CHAT_EXAMPLE / "tokenizer" / "tokenizer.json", here / "run/tokenizer.json")
        (here / "run" / "chat_template.jinja").write_text(template)

    return step


# Hostile chat templates: each fails or stops fast, as a located error
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE_TEMPLATES = (
    ("{{ 1/0 }}", "ZeroDivisionError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{% for i in range(10**9) %}x{% endfor %}", "MAX_RANGE"),
    ("{{ 'x' * 10**10 }}", "a value of 10,000,000,000 items"),
    ("{% include 'other.jinja' %}", "no loader"),
    ("{{ messages + 1 }}", "TypeError"),
    (NESTED_LOOPS, "it renders for longer than 2 s"),
)


def spec(setting: str, train: str = "") -> Step:
    """m.axl: the tiny DecoderLM with one more model setting and an optional train block."""
    return write("m.axl", HEAD + (f"  {setting}\n" if setting else "") + "}\n" + train)


def live_lock(here: Path, lab: Lab) -> None:
    """RUN/lock held by this very process (alive, on this host)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    (here / "run" / "lock").write_text(json.dumps(record))


def _with(info: Any, **changes: Any) -> dict:
    return {**info, **changes}


# ------------------------------------------------------------------------------ probes


@dataclass(frozen=True)
class Probe:
    """One hostile input and what must come of it."""

    cls: str  # spec, cli, data, rundir, resume, signal, disk, hf, write
    name: str
    argv: tuple[str, ...]  # axdsl's (or the trainer's) arguments; {root}: the repository,
    # {lab}: the lab's folder
    rc: int | tuple[int, ...]  # the exit code(s) expected
    says: tuple[str, ...] = ()  # words in stderr (in stdout for an exit 0: the right result)
    make: tuple[Step, ...] = ()  # set-up in the probe's folder
    untouched: tuple[str, ...] = ()  # paths (files or folders) whose bytes must not change
    exists: tuple[str, ...] = ()  # paths that must exist afterwards
    absent: tuple[str, ...] = ()  # paths that must not exist afterwards
    run: str = "axdsl"  # axdsl, trainer, process, tmpfs
    send: tuple[int, str] | None = None  # (signal, a stderr line's words to wait for): process
    tmpfs_kib: int = 0  # tmpfs: the size of the disk mounted at ./disk
    issue: bool = False  # one of issue 38's findings (else added by this harness)
    elsewhere: str = ""  # a slow probe that a test elsewhere runs in CI: tests/test_probe skips it
    trainer: str = TRAINER  # the trainer module a `trainer` probe runs

    @property
    def id(self) -> str:
        return f"{self.cls}:{self.name}"

    @property
    def expected(self) -> str:
        rc = "/".join(map(str, self.rc)) if isinstance(self.rc, tuple) else str(self.rc)
        return f"exit {rc}" + (f", {self.says[0]!r}" if self.says else "")


def _codes(p: Probe) -> tuple[int, ...]:
    return p.rc if isinstance(p.rc, tuple) else (p.rc,)


C = Probe  # short, for the table below
T = "trainer"
SPEC_S = str(SPEC)

PROBES: list[Probe] = [
    # ---------------------------------------------------------------- specs (axdsl check)
    C("spec", "heads = 0", ("check", "m.axl"), 1, ("m.axl:4:", "division by zero"),
      (spec("heads = 0"),), issue=True),
    C("spec", "SwiGLU(hiden = 96)", ("check", "m.axl"), 1, ("m.axl:4:", "has no hyperparameter"),
      (spec("block = Block(mlp = SwiGLU(hiden = 96))"),), issue=True),
    C("spec", "dim = -64", ("check", "m.axl"), 1, ("m.axl:4:", "must be a positive int, got -64"),
      (spec("dim = -64"),), issue=True),
    C("spec", "layers = 0", ("check", "m.axl"), 1, ("m.axl:4:", "`repeat` count must be a"),
      (spec("layers = 0"),), issue=True),
    C("spec", "causal = false in a DecoderLM", ("check", "m.axl"), 1, ("m.axl:4:", "not causal"),
      (spec("block = Block(attn = Attention(causal = false))"),), issue=True),
    C("spec", "max_seq = 0", ("check", "m.axl"), 1, ("m.axl:4:", "max_seq = 0 leaves m no"),
      (spec("max_seq = 0"),), issue=True),
    C("spec", "layers = 10**12", ("check", "m.axl"), 1, ("m.axl:4:", "is too large"),
      (spec("layers = 1000000000000"),), issue=True),
    C("spec", "rope_dim = 3 beside rope_theta", ("check", "m.axl"), 0, ("m.axl: ok (m)",),
      (spec("rope_theta = 10000.0\n  block = Block(attn = Attention(rope_dim = 3))"),),
      issue=True),
    C("spec", "a UTF-8 byte-order mark", ("check", "m.axl"), 0, ("m.axl: ok (m)",),
      (write("m.axl", b"\xef\xbb\xbf" + MODEL.encode()),), issue=True),
    C("spec", "CR-only line ends", ("check", "m.axl"), 0, ("m.axl: ok (m)",),
      (write("m.axl", MODEL.replace("\n", "\r")),), issue=True),
    C("spec", 'import "/dev/zero"', ("check", "m.axl"), 1, ("not a regular file",),
      (write("m.axl", 'import "/dev/zero"\n' + MODEL),), issue=True),
    C("spec", "import of a FIFO", ("check", "m.axl"), 1, ("not a regular file",),
      (fifo("p.axl"), write("m.axl", 'import "p.axl"\n' + MODEL)), issue=True),
    C("spec", "an empty file", ("check", "m.axl"), 1, ("m.axl:", "defines no model"),
      (write("m.axl", ""),)),
    C("spec", "NUL bytes", ("check", "m.axl"), 1, ("m.axl:",),
      (write("m.axl", MODEL.replace("vocab", "vo\0cab")),)),
    C("spec", "it imports itself", ("check", "m.axl"), 1, ("m.axl:1:", "import"),
      (write("m.axl", 'import "m.axl"\n' + MODEL),)),
    C("spec", "an import that is not there", ("check", "m.axl"), 1, ("m.axl:1:", "nope.axl"),
      (write("m.axl", 'import "nope.axl"\n' + MODEL),)),
    C("spec", "an import of binary bytes", ("check", "m.axl"), 1, ("b.axl", "not UTF-8"),
      (write("b.axl", bytes(range(256))), write("m.axl", 'import "b.axl"\n' + MODEL))),
    C("spec", "extends an unknown model", ("check", "m.axl"), 1, ("m.axl:", "nosuch"),
      (write("m.axl", MODEL + "model n extends nosuch { dim = 32 }\n"),)),
    C("spec", "a model defined twice", ("check", "m.axl"), 1, ("m.axl:", "twice"),
      (write("m.axl", MODEL + MODEL.split("\n", 1)[1]),)),
    C("spec", "a directory as the spec", ("check", "d.axl"), 1, ("d.axl",), (mkdir("d.axl"),)),
    C("spec", "fmt of a binary file", ("fmt", "b.axl"), 1, ("b.axl",),
      (write("b.axl", bytes(range(256))),), untouched=("b.axl",)),
    C("spec", "fmt --check of a spec that does not parse", ("fmt", "m.axl"), 1, ("m.axl:",),
      (write("m.axl", MODEL + "model {\n"),), untouched=("m.axl",)),
    C("spec", "two train blocks", ("check", "m.axl"), 1, ("m.axl:", "train"),
      (spec("", "train { steps = 10 }\ntrain { steps = 20 }\n"),)),
    # issue 51: names the user chose reach generated code only as text (tests/test_injection.py
    # also compiles each file, runs slurm.sh with a stand-in srun and fuzzes such names)
    C("spec", "build a spec named a$(touch X).axl", ("build", "a$(touch X).axl", "--out", "gen"),
      0, ("built",), (write("a$(touch X).axl", MODEL),),
      exists=("gen/a$(touch X)/cpu/slurm.sh",), absent=("X",)),
    C("spec", "build a spec importing a file named with a newline and Python",
      ("build", "m.axl", "--out", "gen"), 0, ("built",),
      (write(NEWLINE_IMPORT, MODEL.replace("model m", "model base")),
       write("m.axl", f"import {json.dumps(NEWLINE_IMPORT)}\nmodel m extends base {{ dim = 32 }}")),
      exists=("gen/m/cpu/model.py",), absent=("X",)),
    # ---------------------------------------------------------------- CLI values
    *(
        C("cli", f'{cmd} --target ""', (cmd, *args, "--target", ""), 2, ("target",),
          (write("m.axl", MODEL),), absent=("generated",), issue=True)
        for cmd, args in (("build", ("m.axl",)), ("check", ("m.axl",)), ("dump", ("m.axl",)),
                          ("aot", ("m.axl",)), ("stats", ("m.axl",)), ("train", ("m.axl",)))
    ),
    C("cli", 'diff -t cpu -t ""', ("diff", "m.axl", "-t", "cpu", "-t", ""), 2, ("target",),
      (write("m.axl", MODEL),), issue=True),
    *(
        C("cli", f"train {flag} {value}", ("train", "m.axl", f"{flag}={value}"), 2, (flag,),
          (write("m.axl", MODEL),), absent=("generated", "runs"), issue=issue)
        for flag, value, issue in (
            ("--lr", "-1", True), ("--steps", "0", True), ("--steps", "-5", True),
            ("--checkpoint-every", "-3", True), ("--lr", "nan", True), ("--batch", "0", False),
            ("--seq", "1", False), ("--lr", "inf", False), ("--steps", "2147483648", False),
            ("--data", "", False), ("--checkpoint-every", "x", False), ("--model", " ", False),
        )
    ),
    C("cli", "sample a prompt that is not UTF-8", ("sample", "run", "--prompt", "a" + NOT_UTF8),
      1, ("not UTF-8",), RUN, untouched=("run",), issue=True),
    C("cli", "build --out an existing file", ("build", "m.axl", "--out", "f"), 1, ("f",),
      (write("m.axl", MODEL), write("f", "mine")), untouched=("f",), issue=True),
    C("cli", "dump --after a pass that is not", ("dump", "m.axl", "--after", "nosuch"), 2,
      ("unknown pass `nosuch`",), (write("m.axl", MODEL),)),
    C("cli", "diff with one target", ("diff", "m.axl", "-t", "cpu"), 2, ("exactly two",),
      (write("m.axl", MODEL),)),
    C("cli", "aot --batch 0", ("aot", "m.axl", "--batch", "0"), (1, 2), ("batch",),
      (write("m.axl", MODEL),)),
    C("cli", "aot --seq -1", ("aot", "m.axl", "--seq", "-1"), (1, 2), ("seq",),
      (write("m.axl", MODEL),)),
    C("cli", "stats --model that is not", ("stats", "m.axl", "--model", "nosuch"), (1, 2),
      ("nosuch",), (write("m.axl", MODEL),)),
    C("cli", "aot --model that is not", ("aot", "m.axl", "--model", "nosuch"), (1, 2),
      ("nosuch",), (write("m.axl", MODEL),)),
    C("cli", "sample --max-tokens -1", ("sample", "run", "--max-tokens", "-1"), 1,
      ("max",), RUN, untouched=("run",)),
    C("cli", "sample --temperature nan", ("sample", "run", "--temperature", "nan"), 1,
      ("temperature",), RUN, untouched=("run",)),
    C("cli", "sample --top-p 1.5", ("sample", "run", "--top-p", "1.5"), 1, ("top",), RUN,
      untouched=("run",)),
    C("cli", "sample --top-k 0", ("sample", "run", "--top-k", "0"), 1, ("top",), RUN,
      untouched=("run",)),
    C("cli", "sample two different prompts", ("sample", "run", "a", "--prompt", "b"), 2,
      ("two prompts",), RUN, untouched=("run",)),
    C("cli", "eval --task that is not there", ("eval", "run", "--task", "t.jsonl"), 1,
      ("t.jsonl",), RUN, untouched=("run",)),
    C("cli", "eval --task an empty file", ("eval", "run", "--task", "t.jsonl"), 1, ("t.jsonl",),
      (*RUN, write("t.jsonl", "")), untouched=("run",)),
    C("cli", "eval --batch 0", ("eval", "run", "--task", "t.txt", "--batch", "0"), (1, 2),
      ("batch",), (*RUN, write("t.txt", "some text to score\n")), untouched=("run",)),
    C("cli", "plot --out in a missing folder", ("plot", "run", "--out", "no/x.png"), 1,
      ("does not exist",), RUN, absent=("no",)),
    C("cli", "plot --out a format matplotlib has not", ("plot", "run", "--out", "x.foo"), 1,
      ("Format 'foo' is not supported",), RUN, absent=("x.foo",)),
    C("cli", "plot a folder that is not a run", ("plot", "."), 1, ("metrics.jsonl not found",)),
    C("cli", "export-hf without --out", ("export-hf", SPEC_S, "run"), 2, ("needs --out",), RUN),
    C("cli", "export-hf --out an existing file", ("export-hf", SPEC_S, "run", "--out", "f"), 1,
      ("f",), (*RUN, write("f", "mine")), untouched=("f", "run")),
    C("cli", "export-lora of a run without LoRA", ("export-lora", SPEC_S, "run", "--out", "o"),
      1, ("lora",), RUN, untouched=("run",), absent=("o",)),
    C("cli", "train.py --model that is not", ("--out", "run", "--model", "nosuch"), 2,
      ("invalid choice",), run=T, absent=("run",)),
    *(
        C("cli", f"train.py {flag} {value}", ("--out", "run", flag, value), 1, (flag,),
          run=T, absent=("run",))
        for flag, value in (("--microbatches", "0"), ("--log-every", "0"), ("--seed", "-1"),
                            ("--seed", "2147483648"), ("--steps", "3000000000"),
                            ("--steps-per-call", "0"), ("--eval-every", "-1"))
    ),
    C("cli", "train.py --profile garbage", ("--out", "run", "--profile", "x"), (1, 2),
      ("--profile",), run=T, absent=("run",)),
    # ---------------------------------------------------------------- data (the trainer)
    C("data", "a FIFO as data", ("--out", "run", "--data", "p.txt"), 1,
      ("not a regular file",), (fifo("p.txt"),), run=T, absent=("run",), issue=True),
    C("data", "an EIO file in a text directory", ("--out", "run", "--data", "t"), 1,
      ("Input/output error",), (write("t/a.txt", TEXT), symlink("t/b.txt", "/proc/self/mem")),
      run=T, absent=("run",), issue=True),
    C("data", "a BPE run says it trains its tokenizer", ("--out", "run", "--data", "s.txt"), 1,
      ("training a byte-level BPE of 2,048 tokens", "too few"), (write("s.txt", TEXT[:300]),),
      run=T, trainer="generated.tiny_llama_bpe.cpu.train", issue=True),
    C("data", "an empty file", ("--out", "run", "--data", "e.txt"), 1, ("is empty",),
      (write("e.txt", ""),), run=T, absent=("run",)),
    C("data", "binary bytes as text", ("--out", "run", "--data", "b.txt"), 1, ("is binary",),
      (write("b.txt", bytes(range(256)) * 64),), run=T, absent=("run",)),
    C("data", "a token file of odd bytes", ("--out", "run", "--data", "t.bin"), 1,
      ("not a whole number",), (write("t.bin", b"\x01\x00" * 500 + b"\x01"),), run=T,
      absent=("run",)),
    C("data", "token ids past the vocab", ("--out", "run", "--data", "t.bin"), 1,
      ("token ids are >= the model's vocab 256",), (write("t.bin", b"\x00\x01" * 2000),),
      run=T, absent=("run",)),
    C("data", "too little data for one sequence", ("--out", "run", "--data", "s.txt"), 1,
      ("too few",), (write("s.txt", "tiny"),), run=T, absent=("run",)),
    C("data", "a directory with no files", ("--out", "run", "--data", "t"), 1, ("t",),
      (mkdir("t/sub"),), run=T, absent=("run",)),
    C("data", "a path that is not there", ("--out", "run", "--data", "nope.txt"), 1,
      ("does not exist",), run=T, absent=("run",)),
    C("data", "/dev/zero as data", ("--out", "run", "--data", "/dev/zero"), 1,
      ("not a regular file",), run=T, absent=("run",)),
    C("data", "a directory holding only a FIFO", ("--out", "run", "--data", "t"), 1, ("t",),
      (fifo("t/p.txt"),), run=T, absent=("run",)),
    C("data", "a symlink loop in a text directory", ("--out", "run", "--data", "t"), 1,
      ("too few",), (write("t/a.txt", "short"), symlink("t/loop", ".")), run=T,
      absent=("run",)),
    C("data", "check leaves an unreadable data file to the trainer", ("check", "m.axl"), 0,
      ("m.axl: ok (m)",), (spec("", 'train { data = text("t") }\n'), write("t/a.txt", TEXT),
                           symlink("t/b.txt", "/proc/self/mem"))),
    # issue 51: a chat template is an untrusted program; check compiles it and renders the
    # first conversation, sample --chat renders it: its failures are located errors
    *(
        C("data", f"check a chat template {template}", ("check", "m.axl"), 1,
          ("m.axl:", "conversations.jsonl, line 1: the chat template of", said),
          (chat_data(template),))
        for template, said in HOSTILE_TEMPLATES
    ),
    C("data", "check a chat template with a syntax error", ("check", "m.axl"), 1,
      ("m.axl:", "does not compile: line 2 of the template: syntax error"),
      (chat_data("{% for m in messages %}\n{% if %}{% endfor %}"),)),
    *(
        C("data", f"sample --chat with a chat template {template}",
          ("sample", "run", "--chat", "Hi"), 1, ("the chat template of", said),
          (*RUN, chat_run(template)), untouched=("run",))
        for template, said in HOSTILE_TEMPLATES[:1] + HOSTILE_TEMPLATES[-1:]
    ),
    # ---------------------------------------------------------------- run directories
    C("rundir", "--out is a file", ("--out", "f"), 1, ("is a file, not a run directory",),
      (write("f", "mine"),), run=T, untouched=("f",), issue=True),
    C("rundir", "checkpoints is a file", ("--out", "r"), 1, ("checkpoints is a file",),
      (write("r/checkpoints", "mine"),), run=T, untouched=("r",), issue=True),
    C("rundir", "metrics.jsonl is a directory", ("--out", "r"), 1,
      ("metrics.jsonl is a directory",), (mkdir("r/metrics.jsonl"),), run=T, untouched=("r",),
      issue=True),
    C("rundir", "a run.json axdsl did not write", ("--out", "r"), 1, ("not written by axdsl",),
      (write("r/run.json", '{"mine": 1}'),), run=T, untouched=("r",), issue=True),
    C("rundir", "a read-only place (sysfs)", ("--out", "/sys/axdsl-probe"), 1,
      ("/sys is not writable",), run=T, issue=True),
    C("rundir", "run.json is a directory", ("--out", "r"), 1, ("run.json is a directory",),
      (mkdir("r/run.json"),), run=T, untouched=("r",)),
    C("rundir", "lock is a directory", ("--out", "r"), 1, ("lock is a directory",),
      (mkdir("r/lock"),), run=T, untouched=("r",)),
    C("rundir", "run.json is not JSON", ("--out", "r"), 1, ("not written by axdsl",),
      (write("r/run.json", "\x00garbage"),), run=T, untouched=("r",)),
    C("rundir", "--out under a file", ("--out", "f/run"), 1, ("f",), (write("f", "mine"),),
      run=T, untouched=("f",)),
    C("rundir", "--out a dangling symlink", ("--out", "l"), 1, ("l",),
      (symlink("l", "nowhere/x"),), run=T, absent=("nowhere",)),
    C("rundir", "the run is held by a live trainer", ("--out", "run", *RUN_FLAGS), 1,
      ("is in use by pid",), (*RUN, live_lock), run=T, untouched=("run",)),
    C("rundir", "plot a run whose metrics are binary", ("plot", "run"), 1, ("no losses",),
      (*RUN, write("run/metrics.jsonl", bytes(range(256)) * 4)), absent=("run/loss.png",)),
    C("rundir", "sample a folder whose run.json is not a run's", ("sample", "r"), 1,
      ("not written by axdsl train",),
      (write("r/run.json", '{"mine": 1}'),), untouched=("r",)),
    C("rundir", "sample a folder whose run.json is a list", ("sample", "r"), 1,
      ("not written by axdsl train",), (write("r/run.json", "[]"),), untouched=("r",)),
    C("rundir", "sample a run whose generated code is gone", ("sample", "run"), 1,
      ("which is not there",), (*RUN, edit_json("run/run.json", lambda i: _with(
          i, root=str(Path(tempfile.gettempdir()) / "axdsl-probe-nowhere"))))),
    C("rundir", "sample a run with no checkpoints left", ("sample", "run"), 1, ("checkpoint",),
      (*RUN, remove("run/checkpoints"))),
    C("rundir", "export-hf of a run whose checkpoints are empty",
      ("export-hf", SPEC_S, "run", "--out", "o"), 1, ("checkpoint",),
      (*RUN, remove("run/checkpoints/*")),
      absent=("o",)),
    C("rundir", "metrics.jsonl is /dev/zero", ("--out", "run", *RUN_FLAGS), 1,
      ("metrics.jsonl is a device or a FIFO",),
      (*RUN, remove("run/metrics.jsonl"), symlink("run/metrics.jsonl", "/dev/zero")), run=T),
    C("rundir", "a user's file in checkpoints/5 is kept, not deleted",
      ("--out", "r", *RUN_FLAGS[:2], "--steps", "1", *RUN_FLAGS[4:]), 0, ("done: 1 steps",),
      (lab_copy("d.txt"), write("r/checkpoints/5/weights.bin", "mine")), run=T,
      exists=("r/checkpoints/5.damaged/weights.bin", "r/checkpoints/1"), issue=True,
      elsewhere="tests/test_resume.py::test_partial_checkpoint_is_never_restored"),
    # ---------------------------------------------------------------- resume mismatches
    C("resume", "the spec changed (its generated model.py)", ("--out", "run", *RUN_FLAGS), 1,
      ("its generated model.py differs",),
      (*RUN, edit_json("run/run.json", lambda i: _with(i, identity=_with(
          i["identity"], code=_with(i["identity"]["code"], **{"model.py": "0" * 64}))))),
      run=T, untouched=("run",), issue=True),
    C("resume", "the target changed", ("--out", "run", *RUN_FLAGS), 1,
      ("its target is tpu-v5e, this one is cpu",),
      (*RUN, edit_json("run/run.json", lambda i: _with(i, target="tpu-v5e"))), run=T,
      untouched=("run",), issue=True),
    C("resume", "--data changed", ("--out", "run", *RUN_FLAGS, "--data", "e.txt"), 1,
      ("the data of data_path differs",), (*RUN, write("e.txt", TEXT.upper())), run=T,
      untouched=("run",), issue=True),
    C("resume", "--init-from changed", ("--out", "run", *RUN_FLAGS, "--init-from", "run"), 1,
      ("init_from was '', now 'run'",), RUN, run=T, untouched=("run",), issue=True),
    C("resume", "--seed changed", ("--out", "run", *RUN_FLAGS, "--seed", "7"), 1,
      ("seed was 0, now 7",), RUN, run=T, untouched=("run",)),
    C("resume", "--batch changed", ("--out", "run", *RUN_FLAGS, "--batch", "16"), 1,
      ("batch was 8, now 16",), RUN, run=T, untouched=("run",)),
    C("resume", "--seq changed", ("--out", "run", *RUN_FLAGS, "--seq", "32"), 1,
      ("seq was 16, now 32",), RUN, run=T, untouched=("run",)),
    C("resume", "--lr changed", ("--out", "run", *RUN_FLAGS, "--lr", "1e-3"), 1,
      ("lr was 0.0003, now 0.001",), RUN, run=T, untouched=("run",)),
    C("resume", "the data was appended to", ("--out", "run", *RUN_FLAGS), 1,
      ("the data of data_path differs",), (*RUN, write("d.txt", TEXT + "more")), run=T,
      untouched=("run",)),
    C("resume", "the same data moved", ("--out", "run", *RUN_FLAGS, "--data", "moved.txt"), 0,
      (), (lab_copy("run"), lab_copy("d.txt", "moved.txt")), run=T, untouched=("run/checkpoints",)),
    C("resume", "--force-resume records the change",
      ("--out", "run", *RUN_FLAGS, "--lr", "1e-3", "--force-resume"), 0,
      ("--force-resume: lr was 0.0003, now 0.001",), RUN, run=T,
      exists=("run/checkpoints/2",)),
    C("resume", "a run.json from before identities", ("--out", "run", *RUN_FLAGS), 0,
      ("predates run identities",),
      (*RUN, edit_json("run/run.json", lambda i: {k: v for k, v in i.items() if k != "identity"})),
      run=T),
    C("resume", "--steps below the steps taken", ("--out", "run", *RUN_FLAGS, "--steps", "1"),
      1, ("cannot take steps back",), RUN, run=T, untouched=("run",)),
    # ---------------------------------------------------------------- Hugging Face configs
    C("hf", "the lab's own export imports", ("import-hf", SPEC_S, "hf", "--out", "p"), 0, (),
      (lab_copy("hf"),), exists=("p",)),
    C("hf", "a T5 config for a DecoderLM", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("T5",), (lab_copy("hf"), edit_json("hf/config.json", lambda c: _with(
          c, model_type="t5", architectures=["T5ForConditionalGeneration"]))),
      absent=("p",), issue=True),
    C("hf", "no config.json", ("import-hf", SPEC_S, "hf", "--out", "p"), 1, ("not found",),
      (lab_copy("hf"), remove("hf/config.json")), absent=("p",)),
    C("hf", "config.json not JSON", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("cannot read",), (lab_copy("hf"), write("hf/config.json", "{not json")), absent=("p",)),
    C("hf", "config.json a JSON list", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("is not a JSON object",), (lab_copy("hf"), write("hf/config.json", "[1, 2]")),
      absent=("p",)),
    C("hf", "an unknown architecture", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("unsupported model_type",), (lab_copy("hf"), edit_json("hf/config.json", lambda c: _with(
          c, model_type="foo", architectures=["FooForCausalLM"]))), absent=("p",)),
    C("hf", "hidden_size missing", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("hidden_size",), (lab_copy("hf"), edit_json("hf/config.json", lambda c: {
          k: v for k, v in c.items() if k != "hidden_size"})), absent=("p",)),
    C("hf", "hidden_size a string", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ('hidden_size is "64", not a number',), (lab_copy("hf"), edit_json(
          "hf/config.json", lambda c: _with(c, hidden_size="64"))), absent=("p",)),
    C("hf", "num_hidden_layers differs", ("import-hf", SPEC_S, "hf", "--out", "p"), 1,
      ("num_hidden_layers",), (lab_copy("hf"), edit_json("hf/config.json", lambda c: _with(
          c, num_hidden_layers=3))), absent=("p",)),
    C("hf", "rope_theta NaN", ("import-hf", SPEC_S, "hf", "--out", "p"), 1, ("holds NaN",),
      (lab_copy("hf"), edit_json("hf/config.json", lambda c: _with(c, rope_theta=float("nan")))),
      absent=("p",)),
    C("hf", "the HF directory is a file", ("import-hf", SPEC_S, "f", "--out", "p"), 1, ("f",),
      (write("f", "mine"),), absent=("p",)),
    C("hf", "no safetensors", ("import-hf", SPEC_S, "hf", "--out", "p"), 1, ("safetensors",),
      (lab_copy("hf"), remove("hf/*.safetensors")),
      absent=("p",)),
    C("hf", "import-hf --out a file", ("import-hf", SPEC_S, "hf", "--out", "f"), 1, ("f",),
      (lab_copy("hf"), write("f", "mine")), untouched=("f",)),
    # ---------------------------------------------------------------- signals (real processes)
    C("signal", "SIGHUP to the trainer mid-run saves",
      ("-m", TRAINER, "--out", "run", *PROCESS_FLAGS[:2], "--steps", "500",
       *PROCESS_FLAGS[4:6], "--checkpoint-every", "0", *PROCESS_FLAGS[8:]), 129,
      ("SIGHUP at step", "saved checkpoint"), (lab_copy("d.txt"),), run="process",
      send=(signal.SIGHUP, "compiled in"), exists=("run/checkpoints",), issue=True,
      elsewhere="tests/test_preemption.py: SIGTERM mid-run end to end, and SIGHUP as SIGTERM"),
    C("signal", "SIGHUP to axdsl train before training",
      ("-m", "axdsl", "train", "m.axl", "--out", "run", "--data", "d.txt"), 129, (),
      (write("m.axl", MODEL + "train { steps = 5 }\n"), lab_copy("d.txt")), run="process",
      send=(signal.SIGHUP, "running"), absent=("run/checkpoints",)),
    # ---------------------------------------------------------------- disk
    C("disk", "plot --out /dev/full", ("plot", "run", "--out", "/dev/full"), 1,
      ("No space left on device",), RUN),
    C("disk", "build --out /dev/full", ("build", "m.axl", "--out", "/dev/full"), 1,
      ("/dev/full",), (write("m.axl", MODEL),)),
    C("disk", "a disk too small for one checkpoint",
      ("-m", TRAINER, "--out", "disk/run", *PROCESS_FLAGS), 1,
      ("a checkpoint takes",), (lab_copy("d.txt"),), run="tmpfs", tmpfs_kib=256,
      absent=("disk/run/checkpoints",)),
    C("disk", "the disk fills up mid-run",
      ("-m", TRAINER, "--out", "disk/run", *PROCESS_FLAGS), 1,
      ("No space left on device", "checkpoint 1 and those before it"),
      (lab_copy("d.txt"),), run="tmpfs", tmpfs_kib=2048, issue=True),
    C("disk", "fmt on a full disk leaves the spec whole", ("-c", FMT_ON_FULL_DISK), 1,
      ("No space left on device", "the spec is whole"), (write("m.axl", UNFORMATTED),),
      run="tmpfs", tmpfs_kib=64),
    # ---------------------------------------------------------------- writes (issue 51, item 2)
    # A link planted where a command writes: the command writes nothing through it
    C("write", "eval: RUN/evals/t.json.partial a link to a user's file",
      ("eval", "run", "--task", "t.txt"), 0, ("wrote",),
      (*RUN, write("t.txt", "some text to score\n"), write("mine.txt", "mine"),
       symlink("run/evals/t.json.partial", "../../mine.txt")),
      untouched=("mine.txt",), exists=("run/evals/t.json",)),
    C("write", "eval: RUN/evals/t.json a dangling link", ("eval", "run", "--task", "t.txt"), 0,
      ("wrote",), (*RUN, write("t.txt", "some text to score\n"),
                   symlink("run/evals/t.json", "../../outside.json")),
      absent=("outside.json",)),
    C("write", "fmt of a spec that is a link", ("fmt", "m.axl"), 1, ("m.axl", "symlink"),
      (write("real.axl", UNFORMATTED), symlink("m.axl", "real.axl")),
      untouched=("real.axl", "m.axl")),
    C("write", "build: a dangling link as g/__init__.py", ("build", "m.axl", "--out", "g"), 0,
      ("built",), (write("m.axl", MODEL), symlink("g/__init__.py", "../outside.py")),
      absent=("outside.py",), exists=("g/runtime.py",)),
    C("write", "build: g/runtime.py a link to a user's file",
      ("build", "m.axl", "--out", "g"), 1, ("g/runtime.py exists and was not written by axdsl",),
      (write("m.axl", MODEL), write("mine.py", "mine"), symlink("g/runtime.py", "../mine.py")),
      untouched=("mine.py", "g/runtime.py")),
    C("write", "export-hf: OUT/config.json a dangling link",
      ("export-hf", SPEC_S, "run", "--out", "o"), 0, ("wrote",),
      (*RUN, symlink("o/config.json", "../outside.json")), absent=("outside.json",)),
    C("write", "train: RUN/metrics.jsonl a link to a user's file",
      ("--out", "run", *RUN_FLAGS, "--steps", "3"), 1, ("metrics.jsonl is a symlink",),
      (*RUN, write("mine.jsonl", "mine\n"), remove("run/metrics.jsonl"),
       symlink("run/metrics.jsonl", "../mine.jsonl")), untouched=("mine.jsonl",), run=T),
]  # fmt: skip


# ------------------------------------------------------------------------------ running


@dataclass
class Got:
    rc: int
    out: str
    err: str
    skipped: str = ""  # why the probe could not run here
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """stdout (strict) and stderr (backslashreplace) as Python opens them under a UTF-8 locale;
    the list yielded holds what was written to each once the block ends."""
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="backslashreplace")
    saved, written = (sys.stdout, sys.stderr), list[str]()
    sys.stdout, sys.stderr = out, err
    try:
        yield written
    finally:
        sys.stdout, sys.stderr = saved
        out.flush()
        err.flush()
        written += [out_bytes.getvalue().decode(), err_bytes.getvalue().decode()]


def _in_process(call: Callable[[], int | None]) -> Got:
    """Run `call` as a process's main would: its return or SystemExit code; an exception is
    what a process would print (a traceback) and exit 1 with."""
    signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with _captured() as written:
        try:
            rc = call() or 0
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the probe is looking for
            traceback.print_exc()
            rc = 1
        finally:
            for signum, handler in signals.items():  # a trainer that exits early leaves its own
                signal.signal(signum, handler)
    return Got(rc, written[0], written[1])


def run_axdsl(argv: list[str]) -> Got:
    from axdsl import cli

    return _in_process(lambda: cli.main(argv))


def run_trainer(argv: list[str], module: str = TRAINER) -> Got:
    """The trainer's main in this process: with no compile cache (its default, RUN/compile_cache,
    would stay jax's setting for everything else this process compiles), lock released after."""
    import importlib

    import jax

    train = importlib.import_module(module)
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path("runs")
    held = os.path.lexists(out / "lock")
    argv = argv if "--compile-cache" in argv else [*argv, "--compile-cache", "none"]
    cache = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    try:
        got = _in_process(lambda: train.main(argv))
    finally:
        jax.config.update("jax_compilation_cache_dir", cache)
    lock = out / "lock"
    if not held and lock.is_file() and f'"pid": {os.getpid()},' in lock.read_text():
        lock.unlink()  # a trainer's lock is released when its process exits: this one goes on
    return got


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}


def run_process(argv: list[str], send: tuple[int, str] | None, timeout: float = 240) -> Got:
    """A real process; with `send`, the signal goes once a stderr line holds its words."""
    proc = subprocess.Popen(
        argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        errors="backslashreplace",
    )  # fmt: skip
    err: list[str] = []
    if send is not None:
        assert proc.stderr is not None
        deadline = time.monotonic() + timeout
        for line in proc.stderr:
            err.append(line)
            if send[1] in line:
                time.sleep(0.3)  # a few calls in: the trainer is in its loop
                proc.send_signal(send[0])
                break
            if time.monotonic() > deadline:
                break
    try:
        out, rest = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, rest = proc.communicate()
        rest += f"\nprobe: killed after {timeout} s (a hang)"
    code = proc.returncode
    return Got(128 - code if code < 0 else code, out, "".join(err) + rest)


def tmpfs_reason() -> str | None:
    """Why a tmpfs cannot be mounted here (None when it can): `unshare -rm` needs user
    namespaces, which some kernels and containers turn off."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run(
                ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {folder}"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unshare -rm failed: {exc}"
    if done.returncode:
        return f"no user namespace with a tmpfs here: {done.stderr.strip()[:200]}"
    return None


def run_tmpfs(argv: list[str], kib: int) -> Got:
    """`python ARGV` with a tmpfs of `kib` KiB mounted at ./disk (a really full disk)."""
    reason = tmpfs_reason()
    if reason:
        return Got(0, "", "", skipped=reason)
    Path("disk").mkdir()
    script = f'mount -t tmpfs -o size={kib}k tmpfs disk && exec "$@"'
    return run_process(["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, *argv], None)


def _snapshot(path: Path) -> object:
    """The bytes of a file, or of every file under a folder (with its names and links)."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_file():
        return path.read_bytes()
    if path.is_dir():
        return {str(p.relative_to(path)): _snapshot(p) for p in sorted(path.iterdir())}
    return None


def run_probe(p: Probe, lab: Lab) -> Got:
    """Run `p` in a fresh folder of the lab; the problems list is empty when it behaved."""
    here = lab.case_dir(p.name)
    with _cwd(here):
        for step in p.make:
            step(here, lab)
        before = {name: _snapshot(here / name) for name in p.untouched}
        argv = [a.replace("{root}", str(ROOT)).replace("{lab}", str(lab.root)) for a in p.argv]
        start = time.perf_counter()
        if p.run == "axdsl":
            got = run_axdsl(argv)
        elif p.run == "trainer":
            got = run_trainer(argv, p.trainer)
        elif p.run == "process":
            got = run_process([sys.executable, *argv], p.send)
        else:
            got = run_tmpfs(argv, p.tmpfs_kib)
        got.seconds = time.perf_counter() - start
        if not got.skipped:
            got.problems = judge(p, got, here, before)
    return got


def judge(p: Probe, got: Got, here: Path, before: dict[str, object]) -> list[str]:
    """What is wrong with `got` for `p` (empty when nothing is)."""
    problems = []
    if got.rc not in _codes(p):
        problems.append(f"exit {got.rc}, expected {p.expected}")
    if got.rc == INTERNAL:
        problems.append("an internal error (exit 70)")
    for stream, text in (("stderr", got.err), ("stdout", got.out)):
        if "Traceback (most recent call last)" in text:
            after = text.split("Traceback (most recent call last)", 1)[1].splitlines()[1:]
            raised = next((line for line in after if line and not line[0].isspace()), "")
            problems.append(f"a traceback on {stream} ({raised[:200]})")
    where = got.err + (got.out if 0 in _codes(p) else "")
    problems += [f"no {words!r} in the output" for words in p.says if words not in where]
    for name, old in before.items():
        if _snapshot(here / name) != old:
            problems.append(f"{name} changed")
    problems += [f"{name} is missing" for name in p.exists if not (here / name).exists()]
    problems += [f"{name} was made" for name in p.absent if os.path.lexists(here / name)]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="run the probes whose id holds these words")
    parser.add_argument("--class", dest="cls", default="", help="run one class of probes")
    parser.add_argument("-v", action="store_true", help="print each failing probe's output")
    args = parser.parse_args()
    chosen = [p for p in PROBES if args.k in p.id and args.cls in ("", p.cls)]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="axdsl-probe-") as folder:
        start = time.perf_counter()
        lab = make_lab(Path(folder))
        print(f"lab ready in {time.perf_counter() - start:.1f} s")
        print(f"{'class':7} {'case':52} {'expected':36} {'got':>5} {'s':>5}  ok")
        for p in chosen:
            got = run_probe(p, lab)
            ok = "skip" if got.skipped else "ok" if not got.problems else "FAIL"
            failed += ok == "FAIL"
            mark = "*" if p.issue else " "
            print(
                f"{p.cls:7} {mark}{p.name[:51]:51} {p.expected[:36]:36} {got.rc:>5} "
                f"{got.seconds:5.1f}  {ok} {'; '.join(got.problems) or got.skipped}",
                flush=True,
            )
            if args.v and got.problems:
                print("    | " + (got.err + got.out)[-1500:].replace("\n", "\n    | "))
    issue = sum(p.issue for p in chosen)
    print(
        f"{len(chosen)} probes ({issue} from issue 38, marked *; {len(chosen) - issue} added), "
        f"{failed} failed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
