"""The state shared while building the IR from the AST: the program, its diagnostics, scopes.

`BuildContext` is passed explicitly to every builder (instances, forwards, sections), so the
builders never reach into each other's private state and import nothing from each other but
their entry functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from axdsl.errors import Diagnostics, Span, relocated
from axdsl.ir import nodes as ir
from axdsl.ir.nodes import HValue
from axdsl.irbuild.consteval import EvalError, Evaluator, kind_of
from axdsl.syntax import ast
from axdsl.syntax.loader import Program


@dataclass
class Scope:
    """The resolved hyperparameters of one instance, chained to its parent's."""

    path: str
    values: dict[str, ir.HParam] = field(default_factory=dict)
    parent: Scope | None = None

    def find(self, name: str) -> ir.HParam | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        return None

    def names(self) -> list[str]:
        out: list[str] = []
        scope: Scope | None = self
        while scope is not None:
            out.extend(scope.values)
            scope = scope.parent
        return out

    def origins(self, name: str) -> Iterator[ir.Origin]:
        """The origins of `name` from this scope outwards (see ir.origins.user_line)."""
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                yield scope.values[name].origin
            scope = scope.parent

    def lookup(self, name: str, at: ast.Name | None = None) -> HValue | None:
        """The value of `name` here or in an enclosing scope (the evaluator's lookup function)."""
        found = self.find(name)
        return found.value if found else None


class BuildContext:
    """The program being built, its diagnostics and the static evaluator."""

    def __init__(self, program: Program):
        self.program = program
        self.diags = Diagnostics()
        self.ev = Evaluator(self.diags, set(program.layers))

    def eval(self, expr: ast.Expr, scope: Scope, lookup=None) -> HValue | None:
        """Evaluate a static expression; None when it failed (the error is already reported).
        An error in a library line (`repeat(layers, block)` with the user's `layers = 0`) is
        shown at the user's line that set a value the expression reads."""
        own = self.ev.report is None  # else a caller's report is in force (a default's)
        if own:
            self.ev.report = lambda at, msg, hint: self.error_at_user_line(
                at, msg, hint, scope, blamed_names(expr)
            )
        try:
            return self.ev.eval(expr, lookup or scope.lookup, scope.names)
        except EvalError:
            return None
        finally:
            if own:
                self.ev.report = None

    def error_at_user_line(
        self,
        at: Span,
        msg: str,
        hint: str | None,
        scope: Scope,
        names: list[str],
        where: str | None = None,
    ) -> None:
        """An error in a library line is shown where the user set a value it reads (their
        `heads = 0`), with a note for the library line; elsewhere, where it is."""
        user = ir.user_line(names, scope.origins)
        where = where or f"in a layer at `{scope.path}`"
        self.diags.add(relocated(at, msg, hint, user, where))

    def condition(self, expr: ast.Expr | None, scope: Scope, lookup=None) -> bool | None:
        """A declaration's `if`: True when absent, None when it failed."""
        if expr is None:
            return True
        v = self.eval(expr, scope, lookup)
        if v is None:
            return None
        if not isinstance(v.value, bool):
            self.diags.error(expr.span, f"a condition must be a bool, got {kind_of(v.value)}")
            return None
        return v.value

    def source_text(self, expr: ast.Expr) -> str:
        """The text of `expr` as written, for messages (falls back to a rebuilt form)."""
        span = expr.span
        text = self.program.sources.get(span.file)
        if text is None or span.line < 1 or span.end_line != span.line:
            return dim_name(expr)
        return text.splitlines()[span.line - 1][span.col - 1 : span.end_col - 1]


def dim_name(expr: ast.Expr) -> str:
    """A dim's display name from the expression that sized it: `dim`, `64`, `dim/heads`."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Num):
        return expr.text
    if isinstance(expr, ast.BinOp):
        return f"{dim_name(expr.left)}{expr.op}{dim_name(expr.right)}"
    return "?"


def blamed_names(expr: ast.Expr) -> list[str]:
    """The hyperparameters an expression reads, in the order to blame them for an error in it:
    a division's divisor first (`dim / heads` fails for `heads = 0`)."""
    names = ast.names_in(expr)
    if isinstance(expr, ast.BinOp) and expr.op in ("/", "//", "%"):
        names = ast.names_in(expr.right) + names
    return names
