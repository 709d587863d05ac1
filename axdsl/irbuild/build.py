"""build_module: the IR module for the main spec file of a loaded program."""

from __future__ import annotations

import hashlib

from axdsl.errors import Diagnostic, Note, Span, is_library
from axdsl.syntax import ast
from axdsl.ir import nodes as ir
from axdsl.irbuild.context import BuildContext
from axdsl.irbuild.instances import InstanceBuilder
from axdsl.irbuild.sections import build_section
from axdsl.syntax.loader import Program


def build_module(program: Program, target: str = "cpu") -> ir.Module:
    """Every model of the main spec instantiated, its sections built; errors raised together."""
    ctx = BuildContext(program)
    builder = InstanceBuilder(ctx)
    models = tuple(m for m in (_model(ctx, builder, d) for d in program.main.models) if m)
    sections = [build_section(ctx, s) for s in program.main.sections]
    trains = [s for s in sections if s.kind is ir.SectionKind.TRAIN]
    if len(trains) > 1:
        ctx.diags.error(trains[1].span, "a spec has at most one `train` block")
    if not program.main.models:
        ctx.diags.error(
            Span(program.main.path, 1, 1),
            "this spec defines no model",
            "add `model NAME = DecoderLM { ... }`",
        )
    ctx.diags.raise_if_any(program.sources)
    source = program.sources[program.main.path]
    return ir.Module(
        spec=program.main.path,
        sha256=hashlib.sha256(source.encode("utf-8")).hexdigest(),
        models=models,
        train_block=trains[0] if trains else None,
        target_blocks=tuple(s for s in sections if s.kind is ir.SectionKind.TARGET),
        target_name=target,
    )


def _model(ctx: BuildContext, builder: InstanceBuilder, decl: ast.ModelDecl) -> ir.Model | None:
    """One model; an error it raised in a library line that no pass could blame on a line of
    the user's (`hidden` of MLP from the user's `dim = -64` through `ffn = 4 * dim`) is shown at
    the user's model, with a note for the library line: the user's file always has the error."""
    before = len(ctx.diags.items)
    model = builder.model(decl)
    for i in range(before, len(ctx.diags.items)):
        d = ctx.diags.items[i]
        if is_library(d.span) and not d.notes:
            note = Note(d.span, f"raised here, while building model `{decl.name}`")
            ctx.diags.items[i] = Diagnostic(decl.span, d.message, d.hint, (note,))
    return model
