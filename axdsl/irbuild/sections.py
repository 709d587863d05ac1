"""Build `train { }` and `target "pattern" { }` sections: settings and directives, values typed.

Section values stay close to the syntax: a bare name becomes `ir.NameValue` (`fp8` means
nothing until configure_target reads it), a call `ir.CallValue`, a list a tuple, and numbers,
strings and bools themselves. The passes that read a section check its keys and values.
"""

from __future__ import annotations

from axdsl.ir import nodes as ir
from axdsl.irbuild.context import BuildContext, Scope
from axdsl.syntax import ast


def build_section(ctx: BuildContext, decl: ast.SectionDecl) -> ir.Section:
    settings, directives = [], []
    for item in decl.items:
        if isinstance(item, ast.Setting):
            settings.append(ir.Setting(item.name, section_value(ctx, item.value), item.span))
        else:
            args = tuple(ir.DirectiveArg(None, section_value(ctx, a), a.span) for a in item.args)
            kwargs = tuple(
                ir.DirectiveArg(k.name, section_value(ctx, k.value), k.span) for k in item.kwargs
            )
            directives.append(ir.Directive(item.name, args, kwargs, item.span))
    return ir.Section(
        ir.SectionKind(decl.kind), decl.pattern, tuple(settings), tuple(directives), decl.span
    )


def section_value(ctx: BuildContext, expr: ast.Expr) -> ir.SectionValue:
    """A value as written: names kept as names, calls as calls, constants evaluated."""
    if isinstance(expr, ast.Name):
        return ir.NameValue(expr.id)
    if isinstance(expr, ast.ListExpr):
        return tuple(section_value(ctx, i) for i in expr.items)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        return ir.CallValue(
            expr.func.id,
            tuple(section_value(ctx, a) for a in expr.args),
            tuple((k.name, section_value(ctx, k.value)) for k in expr.kwargs),
        )
    v = ctx.eval(expr, Scope("/"), lambda name, at: None)
    return v.value if v is not None else None
