"""The words of the language, read from where the compiler defines them, for the highlighters
(Pygments, TextMate) and the language server's completion.

Nothing is listed twice: keywords come from the grammar's literal terminals, callables from the
primitive registry and the hyperparameter evaluator, types, dtypes and initializers from the IR
builder's own tables. tests/test_highlight.py checks that both highlighters know all of them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import lark

from axdsl import primitives
from axdsl.ir.dtypes import DTYPES
from axdsl.ir.nodes import InitKind
from axdsl.irbuild import consteval
from axdsl.irbuild.instances import HPARAM_TYPES
from axdsl.syntax.parser import _parser

# Keywords that open a declaration; every other grammar keyword is control flow, an operator
# word or a constant, as sorted below.
CONTROL = frozenset({"if", "else", "return"})
OPERATOR_WORDS = frozenset({"and", "or", "not"})
CONSTANTS = frozenset({"true", "false"})
# Names that are keywords only in one place: `param w: [d] axes(embed) dtype(bf16)`. They stay
# free as hyperparameter names, so the parser reads them as NAME (syntax/parser.py param_word).
SOFT_KEYWORDS = ("axes", "dtype")
# `repeat(n, block)` builds a stack of layers in hyperparameter values (irbuild/consteval.py).
LAYER_BUILTINS = ("repeat",)


@dataclass(frozen=True)
class Vocabulary:
    """Every word class a highlighter colours, each sorted."""

    declarations: tuple[str, ...]
    control: tuple[str, ...]
    operator_words: tuple[str, ...]
    constants: tuple[str, ...]
    soft_keywords: tuple[str, ...]
    types: tuple[str, ...]
    dtypes: tuple[str, ...]
    initializers: tuple[str, ...]
    primitives: tuple[str, ...]
    hparam_functions: tuple[str, ...]

    @property
    def keywords(self) -> tuple[str, ...]:
        """Every reserved word of the grammar."""
        return tuple(
            sorted({*self.declarations, *self.control, *self.operator_words, *self.constants})
        )

    @property
    def builtins(self) -> tuple[str, ...]:
        """Every function a spec may call: primitives, hyperparameter math and `repeat`."""
        return tuple(sorted({*self.primitives, *self.hparam_functions}))


def grammar_keywords() -> frozenset[str]:
    """The reserved words of grammar/axdsl.lark: its literal terminals that are words."""
    words = set()
    for term in _parser().terminals:
        pattern = term.pattern
        if isinstance(pattern, lark.lexer.PatternStr) and re.fullmatch(r"[a-z]+", pattern.value):
            words.add(pattern.value)
    return frozenset(words)


@functools.cache
def vocabulary() -> Vocabulary:
    """The language's words, computed once."""
    keywords = grammar_keywords()
    return Vocabulary(
        declarations=tuple(sorted(keywords - CONTROL - OPERATOR_WORDS - CONSTANTS)),
        control=tuple(sorted(keywords & CONTROL)),
        operator_words=tuple(sorted(keywords & OPERATOR_WORDS)),
        constants=tuple(sorted(keywords & CONSTANTS)),
        soft_keywords=SOFT_KEYWORDS,
        types=tuple(sorted(HPARAM_TYPES)),
        dtypes=tuple(sorted(DTYPES)),
        initializers=tuple(sorted(k.value for k in InitKind)),
        primitives=tuple(primitives.callable_names()),
        hparam_functions=tuple(sorted({*consteval._MATH, *LAYER_BUILTINS})),
    )
