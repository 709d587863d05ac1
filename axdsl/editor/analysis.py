"""What the language server knows about one document, computed by the compiler itself.

`analyze` runs the loader and the pass pipeline that `axdsl check` runs on an editor's unsaved
text and keeps every diagnostic, the parsed program and the IR; the queries below (hover,
definition, completion, symbols, inlay hints) read them. Nothing here speaks the protocol (that is
lsp.py) or imports jax, so it is tested and timed in-process.

Positions: the compiler's spans are 1-based lines and 1-based columns counted in characters; the
protocol's are 0-based lines and 0-based columns counted in UTF-16 code units.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from axdsl import resources
from axdsl.errors import CompileError, Diagnostic, Span
from axdsl.ir import nodes as ir
from axdsl.ir.printer import value_text
from axdsl.syntax import ast
from axdsl.syntax.loader import Program, display_path, load

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IMPORT = re.compile(r'^\s*import\s+"([^"]*)"')
MAX_LISTED = 8  # instances shown in a hover, values in an inlay hint


@dataclass
class Analysis:
    """One check of a document: its diagnostics and, as far as the compiler got, its program
    (parsed files, layers, models) and IR module."""

    path: Path
    text: str
    target: str
    encoding: str = "utf-16"  # the protocol's position encoding, negotiated with the client
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    program: Program | None = None
    module: ir.Module | None = None
    seconds: float = 0.0


def analyze(path: Path, text: str, target: str = "cpu", encoding: str = "utf-16") -> Analysis:
    """Check `text` as the contents of `path` for `target` with the steps `axdsl check` runs
    (parse, resolve, every pass, the models' shared code, the data), collecting diagnostics
    instead of printing them. A file that defines no model (a library of layers) is only loaded:
    there is nothing to build."""
    start = time.perf_counter()
    out = Analysis(path.resolve(), text, target, encoding)
    try:
        out.program = load(out.path, {out.path: text})
        out.sources = dict(out.program.sources)
        if out.program.main.models:
            out.module = _check_module(out.program, out.path, target)
    except CompileError as exc:
        out.diagnostics = list(exc.diagnostics)
        out.sources.update(exc.sources)
    except Exception as exc:  # noqa: BLE001 - a bug: say so where the user looks, keep serving
        out.diagnostics = [_internal_error(out.path, exc)]
    out.seconds = time.perf_counter() - start
    return out


def in_context(a: Analysis, others: list[Analysis]) -> Analysis:
    """A library file (no model of its own: std/transformer.axl) seen through the IR of a spec
    that imports it (the first of `others` that does: the server passes the most recently
    checked first), so that hovers on its layers' members show their values in that spec."""
    if a.module is not None or a.program is None or a.program.main.models:
        return a
    name = a.program.main.path
    for other in others:
        if other.module is not None and name in other.sources:
            return replace(a, module=other.module, target=other.target)
    return a


def _internal_error(path: Path, exc: BaseException) -> Diagnostic:
    """A compiler bug met while checking, as a diagnostic on the first line: the server keeps
    running, and the message says what the CLI says (`axdsl check` writes the traceback)."""
    message = str(exc).splitlines()[0][:200] if str(exc) else ""
    return Diagnostic(
        Span(display_path(path), 1, 1),
        f"internal error (a bug in axdsl, please report it): {type(exc).__name__}: {message}",
        f"`axdsl check {display_path(path)}` writes the traceback to a file",
    )


def _check_module(program: Program, path: Path, target: str) -> ir.Module:
    """cli's `_cmd_check` after loading: the passes, then the checks that need the finished IR.
    Raises CompileError with every problem found."""
    from axdsl.codegen.emit import shared_functions  # loaded lazily: the passes and codegen
    from axdsl.datacheck import data_problems
    from axdsl.pipeline import run_passes

    module = run_passes(program, target)
    shared_functions(module)  # the models of a spec share one generated code
    problems = data_problems(module, path)  # data that exists and cannot train
    if problems:
        raise CompileError(problems, program.sources)
    return module


# ---------------------------------------------------------------- positions


UTF16, UTF8, UTF32 = "utf-16", "utf-8", "utf-32"  # the protocol's position encodings


def char_units(c: str, encoding: str = UTF16) -> int:
    """How many code units of `encoding` one character takes: UTF-16 is the protocol's default
    (two for a character outside the BMP); a client may negotiate UTF-8 (Neovim 0.11) or UTF-32."""
    if encoding == UTF8:
        return len(c.encode("utf-8", "surrogatepass"))
    if encoding == UTF32:
        return 1
    return 2 if ord(c) > 0xFFFF else 1


def to_units(line_text: str, col: int, encoding: str = UTF16) -> int:
    """The protocol's 0-based column of the compiler's 1-based character column."""
    return sum(char_units(c, encoding) for c in line_text[: max(0, col - 1)])


def from_units(line_text: str, character: int, encoding: str = UTF16) -> int:
    """The 0-based character index of a protocol column (0-based, in code units)."""
    units = 0
    for i, c in enumerate(line_text):
        if units >= character:
            return i
        units += char_units(c, encoding)
    return len(line_text)


def span_range(
    span: Span, sources: dict[str, str], encoding: str = UTF16
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The protocol range ((line, character), (line, character)) of a span; a span without an
    end covers one character, and a span with no line (a whole file) the start of the file."""
    if span.line <= 0:
        return (0, 0), (0, 0)
    lines = sources.get(span.file, "").split("\n")

    def at(line: int, col: int) -> tuple[int, int]:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return line - 1, to_units(text, col, encoding)

    start = at(span.line, max(span.col, 1))
    if span.end_line > 0 and (span.end_line, span.end_col) > (span.line, span.col):
        return start, at(span.end_line, span.end_col)
    return start, (start[0], start[1] + 1)


def file_of(display: str) -> Path:
    """The file a span's display path names: std/ files are the package's library, others are
    relative to the working directory, as loader.display_path wrote them."""
    if display.startswith("std/"):
        return resources.std_dir() / display.removeprefix("std/")
    path = Path(display)
    return path if path.is_absolute() else Path.cwd() / path


# ---------------------------------------------------------------- where the cursor is


@dataclass(frozen=True)
class Cursor:
    """The word under the cursor and the top-level item (layer, model, block) around it."""

    word: str
    line: int  # 1-based
    col: int  # 1-based character column of the word's start
    item: ast.LayerDecl | ast.ModelDecl | ast.SectionDecl | None
    import_path: str | None  # the string of an `import "..."` line
    called: bool = False  # the word is followed by `(`
    argument_of: str | None = None  # `Attention` for `rope` in `Attention(rope = false)`


def cursor(a: Analysis, line: int, character: int) -> Cursor | None:
    """What is at the protocol position (0-based line, UTF-16 character), or None."""
    lines = a.text.split("\n")
    if not 0 <= line < len(lines):
        return None
    text = lines[line]
    index = from_units(text, character, a.encoding)
    word = next(
        (m for m in _WORD.finditer(text) if m.start() <= index <= m.end()),
        None,
    )
    imported = _IMPORT.match(text)
    if word is None and imported is None:
        return None
    item = _enclosing(a, line + 1)
    return Cursor(
        word.group() if word else "",
        line + 1,
        (word.start() + 1) if word else 1,
        item,
        imported.group(1) if imported else None,
        word is not None and text[word.end() :].lstrip().startswith("("),
        _argument_of(a.text, line, word) if word is not None else None,
    )


def _argument_of(source: str, line: int, word: re.Match[str]) -> str | None:
    """The callee whose keyword argument `word` names (`name = ...` inside `callee(`), found by
    walking back from the word to the innermost `(` still open; None elsewhere."""
    rest = word.string[word.end() :].lstrip()
    if not rest.startswith("=") or rest.startswith("=="):
        return None
    offset = sum(len(text) + 1 for text in source.split("\n")[:line]) + word.start()
    depth = 0
    for i in range(offset - 1, -1, -1):
        c = source[i]
        if c in "{}":
            return None
        if c == ")":
            depth += 1
        elif c == "(" and depth > 0:
            depth -= 1
        elif c == "(":
            callee = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", source[max(0, i - 200) : i])
            return callee.group(1) if callee else None
    return None


def _main(a: Analysis) -> ast.SpecFile | None:
    return a.program.main if a.program is not None else None


def _enclosing(a: Analysis, line: int) -> ast.LayerDecl | ast.ModelDecl | ast.SectionDecl | None:
    """The last top-level item that starts on or before `line` (items follow one another)."""
    main = _main(a)
    if main is None:
        return None
    items: list[ast.LayerDecl | ast.ModelDecl | ast.SectionDecl] = [
        *main.layers,
        *main.models,
        *main.sections,
    ]
    before = [i for i in items if 0 < i.span.line <= line]
    return max(before, key=lambda i: (i.span.line, i.span.col), default=None)


def base_layer(program: Program, model: ast.ModelDecl) -> ast.LayerDecl | None:
    """The layer a model instantiates, through any chain of `extends`."""
    seen: set[str] = set()
    while model.extends and model.base in program.models and model.name not in seen:
        seen.add(model.name)
        model = program.models[model.base]
    return program.layers.get(model.base)


# ---------------------------------------------------------------- definition


def definition(a: Analysis, line: int, character: int) -> Span | None:
    """Where the name (or the imported file) under the cursor is defined."""
    at = cursor(a, line, character)
    if at is None or a.program is None:
        return None
    if at.import_path is not None:
        target = _import_file(a.path, at.import_path)
        return Span(str(target), 1, 1) if target.exists() else None
    program, word = a.program, at.word
    if word in program.layers:
        return program.layers[word].span
    if word in program.models:
        return program.models[word].span
    layer = _scope(program, at)
    if layer is None:
        return None
    return next((m.span for m in members(layer) if m.name == word), None)


def _scope(program: Program, at: Cursor) -> ast.LayerDecl | None:
    """The layer whose members the word under the cursor may name: the callee of a keyword
    argument (`Attention(rope = ...)`), the layer being written, or the layer a model sets."""
    if at.argument_of is not None and at.argument_of in program.layers:
        return program.layers[at.argument_of]
    if isinstance(at.item, ast.ModelDecl):
        return base_layer(program, at.item)
    return at.item if isinstance(at.item, ast.LayerDecl) else None


def members(layer: ast.LayerDecl) -> list[ast.HParamDecl | ast.ParamDecl | ast.ChildDecl]:
    """A layer's hyperparameters, parameters and children: the names its body can use."""
    return [*layer.hparams, *layer.params, *layer.children]


def _import_file(importer: Path, spec_path: str) -> Path:
    if spec_path.startswith("std/"):
        return resources.std_dir() / spec_path.removeprefix("std/")
    return importer.parent / spec_path


# ---------------------------------------------------------------- hover


def hover(a: Analysis, line: int, character: int) -> str | None:
    """Markdown about the name under the cursor: a setting's resolved value and origin, a
    layer's signature, a parameter's shape, axes and sharding per instance, a primitive."""
    at = cursor(a, line, character)
    if at is None or a.program is None or not at.word:
        return None
    program, word = a.program, at.word
    if word in program.layers and not _is_member(at, word):
        return _fenced(layer_signature(a, program.layers[word]))
    if word in program.models:
        model = program.models[word]
        return _fenced(f"model {model.name} {'extends' if model.extends else '='} {model.base}")
    if at.called and not _is_callable_member(at, word) and (text := _primitive(word)):
        return text
    if isinstance(at.item, ast.ModelDecl) and at.argument_of is None:
        text = _model_setting(a, at.item, word)
        if text is not None:
            return text
    layer = _scope(program, at)
    if layer is not None:
        text = _layer_member(a, layer, word)
        if text is not None:
            return text
    return _primitive(word)


def _is_member(at: Cursor, word: str) -> bool:
    """Whether `word` names a hyperparameter, parameter or child of the layer around the cursor:
    there it means the member, even where a layer of that name exists."""
    if not isinstance(at.item, ast.LayerDecl):
        return False
    return any(m.name == word for m in members(at.item))


def _is_callable_member(at: Cursor, word: str) -> bool:
    """Whether `word(...)` in the layer around the cursor calls a child or a Layer-typed
    hyperparameter of it rather than a primitive of the same name."""
    if not isinstance(at.item, ast.LayerDecl):
        return False
    layer_hparams = (h.name for h in at.item.hparams if h.type.name == "Layer")
    return word in {*layer_hparams, *(c.name for c in at.item.children)}


def _fenced(text: str) -> str:
    return f"```axl\n{text}\n```"


def _model_setting(a: Analysis, model: ast.ModelDecl, word: str) -> str | None:
    """`dim: int = 4096  # set at specs/x.axl:4:3`, as `axdsl dump` prints the model's root."""
    root = _root(a, model.name)
    if root is None:
        return None
    h = next((h for h in root.hparams if h.name == word), None)
    if h is None:
        return None
    return _fenced(f"{h.name}: {h.type} = {value_text(h.value.value)}  # {h.origin}")


def _root(a: Analysis, model: str) -> ir.Instance | None:
    if a.module is None:
        return None
    return next((m.root for m in a.module.models if m.name == model), None)


def _layer_member(a: Analysis, layer: ast.LayerDecl, word: str) -> str | None:
    """A hyperparameter's or parameter's value in every instance of the layer in this spec."""
    rows: list[str] = []
    for model, inst in instances(a, layer.name):
        h = next((h for h in inst.hparams if h.name == word), None)
        p = next((p for p in inst.params if p.name == word), None)
        if h is not None:
            value = value_text(h.value.value)
            rows.append(f"{model} {inst.path}: {h.name} = {value}  # {h.origin}")
        elif p is not None:
            rows.append(f"{model} {inst.path}: {param_text(p)}")
    decl = _declaration(a, layer, word)
    if decl is None and not rows:
        return None
    shown = rows[:MAX_LISTED] + ([f"... {len(rows) - MAX_LISTED} more"] if len(rows) > 8 else [])
    parts = [_fenced(decl)] if decl else []
    if shown:
        target = a.module.target_name if a.module is not None else a.target
        parts.append(f"in this spec, for target `{target}`:\n" + _fenced("\n".join(shown)))
    return "\n\n".join(parts)


def _declaration(a: Analysis, layer: ast.LayerDecl, word: str) -> str | None:
    """The source line that declares member `word` of `layer`."""
    for m in members(layer):
        if m.name == word:
            if isinstance(m, ast.HParamDecl):
                return f"{layer.name}.{_hparam_text(a, m)}"
            return _source_line(a, m.span).strip()
    return None


def _hparam_text(a: Analysis, h: ast.HParamDecl) -> str:
    """`dim: int` or `eps: float(> 0) = 1e-5`, cut from the header as written."""
    line = _source_line(a, h.span)
    start = h.span.col - 1
    depth, end = 0, start
    while end < len(line):
        c = line[end]
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        end += 1
    return line[start:end].strip()


def param_text(p: ir.Param) -> str:
    """`param wq: [dim=4096, heads=32, head_dim=128] axes(embed, heads, head_dim) bf16
    shard(fsdp, _, _)`: shape, axes, dtype and, once sharding is annotated, its mesh axes."""
    dims = ", ".join(str(d) for d in p.full_dims)
    shard = ""
    if p.sharding is not None:
        shard = " shard(" + ", ".join("+".join(s) if s else "_" for s in p.sharding) + ")"
    return f"param {p.name}: [{dims}] axes({', '.join(p.full_axes)}) {p.dtype.name}{shard}"


def instances(a: Analysis, layer: str) -> Iterator[tuple[str, ir.Instance]]:
    """(model name, instance) for every instance of `layer` in the checked module."""
    if a.module is None:
        return
    for model in a.module.models:
        stack = [model.root]
        while stack:
            inst = stack.pop()
            if inst.layer == layer:
                yield model.name, inst
            stack.extend(reversed(inst.children))


def _source_line(a: Analysis, span: Span) -> str:
    lines = a.sources.get(span.file, "").split("\n")
    return lines[span.line - 1] if 0 < span.line <= len(lines) else ""


def layer_signature(a: Analysis, layer: ast.LayerDecl) -> str:
    """The layer's header as written, its parameters and its forward's signature."""
    header = _header(a, layer.span, "{")
    if len(header) > 100:  # one hyperparameter a line
        hparams = ",\n".join(f"    {_hparam_text(a, h)}" for h in layer.hparams)
        header = f"{layer.name}(\n{hparams},\n)"
    lines = [f"layer {header}"]
    lines += [_source_line(a, p.span).strip() for p in layer.params]
    if layer.forward is not None:
        lines.append(_header(a, layer.forward.span, "{"))
    return "\n".join(lines)


def _header(a: Analysis, span: Span, stop: str) -> str:
    """The text from `span` up to the first `stop` outside brackets, on one line."""
    lines = a.sources.get(span.file, "").split("\n")[span.line - 1 :]
    text = "\n".join(lines)[span.col - 1 :]
    depth = 0
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == stop and depth == 0:
            text = text[:i]
            break
    return " ".join(text.split())


def _primitive(word: str) -> str | None:
    from axdsl import primitives

    if word not in primitives.callable_names():
        return None
    sig = primitives.get(word).signature
    args = [*sig.tensors, *(s.name for s in sig.statics)]
    args += [f"{t}=" for t in sig.optional_tensors]
    text = _fenced(f"{word}({', '.join(args)})  # primitive")
    return f"{text}\n\n{sig.doc}" if sig.doc else text


# ---------------------------------------------------------------- completion and symbols


class ItemKind(Enum):
    """What a completion or a symbol is; lsp.py maps these to the protocol's kinds."""

    LAYER = "layer"
    MODEL = "model"
    HPARAM = "hyperparameter"
    PARAM = "parameter"
    CHILD = "child"
    FORWARD = "forward"
    SETTING = "setting"
    SECTION = "section"
    FUNCTION = "function"
    KEYWORD = "keyword"
    TYPE = "type"


def completions(a: Analysis, line: int, character: int) -> list[tuple[str, ItemKind, str]]:
    """(label, kind, detail) for every name that fits around the cursor: layers, models, the
    hyperparameters of the layer being written or set, primitives, keywords, types."""
    from axdsl.editor.vocabulary import vocabulary

    out: list[tuple[str, ItemKind, str]] = []
    program = a.program
    if program is not None:
        out += [
            (name, ItemKind.LAYER, f"layer ({decl.span.file})")
            for name, decl in program.layers.items()
        ]
        out += [(n, ItemKind.MODEL, "model") for n in program.models]
        item = _enclosing(a, line + 1)
        layer = item if isinstance(item, ast.LayerDecl) else None
        if isinstance(item, ast.ModelDecl):
            layer = base_layer(program, item)
        if layer is not None:
            out += [(h.name, ItemKind.HPARAM, _hparam_text(a, h)) for h in layer.hparams]
    v = vocabulary()
    out += [(n, ItemKind.FUNCTION, "primitive") for n in v.primitives]
    out += [(n, ItemKind.FUNCTION, "builtin") for n in v.hparam_functions if n not in v.primitives]
    out += [(n, ItemKind.KEYWORD, "keyword") for n in v.keywords]
    out += [(n, ItemKind.TYPE, "type") for n in (*v.types, *v.dtypes) if n != "dtype"]
    return out


@dataclass(frozen=True)
class Symbol:
    """An outline entry: a name, its kind, where it is and what it holds."""

    name: str
    kind: ItemKind
    span: Span
    children: tuple[Symbol, ...] = ()


def symbols(a: Analysis) -> list[Symbol]:
    """The document's outline: layers with their members, models with their settings, blocks."""
    main = _main(a)
    if main is None:
        return []
    out = [_layer_symbol(layer) for layer in main.layers]
    out += [
        Symbol(
            m.name,
            ItemKind.MODEL,
            m.span,
            tuple(Symbol(s.name, ItemKind.SETTING, s.span) for s in m.settings),
        )
        for m in main.models
    ]
    out += [
        Symbol(f'{s.kind} "{s.pattern}"' if s.pattern else s.kind, ItemKind.SECTION, s.span)
        for s in main.sections
    ]
    return sorted(out, key=lambda s: (s.span.line, s.span.col))


def _layer_symbol(layer: ast.LayerDecl) -> Symbol:
    members = [Symbol(h.name, ItemKind.HPARAM, h.span) for h in layer.hparams]
    members += [Symbol(p.name, ItemKind.PARAM, p.span) for p in layer.params]
    members += [Symbol(c.name, ItemKind.CHILD, c.span) for c in layer.children]
    if layer.forward is not None:
        members.append(Symbol("forward", ItemKind.FORWARD, layer.forward.span))
    return Symbol(layer.name, ItemKind.LAYER, layer.span, tuple(members))


# ---------------------------------------------------------------- inlay hints


def inlay_hints(a: Analysis) -> list[tuple[Span, str]]:
    """(where, label) for every hint of the document: what models inherit through `extends`,
    and the dims each child inherits from the layers around it."""
    return sorted([*inherited_settings(a), *inherited_dims(a)], key=lambda h: (h[0].line, h[0].col))


def _listed(values: list[str]) -> str:
    """`a = 1, b = 2, ... 3 more`: at most MAX_LISTED values."""
    more = f", ... {len(values) - MAX_LISTED} more" if len(values) > MAX_LISTED else ""
    return ", ".join(values[:MAX_LISTED]) + more


def inherited_settings(a: Analysis) -> list[tuple[Span, str]]:
    """For each `model X extends Y` of the document: at its base's name, the values it inherits
    from its base models (set there, not here), e.g. `rope_theta = 500000.0, dtype = bf16`."""
    main = _main(a)
    out: list[tuple[Span, str]] = []
    if main is None:
        return out
    for model in main.models:
        root = _root(a, model.name)
        if not model.extends or root is None:
            continue
        own = {s.name for s in model.settings}
        inherited = [
            f"{h.name} = {value_text(h.value.value)}"
            for h in root.hparams
            if h.origin.kind is ir.OriginKind.SET and h.name not in own
        ]
        if inherited:
            out.append((model.base_span, f"inherits {_listed(inherited)}"))
    return out


def inherited_dims(a: Analysis) -> list[tuple[Span, str]]:
    """For each `child` of the document's layers: at its name, the hyperparameters its instance
    takes from the layers around it (`dim = 4096, heads = 32 from /blocks`), in the first
    instance of the layer that the checked module has (a library file: in the spec that uses it)."""
    main = _main(a)
    out: list[tuple[Span, str]] = []
    for layer in main.layers if main is not None else ():
        inst = next((i for _, i in instances(a, layer.name)), None)
        if inst is None:
            continue
        kids = {c.name: c for c in inst.children}
        for child in layer.children:
            kid = kids.get(child.name)
            inherited = (
                [h for h in kid.hparams if h.origin.kind is ir.OriginKind.INHERITED] if kid else []
            )
            if inherited:
                values = [f"{h.name} = {value_text(h.value.value)}" for h in inherited]
                owners = sorted({h.origin.where for h in inherited})
                end = Span(child.span.file, child.span.line, len(_source_line(a, child.span)) + 1)
                out.append((end, f"{_listed(values)} from {', '.join(owners)}"))
    return out
