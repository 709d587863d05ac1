"""The compiler's shape: stages import each other in one direction, and modules stay small.

Imports between axdsl modules (at module level or deferred into a function) form no cycle (a cycle is the sign of a missing
context object, as resolve and lower_forward once were), and no module of the compiler core
grows past the size the project keeps to. The primitive registry sits below passes and codegen,
which name no primitive: a primitive is defined in its own module only.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "axdsl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """axdsl modules `path` imports, at module level or inside a function."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # annotations only: `if TYPE_CHECKING:` imports never run
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n in modules}
    return out


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {m: _imports(p, modules) - {m} for m, p in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_module_imports_have_no_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_ir_building_is_a_stage_of_its_own():
    graph = _graph()
    irbuild = {m for m in graph if m.startswith("axdsl.irbuild")}
    assert {"axdsl.irbuild.instances", "axdsl.irbuild.forward", "axdsl.irbuild.context"} <= irbuild
    for m in irbuild:  # the builder depends on syntax, ir and primitives, never on passes or codegen
        assert not any(n.startswith(("axdsl.passes", "axdsl.codegen")) for n in graph[m]), (m, graph[m])
    assert "axdsl.irbuild.instances" not in graph["axdsl.irbuild.forward"]


def test_compiler_modules_stay_small():
    big = {m: n for m, n in ((p, len(p.read_text().splitlines())) for p in PACKAGE.rglob("*.py")) if n > 800}
    assert not big, big


def test_the_primitive_registry_sits_below_passes_and_codegen():
    graph = _graph()
    registry = {m for m in graph if m.startswith("axdsl.primitives")}
    assert {"axdsl.primitives", "axdsl.primitives.base", "axdsl.primitives.attention"} <= registry
    for m in registry:
        assert not any(n.startswith(("axdsl.passes", "axdsl.codegen")) for n in graph[m]), (m, graph[m])


# String constants in passes and codegen equal to a primitive's or a helper's name that are not
# about that primitive: (module, string) -> why it is there.
NOT_A_PRIMITIVE = {
    ("axdsl.codegen.names", "moe"): "snake() keeps the word MoE whole in layer names (MoEBlock -> moe_block)",
    ("axdsl.codegen.emit_train", "rsqrt"): "the rsqrt learning-rate schedule, not the rsqrt primitive",
    ("axdsl.passes.configure_train", "rsqrt"): "the rsqrt learning-rate schedule, not the rsqrt primitive",
}


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant in `path` except docstrings (comments are not in the AST)."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_passes_and_codegen_name_no_primitive():
    """The passes and codegen read registry entries and flags; `quantized` is made through
    axdsl.primitives.quantized.wrap, so even quantize_matmuls needs no literal name."""
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
    assert allowed == set(NOT_A_PRIMITIVE), f"stale allow-list entries: {set(NOT_A_PRIMITIVE) - allowed}"
