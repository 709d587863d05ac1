"""No name, path or string from the user reaches generated code or scripts as code (issue 51).

A spec's file name, an imported file's name and the strings of a train block (data files, task
files, checkpoint folders, init_from) are printed into model.py, train.py, kernels.py and slurm.sh
through codegen/names.py's escapers: `py_str` in Python code, `py_comment` in comments, `py_doc`
in docstrings, `sh` in the shell script. Here each of them is given payloads that would run
`touch PWNED` if they reached code: `$(...)`, backticks, `;`, quotes, newlines, carriage returns,
form feeds, U+2028, NUL (in strings: file names cannot hold it), bytes that are not UTF-8 (file
names decoded with surrogateescape) and names near the file system's 255-byte limit.

The oracle for each case (`injection_failure`): `axdsl build` exits 0 or with an error (never
internal, never a traceback); then every generated .py compiles and the word PWNED is in no token
of it but strings and comments; slurm.sh passes `bash -n`, and run with stand-ins for `srun`
(which records its arguments) it passes the module and run directory as one argument each, with
the payload's text intact; and no PWNED file appears anywhere.

benchmarks/fuzz.py --names runs thousands of these cases.
"""

from __future__ import annotations

import ast
import io
import os
import random
import shutil
import subprocess
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from axdsl.codegen.names import py_comment, py_doc, sh
from test_fuzz_cli import NOT_UTF8, run_main

CANARY = "PWNED"  # the file every payload would create; also the word sought in code tokens
PY = f'__import__("os").system("touch {CANARY}")'
# Pieces of names: each would run `touch PWNED` where it reached Python or shell code as code
PAYLOADS = (
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f";touch {CANARY};",
    f"'; touch {CANARY}; '",
    f'"; touch {CANARY}; "',
    f"\nfrom os import system; system('touch {CANARY}')\n#",
    f"\n{PY}\n#",
    f'"""+{PY}+"""',
    f"'''+{PY}+'''",
    f'")+{PY}+("',
    f"\r{PY}\r#",
    f"\x0c\n{PY}\n",
    f"\u2028{PY}\u2029",
    f"\\N{CANARY}\\",
    f"{{{{ {CANARY} }}}}{{% {CANARY} %}}",
    f"\u202e{CANARY}",
    f"#{CANARY} $HOME ~ * ?",
    f"-{CANARY}",
    NOT_UTF8 + CANARY,
)
PLAIN = ("m", "spec", "my spec", "é", "a.b", "x" * 40)


def _piece(rng: random.Random) -> str:
    return rng.choice(PAYLOADS) if rng.random() < 0.7 else rng.choice(PLAIN)


def _file_stem(rng: random.Random) -> str:
    """A file name's stem (no `/`, no NUL: the file system refuses them); sometimes very long."""
    stem = "".join(_piece(rng) for _ in range(rng.randint(1, 3))).replace("/", "_")
    if rng.random() < 0.1:
        stem = (stem + "y" * 300)[: 250 - len(".axl")]
    while len(os.fsencode(stem + ".axl")) > 255:
        stem = stem[:-1]
    return stem


