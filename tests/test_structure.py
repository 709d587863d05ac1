"""The compiler's design, checked on its import graph rather than on line counts.

Rules:
- No import cycle between axdsl modules (a cycle is the sign of a missing context object, as
  resolve and lower_forward once were).
- Layers: a module imports only its own group or a lower layer (LAYERS below, low to high).
- Passes, codegen and analysis reach primitives through the registry (`axdsl.primitives` and
  its types in `axdsl.primitives.base`), never a primitive's own module.
- Codegen prints the IR the passes finished: it never calls into a pass or the pipeline.
- Passes and codegen name no primitive in a string constant.

The graph counts every import: at module level, deferred into a function, relative (`from .x
import y`), and under `if TYPE_CHECKING:` (a type-only import still ties the two designs
together, and is how both of today's cycles hide). Where the code breaks a rule today, the edge is
listed in a KNOWN_* set with the reason; a listed edge that no longer exists fails the test too,
so each list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "axdsl"

# Groups, low to high; a tuple holds sibling groups that must not import each other. A group is
# a subpackage (`axdsl.passes.*`) or a top-level module (`axdsl.lora`); "axdsl" is the package's
# own __init__. Every module of the package must belong to one (test_every_module_has_a_layer).
LAYERS: tuple[tuple[str, ...], ...] = (
    # the source generated programs copy (they import only their own package's modules)
    ("kernels", "runtime"),
    ("axdsl", "errors", "resources", "checkpoints", "textcodec"),  # no axdsl imports
    ("syntax",),  # the parser and loader
    ("ir",),
    ("targets",),  # chip profiles, parsed into the IR's enums (kernels, remat, quantize)
    ("primitives", "objectives", "optim", "lora", "finetune", "datacheck"),  # the IR's vocabularies
    ("irbuild", "analysis"),  # AST -> IR; cost models over the IR (fit_remat needs them)
    ("passes",),
    ("pipeline", "codegen"),
    ("build", "stats", "hf", "editor"),  # editor: fmt, lsp and highlighting, over the pipeline
    ("aot", "runs"),
    ("sampling",),
    ("evaluation",),  # axdsl eval: loads models through sampling
    ("cli",),
    ("__main__",),
)

# module -> imported module: the layering the code breaks today, and why.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()

# The strongly connected components of the graph that exist today (each is being taken apart).
KNOWN_CYCLES: set[frozenset[str]] = set()

# Modules of axdsl.primitives that are the registry and its vocabulary, not a primitive.
REGISTRY = {"axdsl.primitives", "axdsl.primitives.base"}

# (module, primitive module): direct imports of one primitive from passes, codegen or analysis.
KNOWN_PRIMITIVE_IMPORTS = {
    ("axdsl.analysis.flops", "axdsl.primitives.moe"),  # the MoE FLOPs formula
    ("axdsl.codegen.emit", "axdsl.primitives.quantized"),  # the quantized matmul's helpers
    ("axdsl.codegen.emit_train", "axdsl.primitives.moe"),  # the MoE balancing update
    ("axdsl.codegen.expressions", "axdsl.primitives.einsum"),  # einsum's letters
    ("axdsl.passes.quantize_matmuls", "axdsl.primitives.quantized"),  # quantized.wrap
    ("axdsl.passes.verify", "axdsl.primitives.quantized"),  # what a `quantized` must wrap
}

# (codegen module, pass or pipeline module) that codegen calls into today.
KNOWN_CODEGEN_INTO_PASSES: set[tuple[str, str]] = set()

# A function this long (black-formatted, so lines cannot be joined to fit) wants splitting.
LONGEST_FUNCTION = 150


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The package's modules `module` (at `path`) imports, anywhere in its source.

    `from a import b` depends on module a.b when there is one, else on a (b is a name in it);
    a relative import is resolved against `module`'s package.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.extend(
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            )
    out = set()
    for name in found:
        while name and name not in modules:  # `import axdsl.ir.nodes.x`: the module it is in
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    root = package.parent
    paths = {_module_name(p, root): p for p in package.rglob("*.py")}
    modules = set(paths)
    return {m: _imports(p, m, modules) for m, p in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = set()
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.add(n)
                if n == m:
                    break
            if len(component) > 1:
                out.add(frozenset(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _rank() -> dict[str, int]:
    return {group: i for i, layer in enumerate(LAYERS) for group in layer}


def _edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, n) for m, ns in graph.items() for n in ns}


def _assert_known(found: set[tuple[str, str]], known: set[tuple[str, str]], rule: str) -> None:
    """`found` breaks `rule`; every edge must be listed in `known`, and every listed one found."""
    new, fixed = sorted(found - known), sorted(known - found)
    assert not new, f"{rule}: " + ", ".join(f"{a} -> {b}" for a, b in new)
    assert not fixed, f"no longer true, remove from the known list: {fixed}"


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The reader behind every rule here: relative, deferred and type-only imports count."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__", "a", "b", "c", "sub/__init__", "sub/d", "sub/e"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .sub.d import thing\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.c import C\n"
        "def f():\n"
        "    import pkg.sub.e\n"
    )
    (pkg / "sub" / "d.py").write_text("from .. import a\nfrom ..sub import e\nimport os\n")
    graph = _graph(pkg)
    assert graph["pkg.a"] == {"pkg.b", "pkg.sub.d", "pkg.c", "pkg.sub.e"}
    assert graph["pkg.sub.d"] == {"pkg.a", "pkg.sub.e"}
    assert _cycles(graph) == {frozenset({"pkg.a", "pkg.sub.d"})}


def test_module_imports_have_no_cycle():
    cycles = _cycles(_graph())
    new = [" <-> ".join(sorted(c)) for c in cycles - KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(new)
    fixed = KNOWN_CYCLES - cycles
    assert not fixed, f"no longer a cycle, remove from KNOWN_CYCLES: {fixed}"


def test_every_module_has_a_layer():
    groups = {_group(m) for m in _graph()}
    ranked = set(_rank())
    assert groups <= ranked, f"place these in LAYERS: {sorted(groups - ranked)}"
    assert ranked <= groups, f"LAYERS names groups that do not exist: {sorted(ranked - groups)}"


def test_lower_layers_never_import_higher_ones():
    rank = _rank()
    up = {
        (m, n)
        for m, n in _edges(_graph())
        if _group(m) != _group(n)
        and rank.get(_group(n), -1) >= rank.get(_group(m), len(LAYERS))  # unplaced: the test above
    }
    _assert_known(up, KNOWN_LAYER_VIOLATIONS, "imports of the same or a higher layer")


def test_passes_codegen_and_analysis_reach_primitives_through_the_registry():
    graph = _graph()
    assert REGISTRY < {m for m in graph if _group(m) == "primitives"}
    direct = {
        (m, n)
        for m, n in _edges(graph)
        if _group(m) in ("passes", "codegen", "analysis")
        and _group(n) == "primitives"
        and n not in REGISTRY
    }
    _assert_known(direct, KNOWN_PRIMITIVE_IMPORTS, "a primitive's own module imported")


def test_codegen_does_not_call_into_passes():
    calls = {
        (m, n)
        for m, n in _edges(_graph())
        if _group(m) == "codegen" and _group(n) in ("passes", "pipeline")
    }
    _assert_known(calls, KNOWN_CODEGEN_INTO_PASSES, "codegen calls into a pass")


def test_ir_building_is_a_stage_of_its_own():
    graph = _graph()
    irbuild = {m for m in graph if _group(m) == "irbuild"}
    assert {"axdsl.irbuild.instances", "axdsl.irbuild.forward", "axdsl.irbuild.context"} <= irbuild
    assert "axdsl.irbuild.instances" not in graph["axdsl.irbuild.forward"]


def test_functions_stay_readable():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, f"functions over {LONGEST_FUNCTION} lines: {long}"


# String constants in passes and codegen equal to a primitive's or a helper's name that are not
# about that primitive: (module, string) -> why it is there.
NOT_A_PRIMITIVE: dict[tuple[str, str], str] = {
    ("axdsl.passes.configure_target", "pipeline"): (
        "the target directive pipeline(...), not the generated helper of that name"
    ),
}


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant in `path` except docstrings (comments are not in
    the AST)."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_passes_and_codegen_name_no_primitive():
    """The passes and codegen read registry entries and flags, not names."""
    from axdsl import primitives

    names = set(primitives.REGISTRY) | set(primitives.HELPERS)
    found, allowed = [], set()
    for sub in ("passes", "codegen"):
        for path in sorted((PACKAGE / sub).rglob("*.py")):
            module = _module_name(path)
            for line, value in _string_constants(path):
                if value in names and (module, value) in NOT_A_PRIMITIVE:
                    allowed.add((module, value))
                elif value in names:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not found, "primitives are named only in axdsl/primitives/: " + ", ".join(found)
    assert allowed == set(
        NOT_A_PRIMITIVE
    ), f"stale allow-list entries: {set(NOT_A_PRIMITIVE) - allowed}"
