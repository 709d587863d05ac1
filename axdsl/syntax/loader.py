"""Load a spec and everything it imports into one `Program`: every file parsed once, in order.

`import "std/..."` reads from the standard library shipped inside the package; any other path
is relative to the importing file. Import cycles and duplicate layer or model names are errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from axdsl import resources
from axdsl.errors import CompileError, Diagnostic, Diagnostics, Span
from axdsl.syntax import ast
from axdsl.syntax.parser import parse


@dataclass
class Program:
    """The main spec file, every file it reaches, and the texts for error rendering."""

    main: ast.SpecFile
    files: list[ast.SpecFile] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    layers: dict[str, ast.LayerDecl] = field(default_factory=dict)
    models: dict[str, ast.ModelDecl] = field(default_factory=dict)


def display_path(path: Path) -> str:
    """Paths in messages and headers: relative to the working directory, std/ files by their
    import name."""
    path = path.resolve()
    std = resources.std_dir().resolve()
    if path.is_relative_to(std):
        return "std/" + path.relative_to(std).as_posix()
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def load(path: Path, unsaved: Mapping[Path, str] | None = None) -> Program:
    """Parse `path` and its imports; raise CompileError with every problem found. `unsaved`
    holds texts to read instead of the files at those (resolved) paths: an editor's buffers."""
    unsaved = unsaved or {}
    diags = Diagnostics()
    sources: dict[str, str] = {}
    files: list[ast.SpecFile] = []
    seen: dict[Path, ast.SpecFile] = {}

    def visit(p: Path, stack: tuple[Path, ...], at: Span | None) -> None:
        p = p.resolve()
        if p in stack:
            assert at is not None  # only the root file has no import line, and it starts the stack
            diags.error(
                at,
                f"import cycle: {' -> '.join(display_path(x) for x in stack + (p,))}",
                "move the shared layers into a file both can import",
            )
            return
        if p in seen:
            return
        name = display_path(p)
        try:
            if p.exists() and not p.is_file():  # /dev/zero grew to 21 GB; a FIFO blocks forever
                raise OSError(0, "a directory" if p.is_dir() else "not a regular file")
            data = unsaved[p].encode("utf-8", "surrogatepass") if p in unsaved else p.read_bytes()
            # a leading byte-order mark and CR or CRLF line ends are what editors on other
            # systems write: read as plain UTF-8 lines (CR-only was "this spec defines no model")
            text = data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as exc:
            diags.error(
                _byte_span(name, data, exc.start),
                "the file is not UTF-8 text: "
                f"byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be decoded",
                "specs are UTF-8 text; was a binary file given?",
            )
            sources[name] = data.decode("utf-8", errors="replace")  # to show the line and caret
            return
        except OSError as exc:
            reason = exc.strerror
            if at is None:
                raise CompileError(
                    [Diagnostic(Span(name, 0, 0), f"cannot read spec: {reason}")]
                ) from exc
            diags.error(
                at,
                f"cannot import `{name}`: {reason}",
                "std/ paths come from axdsl's standard library; others are relative to this file",
            )
            return
        sources[name] = text
        try:
            spec = parse(text, name)
        except CompileError as exc:
            diags.items.extend(exc.diagnostics)
            return
        seen[p] = spec
        for imp in spec.imports:
            visit(_import_target(p, imp.path), stack + (p,), imp.span)
        files.append(spec)

    root = path.resolve()
    visit(root, (), None)
    diags.raise_if_any(sources)
    program = Program(main=seen[root], files=files, sources=sources)
    _collect_names(program, diags)
    diags.raise_if_any(sources)
    return program


def _byte_span(name: str, data: bytes, offset: int) -> Span:
    """The line and column (1-based, in characters) of byte `offset` of a file being decoded."""
    before = data[:offset].decode("utf-8", errors="replace")
    line = before.count("\n") + 1
    return Span(name, line, len(before) - (before.rfind("\n") + 1) + 1)


def _import_target(importer: Path, spec_path: str) -> Path:
    if spec_path.startswith("std/"):
        return resources.std_dir() / spec_path[len("std/") :]
    return importer.parent / spec_path


def _collect_names(program: Program, diags: Diagnostics) -> None:
    for spec in program.files:
        for layer in spec.layers:
            _check_members(layer, diags)
            if layer.name in program.layers:
                first = program.layers[layer.name].span
                diags.error(
                    layer.span, f"layer `{layer.name}` is defined twice", _twice_hint(first, layer)
                )
            else:
                program.layers[layer.name] = layer
        for model in spec.models:
            if model.name in program.models or model.name in program.layers:
                diags.error(model.span, f"`{model.name}` is defined twice")
            else:
                program.models[model.name] = model


def _twice_hint(first: Span, layer: ast.LayerDecl) -> str:
    """Where the first definition is; when another file holds it, the rule and the way out: a
    spec and the files it imports share one namespace of layers (no shadowing, so every layer
    name means one layer in every file, std's included), and a variant of an imported layer is
    made through its hyperparameters (std's T5 has `tied` for T5 v1.0's head)."""
    if first.file == layer.span.file:
        return f"first defined at {first}"
    return (
        f"first defined at {first}, an imported file: a spec and the files it imports share one "
        f"namespace of layers, so an imported layer cannot be redefined; give this layer another "
        f"name, or set the imported `{layer.name}`'s hyperparameters"
    )


def _check_members(layer: ast.LayerDecl, diags: Diagnostics) -> None:
    """Within one layer: hyperparameters are unique, and so are parameters and children together."""
    hparams: dict[str, Span] = {}
    for h in layer.hparams:
        if h.name in hparams:
            diags.error(
                h.span,
                f"hyperparameter `{h.name}` of layer `{layer.name}` is declared twice",
                f"first declared at {hparams[h.name]}",
            )
        hparams.setdefault(h.name, h.span)
    members: dict[str, Span] = {}
    decls: tuple[ast.ParamDecl | ast.ChildDecl, ...] = (*layer.params, *layer.children)
    for m in decls:
        if m.name in members:
            diags.error(
                m.span,
                f"`{m.name}` is declared twice in layer `{layer.name}`",
                f"first declared at {members[m.name]}; parameters and children need distinct names",
            )
        members.setdefault(m.name, m.span)
