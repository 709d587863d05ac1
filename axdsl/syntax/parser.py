"""Parse one .axl file with lark (LALR, positions kept) into the typed AST of `syntax/ast.py`.

Syntax errors from lark are translated into located diagnostics that say what was expected.
"""

from __future__ import annotations

import functools
import math

import lark
from lark import Token, Transformer, v_args

from axdsl import resources
from axdsl.errors import CompileError, Diagnostic, Span
from axdsl.syntax import ast
from axdsl.syntax.ast import INT64_MAX

# Friendly names for lark's regex terminals in "expected ..." messages; literal terminals
# (keywords and punctuation) are shown as their text, e.g. `->`.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "COMPARE_OP": "a comparison",
    "ADD_OP": "`+`, `-`",
    "MUL_OP": "`*`, `/`, `//`, `%`",
    "$END": "end of file",
}
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(
        resources.grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
    )


def parse(source: str, path: str) -> ast.SpecFile:
    """Parse `source` (the text of `path`) into a SpecFile, or raise CompileError."""
    try:
        tree = _parser().parse(source)
    except lark.exceptions.UnexpectedInput as exc:
        raise CompileError([_syntax_diagnostic(exc, path, source)], {path: source}) from None
    too_deep = _too_deep(tree, path)
    if too_deep is not None:
        raise CompileError([too_deep], {path: source})
    to_ast = _ToAst(path)
    try:
        spec = to_ast.transform(tree)
    except lark.exceptions.VisitError as exc:  # a bug in a callback, never a user mistake
        raise exc.orig_exc from None
    if to_ast.diags:
        raise CompileError(to_ast.diags, {path: source})
    return spec


MAX_NESTING = 200  # parse-tree levels; the recursive stages after parsing handle twice this


