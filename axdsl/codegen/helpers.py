"""Helper functions copied into generated code only when an emitted line calls them.

Each helper is defined by its primitive (`Primitive.helpers`, collected in `primitives.HELPERS`):
where its source is and the imports that source needs. The emitters record which helpers they
call (`FunctionEmitter.use_helper`); `select` returns the source of those, in a fixed order, and
their imports, so nothing is found by searching rendered text and nothing here names a primitive.

A helper's source is real code in axdsl/kernels/ (linted, type-checked, imported by tests): a
`Source` names a module there and the definitions to copy. `kernel_source` reads that module as
text and cuts those statements out with `ast`; it never imports it, so building imports no jax.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from axdsl import primitives
from axdsl.primitives.base import HelperCode, Source

KERNELS = Path(__file__).resolve().parent.parent / "kernels"  # axdsl/kernels/


def select(used: set[str]) -> tuple[list[str], set[str]]:
    """(sources, import lines) of the helpers in `used`: by section (small functions first, whole
    layers last), then by name. A helper whose source depends on the others in use sees them all."""
    unknown = used - set(primitives.HELPERS)
    assert not unknown, f"emitters used undefined helpers {sorted(unknown)}"
    chosen = sorted((primitives.HELPERS[n] for n in used), key=lambda h: (h.section, h.name))
    names = frozenset(used)
    imports = {line for h in chosen for line in h.imports}
    return [source_text(h.code_for(names)) for h in chosen], imports


def linked(model: str, kernels: str) -> tuple[str, ...]:
    """The names model.py imports from kernels.py: the top-level definitions of kernels.py that
    model.py's code reads, sorted. Resolved on both sources' syntax trees, as a linker resolves
    symbols, so a helper that only another helper calls (rotation_tables under apply_rope) is
    not imported."""
    defined = {name for node in ast.parse(kernels).body for name in _names(node)}
    read = {
        node.id
        for node in ast.walk(ast.parse(model))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return tuple(sorted(defined & read))


def source_text(code: HelperCode) -> str:
    """The text of a helper's code: written out, or cut from axdsl/kernels/."""
    if isinstance(code, str):
        return code
    if isinstance(code, Source):
        return kernel_source(code)
    return "\n\n\n".join(kernel_source(part) for part in code)


def kernel_source(source: Source) -> str:
    """The statements of axdsl/kernels/<module>.py that define one of `source.names` or call a
    method of one (`f.defvjp(...)`), in the file's order, each with the comment lines right above
    it; an error when a name is not defined there."""
    text, statements = _module(source.module)
    lines = text.splitlines()
    wanted = set(source.names)
    chosen = [i for i, (node, _, _) in enumerate(statements) if _names(node) & wanted]
    missing = wanted - set().union(*(_names(statements[i][0]) for i in chosen))
    assert not missing, f"axdsl/kernels/{source.module}.py defines no {sorted(missing)}"
    pieces: list[str] = []
    for k, i in enumerate(chosen):
        _, first, last = statements[i]
        if k and chosen[k - 1] == i - 1:  # the file's next statement: the lines between as written
            pieces[-1] += "\n" + "\n".join(lines[statements[i - 1][2] : last])
        else:
            pieces.append("\n".join(lines[first - 1 : last]))
    return "\n\n\n".join(pieces)


@functools.cache
def _module(module: str) -> tuple[str, list[tuple[ast.stmt, int, int]]]:
    """A kernel module's text and its top-level statements, each with its first line (its
    decorators and the comment lines right above it included) and its last."""
    path = KERNELS / f"{module}.py"
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.parse(text, filename=str(path)).body:
        decorators = getattr(node, "decorator_list", [])
        first = min([node.lineno] + [d.lineno for d in decorators])
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1
        out.append((node, first, node.end_lineno or node.lineno))
    return text, out


def _names(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines, or whose method it calls (`f.defvjp(...)`)."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and isinstance(node.value.func.value, ast.Name)
    ):
        return {node.value.func.value.id}
    return set()
