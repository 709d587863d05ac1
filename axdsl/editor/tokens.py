"""A lossless token stream of one .axl file: every token of the grammar, the comments that the
grammar ignores, and what the parse tree says about each token's role.

The formatter and the highlighters both read this. It is built on the project's own grammar
(grammar/axdsl.lark) with lark's LALR parser, so it agrees with `axdsl check` about what a file
means; a file that does not parse raises the same located CompileError as the parser does.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import lark
from lark import Token

from axdsl import resources
from axdsl.errors import InternalError
from axdsl.syntax.parser import parse

# Parse-tree rules whose first token starts a statement, a setting, a member or a top-level
# item: written on one line, such starts are separated by two spaces (`dim = 64  heads = 4`).
STATEMENT_RULES = frozenset(
    {
        "import_stmt",
        "layer_def",
        "model_new",
        "model_extends",
        "train_def",
        "target_def",
        "param_def",
        "child_def",
        "forward_def",
        "assign_stmt",
        "return_stmt",
        "if_stmt",
        "setting",
        "directive",
    }
)
# Rules whose leading `-` is a sign (`-x`, `float(> -1)`), written without a space after it.
_SIGN_RULES = frozenset({"neg", "neg_bound"})


@dataclass(frozen=True)
class Tok:
    """One token: its text, its terminal name (COMMENT for comments), its 1-based line and column,
    and whether it starts a statement or is a sign."""

    text: str
    kind: str
    line: int
    col: int
    starts_statement: bool = False
    is_sign: bool = False

    @property
    def is_comment(self) -> bool:
        return self.kind == "COMMENT"


def normalize(source: str) -> str:
    """The text as the loader reads it: no byte-order mark, LF line ends."""
    return source.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


_LOCK = threading.Lock()
_COMMENTS: list[Token] = []


@functools.cache
def _cst_parser() -> lark.Lark:
    """The project's grammar with every token kept in the tree and comments collected."""
    return lark.Lark(
        resources.grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
        keep_all_tokens=True,
        lexer_callbacks={"COMMENT": _COMMENTS.append},
    )


def tokens(source: str, path: str) -> list[Tok]:
    """Every token and comment of `source` (already normalized) in source order.

    Raises the parser's CompileError (located, with a caret) when the file does not parse: the
    project's parser runs first, so fmt and check report the same syntax errors."""
    parse(source, path)
    with _LOCK:  # lark's lexer callback appends to one shared list
        _COMMENTS.clear()
        try:
            tree = _cst_parser().parse(source)
        except lark.exceptions.LarkError as exc:
            raise InternalError(f"{path}: the parser accepted what the token pass did not") from exc
        comments = list(_COMMENTS)
        _COMMENTS.clear()
    starts, signs = _roles(tree)
    out = [
        Tok(
            str(t),
            t.type,
            t.line or 0,
            t.column or 0,
            (t.line, t.column) in starts,
            (t.line, t.column) in signs,
        )
        for t in tree.scan_values(lambda v: isinstance(v, Token))
    ]
    out += [Tok(str(c).rstrip(), "COMMENT", c.line or 0, c.column or 0) for c in comments]
    return sorted(out, key=lambda t: (t.line, t.col))


def _roles(tree: lark.Tree) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """The positions of tokens that start statements, and of `-` tokens that are signs."""
    starts: set[tuple[int, int]] = set()
    signs: set[tuple[int, int]] = set()
    for node in tree.iter_subtrees():
        if node.data in STATEMENT_RULES and not node.meta.empty:
            starts.add((node.meta.line, node.meta.column))
        elif node.data in _SIGN_RULES:
            for child in node.children:
                if isinstance(child, Token) and str(child) == "-":
                    signs.add((child.line or 0, child.column or 0))
    return starts, signs