def _too_deep(tree: lark.Tree, path: str) -> Diagnostic | None:
    """A located error where the parse tree first nests deeper than MAX_NESTING levels (such as
    `- - - ... 1` or `Block(mlp = Block(mlp = ...))`), found without recursion, so that the
    recursive stages after parsing never meet a RecursionError; None when the tree is shallow."""
    stack: list[tuple[lark.Tree | Token, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, lark.Tree):
            continue
        if depth > MAX_NESTING:
            line, col = _first_position(node)
            return Diagnostic(
                Span(path, line, col, line, col + 1),
                f"nested too deeply: more than {MAX_NESTING} levels of expressions or layers",
                "split it into named steps or settings",
            )
        stack.extend((child, depth + 1) for child in node.children)
    return None


def _first_position(node: lark.Tree) -> tuple[int, int]:
    """The line and column of `node`, or of its first token when lark kept no position for it."""
    meta = node.meta
    if not getattr(meta, "empty", True):
        return meta.line, meta.column
    token = next((t for t in node.scan_values(lambda v: isinstance(v, Token))), None)
    return (token.line or 1, token.column or 1) if token is not None else (1, 1)


def _terminal_display(name: str) -> str:
    """How an expected terminal reads in a message: `a name`, `->`, `}`."""
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return f"`{name.lower()}`"
    if isinstance(pattern, lark.lexer.PatternStr):
        return f"`{pattern.value}`"
    return f"`{name.lower()}`"


def _describe_expected(expected: set[str]) -> str:
    named = sorted({_terminal_display(t) for t in expected})
    if len(named) > 8:
        named = named[:8] + ["..."]
    return ", ".join(named)


def _unclosed_bracket(source: str) -> tuple[str, int, int] | None:
    """The innermost bracket left open at the end of `source`: (char, line, col), skipping
    strings and comments."""
    stack: list[tuple[str, int, int]] = []
    line, col, i = 1, 1, 0
    in_string = in_comment = False
    while i < len(source):
        c = source[i]
        if c == "\n":
            in_comment = in_string = False
            line, col, i = line + 1, 1, i + 1
            continue
        if in_string and c == "\\":
            col, i = col + 2, i + 2
            continue
        if in_string:
            in_string = c != '"'
        elif not in_comment:
            if c == '"':
                in_string = True
            elif c == "#":
                in_comment = True
            elif c in _BRACKETS:
                stack.append((c, line, col))
            elif stack and c == _BRACKETS[stack[-1][0]]:
                stack.pop()
        col, i = col + 1, i + 1
    return stack[-1] if stack else None


def _end_of_file_diagnostic(
    exc: lark.exceptions.UnexpectedToken, path: str, source: str
) -> Diagnostic:
    """Unexpected end of file: point just after the last token and name the bracket left open."""
    tok = exc.token
    line = tok.end_line or tok.line or 1
    col = tok.end_column or tok.column or 1
    expected = f"expected {_describe_expected(set(exc.expected))}"
    opened = _unclosed_bracket(source)
    if opened is None:
        return Diagnostic(
            Span(path, line, col, line, col + 1), "syntax error: unexpected end of file", expected
        )
    char, o_line, o_col = opened
    return Diagnostic(
        Span(path, line, col, line, col + 1),
        f"syntax error: unexpected end of file: `{char}` opened at {path}:{o_line}:{o_col} "
        "is never closed",
        f"add the missing `{_BRACKETS[char]}`",
    )


def _syntax_diagnostic(exc: lark.exceptions.UnexpectedInput, path: str, source: str) -> Diagnostic:
    line, col = getattr(exc, "line", 0) or 0, getattr(exc, "column", 0) or 0
    if isinstance(exc, lark.exceptions.UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            return _end_of_file_diagnostic(exc, path, source)
        span = Span(path, line, col, line, col + max(1, len(str(tok))))
        return Diagnostic(
            span,
            f"syntax error: unexpected `{tok}`",
            f"expected {_describe_expected(set(exc.expected))}",
        )
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        if exc.char == '"':
            return Diagnostic(
                Span(path, line, col, line, col + 1),
                "syntax error: unterminated string",
                'a string ends with `"` on the line where it starts',
            )
        return Diagnostic(
            Span(path, line, col, line, col + 1),
            f"syntax error: unexpected character `{exc.char}`",
            "names are letters, digits and `_`; strings use double quotes; comments start with `#`",
        )
    return Diagnostic(
        Span(path, line, col), "syntax error: unexpected end of file", "a `}` or `)` may be missing"
    )


def _span(path: str, meta_or_token) -> Span:
    if isinstance(meta_or_token, Token):
        t = meta_or_token  # the parser's tokens carry positions; lark types them Optional
        return Span(path, t.line or 0, t.column or 0, t.end_line or 0, t.end_column or 0)
    m = meta_or_token
    if getattr(m, "empty", True):
        return Span(path, 0, 0)
    return Span(path, m.line, m.column, m.end_line, m.end_column)


def _unquote(token: str) -> str:
    body = token[1:-1]
    return body.encode("utf-8").decode("unicode_escape") if "\\" in body else body


@v_args(meta=True)
class _ToAst(Transformer):
    """Two-liner methods that turn lark trees into AST nodes with spans."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.diags: list[Diagnostic] = []

    def error(self, span: Span, message: str, hint: str | None = None) -> None:
        """Record a mistake found while building the AST; `parse` raises them all at the end."""
        self.diags.append(Diagnostic(span, message, hint))

    def s(self, x) -> Span:
        return _span(self.path, x)

    # ---- top level
    def start(self, meta, items):
        return ast.SpecFile(
            self.path,
            tuple(i for i in items if isinstance(i, ast.Import)),
            tuple(i for i in items if isinstance(i, ast.LayerDecl)),
            tuple(i for i in items if isinstance(i, ast.ModelDecl)),
            tuple(i for i in items if isinstance(i, ast.SectionDecl)),
        )

    def import_stmt(self, meta, children):
        return ast.Import(_unquote(children[0]), self.s(meta))

    # ---- layers
    def layer_def(self, meta, children):
        name, *rest = children
        hparams = tuple(c for c in rest if isinstance(c, ast.HParamDecl))
        params = tuple(c for c in rest if isinstance(c, ast.ParamDecl))
        kids = tuple(c for c in rest if isinstance(c, ast.ChildDecl))
        forwards = [c for c in rest if isinstance(c, ast.ForwardDecl)]
        layer = ast.LayerDecl(
            str(name), hparams, params, kids, forwards[0] if forwards else None, self.s(name)
        )
        for extra in forwards[1:]:
            self.error(
                extra.span, f"layer `{name}` has more than one forward", "merge them into one"
            )
        return layer

    def hparam(self, meta, children):
        name, type_ref, default = children
        return ast.HParamDecl(str(name), type_ref, default, self.s(name))

    def simple_type(self, meta, children):
        return ast.TypeRef(str(children[0]), (), self.s(meta))

    def enum_type(self, meta, children):
        kind, *options = children
        if str(kind) != "enum":
            self.error(
                self.s(kind),
                f"unknown parameterized type `{kind}`",
                'there are `enum("a", "b")` and bounded numbers: `float(> 0)`',
            )
        return ast.TypeRef(
            "enum", tuple(_unquote(c) for c in options if c is not None), self.s(meta)
        )

    def bounded_type(self, meta, children):
        kind, *bounds = children
        bounds = tuple(b for b in bounds if b is not None)
        if str(kind) not in ("int", "float"):
            self.error(
                self.s(kind),
                f"only int and float take bounds, not `{kind}`",
                "e.g. `eps: float(> 0)`, `window: int(>= 0)`",
            )
        return ast.TypeRef(str(kind), (), self.s(meta), bounds)

    def bound(self, meta, children):
        return self._bound(children[0], children[1], 1)

    def neg_bound(self, meta, children):
        return self._bound(children[0], children[1], -1)

    def _bound(self, op: Token, number: Token, sign: int) -> ast.Bound | None:
        if str(op) not in ast.BOUND_OPS:
            self.error(
                self.s(op),
                f"`{op}` is not a bound",
                "a bound is one of " + ", ".join(f"`{o}`" for o in ast.BOUND_OPS),
            )
            return None
        limit = self.number(None, [number]).value
        return ast.Bound(ast.BoundOp(str(op)), sign * limit)

    def param_def(self, meta, children):
        name, shape, *opts = children
        axes = axes_span = init = dtype = dtype_span = condition = None
        for kind, value, span in opts:
            if kind == "bad":
                continue
            if kind == "axes":
                axes, axes_span = value, span
            elif kind == "init":
                init = value
            elif kind == "if":
                condition = value
            else:
                dtype, dtype_span = value, span
        return ast.ParamDecl(
            str(name), shape, axes, axes_span, init, dtype, condition, self.s(name), dtype_span
        )

    def param_if(self, meta, children):
        return ("if", children[0], self.s(meta))

    def ellipsis(self, meta, children):
        return ast.EllipsisDim(self.s(meta))

    def param_word(self, meta, children):
        word, *names = children
        names = tuple(str(c) for c in names if c is not None)
        if word == "axes":
            return ("axes", names, self.s(meta))
        if word == "dtype" and len(names) == 1:
            return ("dtype", names[0], self.s(meta))
        if word == "dtype":
            self.error(
                self.s(meta),
                f"`dtype(...)` takes one dtype name, got {len(names)}",
                "e.g. `dtype(bf16)`",
            )
        else:
            self.error(
                self.s(word),
                f"unknown parameter option `{word}`",
                "options are `axes(...)`, `init kind(...)`, `dtype(name)` and `if cond`",
            )
        return ("bad", None, self.s(meta))

    def param_init(self, meta, children):
        kind, *args = children
        args = tuple(a for a in args if a is not None)
        return ("init", ast.InitSpec(str(kind), args, self.s(meta)), self.s(meta))

    def shape(self, meta, children):
        return tuple(c for c in children if c is not None)

    def child_def(self, meta, children):
        return ast.ChildDecl(str(children[0]), children[1], children[2], self.s(children[0]))

    def forward_def(self, meta, children):
        # children: the tensor args, the result shape (a tuple), then the statements.
        tensor_args = tuple(c for c in children if isinstance(c, ast.TensorArg))
        shapes = [c for c in children if isinstance(c, tuple) and not isinstance(c, ast.TensorArg)]
        stmts = tuple(c for c in children if isinstance(c, (ast.Assign, ast.Return, ast.If)))
        return ast.ForwardDecl(tensor_args, shapes[0], self.s(meta), stmts, self.s(meta))

    def tensor_arg(self, meta, children):
        return ast.TensorArg(str(children[0]), children[1], self.s(children[0]), children[2])

    def assign_stmt(self, meta, children):
        name, value, point = children
        return ast.Assign(str(name), value, str(point) if point is not None else None, self.s(name))

    def if_stmt(self, meta, children):
        cond, then, orelse = children
        if isinstance(orelse, ast.If):
            orelse = (orelse,)
        return ast.If(cond, then, orelse or (), self.s(meta))

    def block(self, meta, children):
        return tuple(children)

    def return_stmt(self, meta, children):
        return ast.Return(children[0], self.s(meta))

    # ---- models and sections
    def model_new(self, meta, children):
        name, base, *settings = children
        return ast.ModelDecl(
            str(name), str(base), False, tuple(settings), self.s(name), self.s(base)
        )

    def model_extends(self, meta, children):
        name, base, *settings = children
        return ast.ModelDecl(
            str(name), str(base), True, tuple(settings), self.s(name), self.s(base)
        )

    def setting(self, meta, children):
        return ast.Setting(str(children[0]), children[1], self.s(children[0]))

    def train_def(self, meta, children):
        return ast.SectionDecl("train", None, tuple(children), self.s(meta))

    def target_def(self, meta, children):
        pattern, *items = children
        return ast.SectionDecl("target", _unquote(pattern), tuple(items), self.s(pattern))

    def directive(self, meta, children):
        name, *args = children
        args = [a for a in args if a is not None]
        return ast.Directive(
            str(name),
            tuple(a for a in args if not isinstance(a, ast.Kwarg)),
            tuple(a for a in args if isinstance(a, ast.Kwarg)),
            self.s(name),
        )

    # ---- expressions
    def _bin(self, meta, op, left, right):
        return ast.BinOp(op, left, right, self.s(meta))

    def binop(self, meta, children):
        return self._bin(meta, str(children[1]), children[0], children[2])

    def compare_op(self, meta, children):
        return self._bin(meta, str(children[1]), children[0], children[2])

    def matmul_op(self, meta, children):
        return self._bin(meta, "@", children[0], children[1])

    def or_op(self, meta, children):
        return self._bin(meta, "or", children[0], children[1])

    def and_op(self, meta, children):
        return self._bin(meta, "and", children[0], children[1])

    def not_op(self, meta, children):
        return ast.Unary("not", children[0], self.s(meta))

    def neg(self, meta, children):
        return ast.Unary("-", children[0], self.s(meta))

    def call(self, meta, children):
        func, *args = children
        args = [a for a in args if a is not None]
        return ast.Call(
            func,
            tuple(a for a in args if not isinstance(a, ast.Kwarg)),
            tuple(a for a in args if isinstance(a, ast.Kwarg)),
            self.s(meta),
        )

    def attr(self, meta, children):
        return ast.Attr(children[0], str(children[1]), self.s(meta))

    def arg(self, meta, children):
        value, condition = children
        return value if condition is None else ast.When(value, condition, self.s(meta))

    def kwarg(self, meta, children):
        name, value, condition = children
        if condition is not None:
            value = ast.When(value, condition, self.s(meta))
        return ast.Kwarg(str(name), value, self.s(name))

    def number(self, meta, children):
        text, span = str(children[0]), self.s(children[0])
        shown = text if len(text) <= 24 else text[:21] + "..."
        if any(c in text for c in ".eE"):
            value = float(text)
            if not math.isfinite(value):
                self.error(
                    span,
                    f"number {shown} is too large for a float",
                    "floats are 64-bit: at most about 1.8e308",
                )
                value = 0.0
            return ast.Num(value, text, span)
        if len(text) > 19 or int(text) > INT64_MAX:
            self.error(
                span, f"number {shown} does not fit in 64 bits", f"integers are at most {INT64_MAX}"
            )
            return ast.Num(0, text, span)
        return ast.Num(int(text), text, span)

    def string(self, meta, children):
        return ast.Str(_unquote(children[0]), self.s(children[0]))

    def true(self, meta, children):
        return ast.Bool(True, self.s(meta))

    def false(self, meta, children):
        return ast.Bool(False, self.s(meta))

    def name(self, meta, children):
        return ast.Name(str(children[0]), self.s(children[0]))

    def list(self, meta, children):
        return ast.ListExpr(tuple(c for c in children if c is not None), self.s(meta))
