"""`axdsl fmt`: every .axl file of the repository is in the canonical layout, formatting is
idempotent and lossless (same AST, same generated code), and messy input comes out canonical."""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
from pathlib import Path

import pytest

from axdsl import build
from axdsl.cli import main
from axdsl.editor.fmt import format_source
from axdsl.editor.tokens import normalize, tokens
from axdsl.errors import CompileError, Span
from axdsl.syntax.parser import parse

REPO = Path(__file__).resolve().parent.parent
# What CI checks with `axdsl fmt --check`. tests/errors/ is left as written: its fixtures are
# deliberately odd (unparsable ones among them) and quote their own columns.
FORMATTED_DIRS = ("specs", "axdsl/std", "tests/specs", "tests/errors/support")
AXL_FILES = sorted(p for d in FORMATTED_DIRS for p in (REPO / d).rglob("*.axl"))


def _without_spans(node):
    """An AST with every Span replaced by None, so that two layouts of one file compare equal."""
    if isinstance(node, Span):
        return None
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return tuple(_without_spans(getattr(node, f.name)) for f in dataclasses.fields(node))
    if isinstance(node, tuple | list):
        return tuple(_without_spans(n) for n in node)
    return node


def _messy(text: str, path: str, seed: int) -> str:
    """The same tokens on the same lines, with random indentation (tabs and spaces), random
    spacing between tokens, trailing blanks, blank-line runs and CRLF line ends."""
    rng = random.Random(seed)
    lines: dict[int, list[str]] = {}
    for tok in tokens(normalize(text), path):
        lines.setdefault(tok.line, []).append(tok.text)
    out = []
    for number in range(1, max(lines) + 1):
        words = lines.get(number)
        if words is None:
            out.extend([" \t"] * rng.randint(1, 3))
            continue
        gaps = [rng.choice([" ", "  ", "\t", " \t "]) for _ in words]
        body = "".join(g + w for g, w in zip(gaps, words, strict=True))
        out.append(rng.choice(["", "\t", "      "]) + body + rng.choice(["", "  ", "\t"]))
    return "\r\n".join(out) + "\r\n\r\n"


def test_every_repository_file_is_found():
    assert len(AXL_FILES) >= 30


