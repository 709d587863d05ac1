"""A Pygments lexer for .axl, registered as the `pygments.lexers` entry point `axl`, so that
`pygmentize -l axl`, Sphinx and MkDocs highlight specs. Its rules are highlight.py's, shared
with the TextMate grammar."""

from __future__ import annotations

from typing import ClassVar

from pygments.lexer import RegexLexer, bygroups
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Text,
    Whitespace,
    _TokenType,
)

from axdsl.editor.highlight import COMMENT, STRING_ESCAPE, Kind, rules

TOKENS: dict[Kind, _TokenType] = {
    Kind.COMMENT: Comment.Single,
    Kind.STRING: String.Double,
    Kind.ESCAPE: String.Escape,
    Kind.NUMBER: Number,
    Kind.DECLARATION: Keyword.Declaration,
    Kind.CONTROL: Keyword,
    Kind.OPERATOR_WORD: Operator.Word,
    Kind.CONSTANT: Keyword.Constant,
    Kind.TYPE: Keyword.Type,
    Kind.DEFINED_NAME: Name.Class,
    Kind.FUNCTION: Name.Builtin,
    Kind.INITIALIZER: Name.Builtin,
    Kind.OPERATOR: Operator,
    Kind.PUNCTUATION: Punctuation,
}


def _pygments_rules() -> list[tuple[str, object]]:
    """highlight.rules() as Pygments (regex, token) pairs; whitespace between captured words is
    Whitespace, not the punctuation kind the TextMate side leaves unscoped."""
    out: list[tuple[str, object]] = []
    for rule in rules():
        if len(rule.kinds) == 1:
            out.append((rule.regex, TOKENS[rule.kinds[0]]))
        else:
            groups = [Whitespace if k == Kind.PUNCTUATION else TOKENS[k] for k in rule.kinds]
            out.append((rule.regex, bygroups(*groups)))
    return out


class AxlLexer(RegexLexer):
    """axdsl model specs (.axl)."""

    name = "axdsl"
    aliases: ClassVar[list[str]] = ["axl", "axdsl"]
    filenames: ClassVar[list[str]] = ["*.axl"]
    mimetypes: ClassVar[list[str]] = ["text/x-axl"]
    url = "https://github.com/axdsl/axdsl"

    tokens: ClassVar[dict[str, list]] = {
        "root": [
            (r"\s+", Whitespace),
            (COMMENT, Comment.Single),
            (r'"', String.Double, "string"),
            *_pygments_rules(),
            (r"[A-Za-z_][A-Za-z0-9_]*", Name),
            (r".", Text),
        ],
        "string": [
            (r'[^"\\\n]+', String.Double),
            (STRING_ESCAPE, String.Escape),
            (r'"', String.Double, "#pop"),
            (r"\n", Text, "#pop"),
        ],
    }