def spec_string(value: str) -> str:
    """`value` as a spec string literal ("..."): the parser decodes these escapes."""
    out = []
    for c in value:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable() and c.isascii():
            out.append(c)
        else:
            out.append(c.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return '"' + "".join(out) + '"'


BASE = (
    'import "std/transformer.axl"\n'
    "model base = DecoderLM { vocab = 64  dim = 16  layers = 1  heads = 2  ffn = 32  max_seq = 64 "
    "}\n"
)


@dataclass(frozen=True)
class NamesCase:
    spec: str  # the spec's file name
    imported: str  # the name of the file it imports, which defines the model `base`
    train: tuple[str, ...]  # train block settings, each holding a payload in a string

    def text(self) -> str:
        head = f"import {spec_string(self.imported)}\nmodel m extends base {{ dim = 32 }}\n"
        if not self.train:
            return head
        return head + "train {\n" + "".join(f"  {s}\n" for s in self.train) + "}\n"


def names_case(seed: int) -> NamesCase:
    rng = random.Random(seed)
    spec = _file_stem(rng) + ".axl"
    imported = _file_stem(rng) + ".axl"
    if imported == spec:
        imported = "i" + imported[1:]

    def value() -> str:
        nul = "\x00" if rng.random() < 0.2 else ""  # the file system refuses it: a located error
        return "".join(_piece(rng) for _ in range(rng.randint(1, 2))) + nul

    choices = (
        lambda: f"data = tokens({spec_string(value())})",
        lambda: f"data = text({spec_string(value())})",
        lambda: f"evals = [{spec_string(value() + '.txt')}]",
        lambda: f"checkpoint(dir = {spec_string(value())})",
        lambda: f"init_from = {spec_string(value())}",
    )
    picked = rng.sample(range(len(choices)), rng.randint(0, 3))
    settings = [choices[i]() for i in sorted(picked)]
    if sum(s.startswith("data = ") for s in settings) > 1:  # one data setting
        settings = [s for s in settings if not s.startswith("data = text")]
    return NamesCase(spec, imported, tuple(settings))


def _arg(name: str) -> str:
    return name if not name.startswith("-") else "./" + name


def injection_failure(case: NamesCase, folder: Path) -> str | None:
    """None when the build of `case` in `folder` (emptied first) is safe, else what went wrong."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / case.imported).write_text(BASE, encoding="utf-8")
    (folder / case.spec).write_text(case.text(), encoding="utf-8")
    old = os.getcwd()
    os.chdir(folder)
    try:
        o = run_main(["build", _arg(case.spec), "--out", "gen"])
    finally:
        os.chdir(old)
    if o.rc == 70 or "Traceback" in o.err + o.out or (o.rc and "error" not in o.err):
        return f"crash: exit {o.rc}: {o.err.strip()[-600:]}"
    problem = None
    if o.rc == 0:
        problem = _python_problem(folder) or _shell_problem(folder, case)
    canaries = [str(p) for p in folder.rglob(CANARY)] + [str(p) for p in Path.cwd().glob(CANARY)]
    return problem or (f"a payload ran: {canaries}" if canaries else None)


def _python_problem(folder: Path) -> str | None:
    for path in sorted((folder / "gen").rglob("*.py")):
        source = path.read_bytes()
        try:
            compile(source, str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            return f"{path.name} does not compile: {exc}"
        for tok in tokenize.tokenize(io.BytesIO(source).readline):
            if CANARY in tok.string and tok.type not in _TEXT_TOKENS:
                return f"{path.name}:{tok.start[0]}: user text as code: {tok.line.strip()[:200]!r}"
    return None


_TEXT_TOKENS = {tokenize.STRING, tokenize.COMMENT} | {
    getattr(tokenize, t)
    for t in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
    if hasattr(tokenize, t)
}


def _shell_problem(folder: Path, case: NamesCase) -> str | None:
    """slurm.sh parses, and run with a stand-in `srun` gets the module and run dir intact."""
    scripts = list((folder / "gen").rglob("slurm.sh"))
    if not scripts:
        return None  # no train block objective: no trainer, no script
    script = scripts[0]
    got = subprocess.run(["bash", "-n", str(script)], capture_output=True)
    if got.returncode:
        return f"slurm.sh does not parse: {got.stderr.decode(errors='replace')[:300]}"
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGS_OUT"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGS_OUT": str(folder / "args")}
    got = subprocess.run(
        ["bash", str(script), "--steps", "1"], cwd=folder, env=env, capture_output=True
    )
    if got.returncode:
        return f"slurm.sh failed: {got.stderr.decode(errors='replace')[:300]}"
    args = [os.fsdecode(a) for a in (folder / "args").read_bytes().split(b"\0")[:-1]]
    stem = case.spec[: -len(".axl")]
    want = ["python", "-m", f"gen.{stem}.cpu.train", "--out", f"runs/{stem}-cpu", "--steps", "1"]
    return None if args == want else f"srun got {args!r}, not {want!r}"


# ------------------------------------------------------------------------------ the escapers

NASTY = ["plain/x.axl", "a$(touch X)", "e\nfrom os import x\n#", 'a"""b\\N', "x\u2028y\x0c\r\x00",
         os.fsdecode(b"\xff\xfe.axl"), "\u202eabc", "it's", "a'\nb\\"]  # fmt: skip


@pytest.mark.parametrize("value", NASTY)
def test_escapers_keep_text_out_of_code(value):
    comment = f"x = 1  # {py_comment(value)}\n"
    kinds = [t.type for t in tokenize.generate_tokens(io.StringIO(comment).readline)]
    assert py_comment(value).isprintable() and kinds.count(tokenize.COMMENT) == 1
    assert kinds[-3:] == [tokenize.COMMENT, tokenize.NEWLINE, tokenize.ENDMARKER]
    doc = f'"""{py_doc(value)}"""'
    assert py_doc(value).isprintable() and isinstance(ast.parse(doc).body[0].value, ast.Constant)
    assert sh(value).isprintable()
    if "\x00" not in value:  # no shell argument holds a NUL
        got = subprocess.run(["bash", "-c", f"printf %s {sh(value)}"], capture_output=True).stdout
        assert got == os.fsencode(value)


def test_escapers_leave_plain_names_alone():
    for value in ("specs/tiny_llama.axl", "runs/tiny_llama-cpu", "generated.tiny_llama.cpu"):
        assert py_comment(value) == py_doc(value) == sh(value) == value


# ------------------------------------------------------------------------------ the probe's cases


def test_a_spec_named_with_a_command_substitution(tmp_path):
    """Issue 51: `a$(touch X).axl` built, and slurm.sh ran the command."""
    case = NamesCase(f"a$(touch {CANARY}).axl", "i.axl", ())
    assert injection_failure(case, tmp_path / "c") is None
    script = next((tmp_path / "c" / "gen").rglob("slurm.sh")).read_text()
    assert f"'runs/a$(touch {CANARY})-cpu'" in script


def test_an_imported_file_named_with_a_newline_and_python(tmp_path):
    """Issue 51: an imported file `e<newline>from os import system; ...<newline>#.axl` put live
    code into model.py's docstrings and comments."""
    imported = f'e\nfrom os import system; system("touch {CANARY}")\n#.axl'
    case = NamesCase("m.axl", imported, ())
    assert injection_failure(case, tmp_path / "c") is None


@pytest.mark.parametrize("seed", range(12))
def test_fuzzed_names_stay_text(seed, tmp_path):
    case = names_case(seed)
    assert injection_failure(case, tmp_path / "c") is None, case