@pytest.mark.parametrize("path", AXL_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_repository_file_is_formatted_and_survives_mess(path: Path):
    """Each file is canonical; a messy copy of it formats back to the same text and AST."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(REPO).as_posix()
    assert format_source(text, name) == text, f"run `axdsl fmt {name}`"
    messy = _messy(text, name, seed=len(text))
    assert messy != text
    assert format_source(messy, name) == text
    assert _without_spans(parse(normalize(messy), name)) == _without_spans(parse(text, name))


def test_error_fixtures_format_without_changing_meaning():
    """tests/errors/ stays as written (its fixtures quote their own columns), but every fixture
    that parses formats idempotently to the same AST, and one that does not parses is refused
    with the parser's own error."""
    formatted = refused = 0
    for path in sorted((REPO / "tests" / "errors").glob("*.axl")):
        text, name = path.read_text(encoding="utf-8"), path.name
        try:
            before = _without_spans(parse(normalize(text), name))
        except CompileError as exc:
            with pytest.raises(CompileError) as again:
                format_source(text, name)
            assert again.value.render() == exc.render()
            refused += 1
            continue
        out = format_source(text, name)
        assert format_source(out, name) == out, name
        assert _without_spans(parse(out, name)) == before, name
        formatted += 1
    assert formatted > 100 and refused >= 3


_POSITIONS = re.compile(r"spec sha256: \w+|\.axl:\d+(:\d+)?|\"sha256\": \{[^}]*\}")


@pytest.mark.parametrize("spec", ["tiny_llama", "gemma3_1b"])
def test_formatted_spec_builds_the_same_code(spec: str, tmp_path: Path, monkeypatch):
    """A messy copy of a spec and its formatted text build the same code, but for the spec's hash
    and the `set at file:line:col` positions that moved."""
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    path = Path("specs") / f"{spec}.axl"
    text = path.read_text(encoding="utf-8")
    messy = _messy(text, path.as_posix(), seed=1)
    path.write_text(messy, encoding="utf-8", newline="")
    before = build.build_files(path, "cpu")
    path.write_text(format_source(messy, path.as_posix()), encoding="utf-8")
    after = build.build_files(path, "cpu")
    assert before.keys() == after.keys()
    for name in before:
        assert _POSITIONS.sub("", before[name]) == _POSITIONS.sub("", after[name]), name


MESSY = (
    "\n\n# a model\t\r\n"
    'import   "std/transformer.axl"   # the library  \r\n'
    "\r\n\r\n\r\n"
    "layer  Scale ( dim : int ,eps:float( >0 ) = 1e-5,\r\n"
    '\t\t  mode: enum( "a","b" ) = "a" ){\r\n'
    "param w :[ dim ]axes( embed )init ones\r\n"
    "\r\n"
    "  forward( x:[B,S,dim] )->[ B , S , dim ]{\r\n"
    "  # a comment at an odd place\r\n"
    '    if mode=="a"{ x = x*w } else{x=- x}\r\n'
    "        y = x\r\n"
    "+ 1.0\r\n"
    "      return y   }\r\n"
    "}\r\n"
    "model m=Scale{dim=8   # eight\r\n"
    "eps = 1e-6 }\r\n"
    'train{ steps=10 data("d",  split = "x")}\r\n\r\n\r\n'
)
CANONICAL = (
    "# a model\n"
    'import "std/transformer.axl"  # the library\n'
    "\n"
    "layer Scale(dim: int, eps: float(> 0) = 1e-5,\n"
    '            mode: enum("a", "b") = "a") {\n'
    "  param w: [dim] axes(embed) init ones\n"
    "\n"
    "  forward(x: [B, S, dim]) -> [B, S, dim] {\n"
    "    # a comment at an odd place\n"
    '    if mode == "a" { x = x * w } else { x = -x }\n'
    "    y = x\n"
    "        + 1.0\n"
    "    return y }\n"
    "}\n"
    "model m = Scale { dim = 8  # eight\n"
    "  eps = 1e-6 }\n"
    'train { steps = 10  data("d", split = "x") }\n'
)


def test_messy_input_becomes_canonical():
    assert format_source(MESSY, "messy.axl") == CANONICAL
    assert format_source(CANONICAL, "messy.axl") == CANONICAL


@pytest.mark.parametrize(
    "text, expected",
    [
        ("layer L(a: int(>= -1, < 2)) {\n}\n", "layer L(a: int(>= -1, < 2)) {\n}\n"),
        ("model m = X {\n  a = [\n1, 2\n]\n}\n", "model m = X {\n  a = [\n      1, 2\n  ]\n}\n"),
        ("model m = X {}\n", "model m = X {}\n"),
        ("model m = X {\n\n  a = 1\n\n}\n", "model m = X {\n  a = 1\n}\n"),
        ("model m = X { a = f(b).c  d = not (e)  g = h @ i }", None),
        ("", ""),
        ("# only a comment   ", "# only a comment\n"),
    ],
)
def test_layout_rules(text: str, expected: str | None):
    out = format_source(text, "t.axl")
    assert out == (expected if expected is not None else text.rstrip() + "\n")
    assert format_source(out, "t.axl") == out


def test_unparsable_file_is_a_located_error(tmp_path: Path, capsys):
    bad = tmp_path / "bad.axl"
    bad.write_text("model m = X {\n  a = (1 +\n}\n", encoding="utf-8")
    with pytest.raises(CompileError):
        format_source(bad.read_text(encoding="utf-8"), "bad.axl")
    assert main(["fmt", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad.as_posix()}:3:1: error: syntax error: unexpected `}}`" in err
    assert "\n  ^\n" in err and "Traceback" not in err
    assert bad.read_text(encoding="utf-8") == "model m = X {\n  a = (1 +\n}\n"


def test_check_diff_and_rewrite(tmp_path: Path, capsys):
    """--check exits 1 with a diff and writes nothing; plain fmt rewrites; then --check passes."""
    spec = tmp_path / "m.axl"
    spec.write_text("model m=X{a=1}\r\n", encoding="utf-8", newline="")
    assert main(["fmt", "--check", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "-model m=X{a=1}" in out.out and "+model m = X { a = 1 }" in out.out
    assert "would reformat" in out.err
    assert main(["fmt", "--diff", str(spec)]) == 0
    assert spec.read_bytes() == b"model m=X{a=1}\r\n"
    assert main(["fmt", str(spec)]) == 0
    assert spec.read_bytes() == b"model m = X { a = 1 }\n"
    assert main(["fmt", "--check", str(spec)]) == 0
