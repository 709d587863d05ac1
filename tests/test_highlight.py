"""Highlighting: the Pygments lexer and the committed TextMate grammar know every keyword of
grammar/axdsl.lark and every primitive, and the TextMate grammar is what its generator writes."""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("pygments")
from pygments.token import Error, Keyword, Name, Operator  # noqa: E402

from axdsl import primitives  # noqa: E402
from axdsl.editor import highlight  # noqa: E402
from axdsl.editor.pygments_lexer import AxlLexer  # noqa: E402
from axdsl.editor.vocabulary import vocabulary  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GRAMMAR_TEXT = (REPO / "grammar" / "axdsl.lark").read_text(encoding="utf-8")
# Read straight from the grammar's text, independently of vocabulary.py: every quoted word.
GRAMMAR_KEYWORDS = sorted(set(re.findall(r'"([a-z]+)"', GRAMMAR_TEXT)))
PRIMITIVES = primitives.callable_names()
TEXTMATE = json.loads(highlight.TEXTMATE_PATH.read_text(encoding="utf-8"))


def _pygments(text: str) -> list[tuple[object, str]]:
    return [(t, v) for t, v in AxlLexer().get_tokens(text) if v.strip()]


def _textmate_scope(text: str) -> str | None:
    """The scope the committed TextMate grammar gives the first word of `text` (its rules are
    written to mean the same in Python's re as in Oniguruma)."""
    for pattern in TEXTMATE["patterns"]:
        if "match" not in pattern:
            continue
        m = re.match(pattern["match"], text)
        if m is None:
            continue
        if "name" in pattern:
            return pattern["name"]
        for group, capture in pattern["captures"].items():
            if m.start(int(group)) == 0:
                return capture["name"]
    return None


def test_the_grammar_has_the_keywords_vocabulary_reads():
    assert len(GRAMMAR_KEYWORDS) >= 15
    assert sorted(vocabulary().keywords) == GRAMMAR_KEYWORDS


@pytest.mark.parametrize("word", GRAMMAR_KEYWORDS)
def test_every_keyword_is_highlighted(word: str):
    ((token, value),) = _pygments(word)
    assert value == word and (token in Keyword or token in Operator.Word), token
    scope = _textmate_scope(word)
    assert scope is not None and scope.startswith(("keyword.", "constant.language")), scope


def test_every_primitive_is_highlighted():
    assert len(PRIMITIVES) >= 40
    for prim in PRIMITIVES:
        token, value = _pygments(f"{prim}(x)")[0]
        assert (token, value) == (Name.Builtin, prim)
        assert _textmate_scope(f"{prim}(x)") == highlight.Kind.FUNCTION.value, prim
        # not as a plain name: `child embed = ...` names a child
        assert _pygments(f"{prim} = 1")[0][0] is not Name.Builtin


def test_definitions_and_initializers():
    toks = _pygments("layer Scale(dim: int) { param w: [dim] init zeros }")
    assert (Name.Class, "Scale") in toks and (Name.Builtin, "zeros") in toks
    assert (Keyword.Type, "int") in toks
    assert _textmate_scope("init normal(0.02)") == highlight.Kind.DECLARATION.value


def test_no_repository_file_lexes_to_an_error():
    for path in sorted([*REPO.glob("specs/*.axl"), *REPO.glob("axdsl/std/*.axl")]):
        text = path.read_text(encoding="utf-8")
        tokens = list(AxlLexer().get_tokens(text))
        assert not [v for t, v in tokens if t is Error], path
        assert "".join(v for _, v in tokens) == text


def test_committed_textmate_grammar_is_fresh():
    assert (
        highlight.TEXTMATE_PATH.read_text(encoding="utf-8") == highlight.textmate_text()
    ), "run `python -m axdsl.editor.highlight`"
    assert highlight.main(["--check"]) == 0


def test_vscode_extension_uses_the_grammar_and_the_server():
    folder = REPO / "editors" / "vscode"
    package = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    (grammar,) = package["contributes"]["grammars"]
    assert (folder / grammar["path"]).resolve() == highlight.TEXTMATE_PATH.resolve()
    assert grammar["scopeName"] == TEXTMATE["scopeName"]
    assert package["contributes"]["languages"][0]["extensions"] == [".axl"]
    assert "vscode-languageclient" in package["dependencies"]
    assert '"lsp"' in (folder / "package.json").read_text(encoding="utf-8")
    json.loads((folder / "language-configuration.json").read_text(encoding="utf-8"))


def test_pygments_entry_point_names_the_lexer():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    target = project["entry-points"]["pygments.lexers"]["axl"]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is AxlLexer
    assert "axl" in AxlLexer.aliases and "*.axl" in AxlLexer.filenames
