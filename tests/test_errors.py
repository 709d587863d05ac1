"""Error fixtures: every malformed or ill-typed spec in tests/errors/ fails with its expected message.

Each fixture starts with comment lines that state what the compiler must say:

    # expect: tests/errors/matmul_dims_disagree.axl:7:12: error: matmul dims do not agree
    # expect-hint: did you mean `kv_heads`?

A `# target: NAME` line compiles the fixture for that target instead of cpu.
Every `# expect:` line (location included) and every `# expect-hint:` line must appear in the
rendered `CompileError`. Files under tests/errors/support/ are helpers that fixtures import.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from axdsl.errors import CompileError
from axdsl.pipeline import compile_spec

REPO = Path(__file__).resolve().parent.parent
FIXTURES = sorted((REPO / "tests" / "errors").glob("*.axl"))
CARET_LINE = re.compile(r"^\s*\^+\s*$", re.MULTILINE)
DIAGNOSTIC_LINE = re.compile(r"^\S+:\d+:\d+: error: ", re.MULTILINE)


def _expectations(path: Path) -> tuple[list[str], list[str]]:
    """The `# expect:` and `# expect-hint:` lines at the top of a fixture."""
    expects, hints = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# target:"):
            continue
        if line.startswith("# expect:"):
            expects.append(line.removeprefix("# expect:").strip())
        elif line.startswith("# expect-hint:"):
            hints.append(line.removeprefix("# expect-hint:").strip())
    return expects, hints


def _target(path: Path) -> str:
    """A fixture may name its target in a `# target: gpu-h100-8` line; the default is cpu."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# target:"):
            return line.removeprefix("# target:").strip()
    return "cpu"


def _compile_error(relpath: str) -> CompileError:
    with pytest.raises(CompileError) as info:
        compile_spec(Path(relpath), _target(Path(relpath)))
    return info.value


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    """Messages show paths relative to the working directory: run from the repository root."""
    monkeypatch.chdir(REPO)


def test_there_are_enough_fixtures():
    assert len(FIXTURES) >= 30


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_error_fixture(path: Path):
    expects, hints = _expectations(path)
    assert expects, f"{path.name} has no `# expect:` line"
    relpath = path.relative_to(REPO).as_posix()
    error = _compile_error(relpath)
    text = error.render()
    assert str(error) == text
    for expected in expects:
        assert expected in text, f"missing:\n  {expected}\nin:\n{text}"
    for hint in hints:
        assert f"  hint: {hint}" in text, f"missing hint:\n  {hint}\nin:\n{text}"
    # Every diagnostic shows its source line and a caret line under it.
    assert CARET_LINE.search(text), text
    for diag in error.diagnostics:
        source = error.sources.get(diag.span.file)
        assert source is not None and diag.span.line >= 1, f"no source for {diag.span}"
        assert source.splitlines()[diag.span.line - 1] in text
    assert "Traceback" not in text and 'File "' not in text
    n = len(error.diagnostics)
    assert text.endswith(f"{n} error{'s' if n != 1 else ''} generated.")


MANY_MISTAKES = """\
import "std/transformer.axl"

model tiny = DecoderLM {
  vocab = 256  dim = 64  layers = "two"  heads = 4  kv_head = 2
}

model other = DecoderLN {
  vocab = 256
}
"""


def test_independent_mistakes_are_reported_together(tmp_path, monkeypatch):
    spec = tmp_path / "many.axl"
    spec.write_text(MANY_MISTAKES, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    error = _compile_error("many.axl")
    text = error.render()
    assert len(error.diagnostics) == 3, text
    assert 'many.axl:4:35: error: `layers` of layer at `/` is int, but got string "two"' in text
    assert "many.axl:4:53: error: layer `DecoderLM` has no hyperparameter `kv_head`" in text
    assert "hint: did you mean `kv_heads`?" in text
    assert "many.axl:7:15: error: unknown layer `DecoderLN`" in text
    assert len(DIAGNOSTIC_LINE.findall(text)) == 3
    assert text.endswith("3 errors generated.")


def test_count_line_says_how_many(tmp_path, monkeypatch):
    spec = tmp_path / "two.axl"
    spec.write_text(
        'import "std/transformer.axl"\n'
        "model tiny = DecoderLM {\n"
        '  vocab = 256  dim = 64  layers = 2  heads = 4  positions = "rotary"  tied = 1\n'
        "}\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    text = _compile_error("two.axl").render()
    assert text.splitlines()[-1] == "2 errors generated."
    assert "two.axl:3:61: error: `positions` must be one of" in text
    assert "two.axl:3:78: error: `tied` of layer at `/` is bool, but got int 1" in text


def test_one_error_says_error_not_errors():
    text = _compile_error("tests/errors/matmul_dims_disagree.axl").render()
    assert text.splitlines()[-1] == "1 error generated."


def test_syntax_errors_in_several_files_are_reported_together(tmp_path, monkeypatch):
    (tmp_path / "a.axl").write_text("layer A(dim: int) {\n  param w [dim]\n}\n", encoding="utf-8")
    (tmp_path / "b.axl").write_text("layer B(dim: int) {\n  param v: [dim] $\n}\n", encoding="utf-8")
    (tmp_path / "main.axl").write_text('import "a.axl"\nimport "b.axl"\nmodel m = A { dim = 8 }\n',
                                       encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    text = _compile_error("main.axl").render()
    assert "a.axl:2:11: error: syntax error: unexpected `[`" in text
    assert "b.axl:2:18: error: syntax error: unexpected character `$`" in text
    assert text.endswith("2 errors generated.")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_errors_point_at_the_users_line(path: Path):
    """An error raised inside a standard-library layer is shown at the user's line that caused it
    (their `kv_heads = 3`), with a `note:` for the library line; never at the library line alone."""
    error = _compile_error(path.relative_to(REPO).as_posix())
    for diag in error.diagnostics:
        assert not diag.span.file.startswith("std/"), diag.render(error.sources)
        for note in diag.notes:
            assert note.span.file.startswith("std/") and f"{note.span}: note: " in error.render()
