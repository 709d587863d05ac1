"""The rules every generated Python file follows, checked on its libcst tree (see format.py).

It parses; it imports only jax, numpy, optax, orbax, tqdm, the standard library and sibling
generated files (never axdsl); every import is used; and it calls none of the builtins that run or
load arbitrary code. Kept apart from format.py so that libcst is imported only when a file is
actually checked, not on a build that finds every file in the build cache.
"""

from __future__ import annotations

import sys

import libcst as cst

# tokenizers (HF's, issue 13) is imported by runtime.py only inside the functions for text with a
# tokenizer, jinja2 (an axdsl dependency) only inside those rendering chat templates (issue 37);
# tensorboardX writes the TensorBoard event files.
ALLOWED_THIRD_PARTY = {
    "jax",
    "numpy",
    "optax",
    "orbax",
    "tqdm",
    "tokenizers",
    "jinja2",
    "tensorboardX",
}
FORBIDDEN_CALLS = {
    "exec",
    "eval",
    "compile",
    "__import__",
    "globals",
    "locals",
    "breakpoint",
    "setattr",
    "delattr",
    "input",
}


def problems(source: str) -> list[str]:
    """What `source` breaks of the rules, or the parse error's message; empty when it is fine."""
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return [f"generated code does not parse: {exc}"]
    visitor = _Checker()
    tree.visit(visitor)
    found = list(visitor.problems)
    for name in sorted(visitor.imported):
        if name not in visitor.used:
            found.append(f"unused import `{name}`")
    return found


def _as_name(asname: cst.AsName) -> str:
    """The name an import's `as` binds (always a plain name in an import statement)."""
    if not isinstance(asname.name, cst.Name):
        raise TypeError(f"import binds a non-name: {type(asname.name).__name__}")
    return asname.name.value


class _Checker(cst.CSTVisitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.imported: set[str] = set()
        self.used: set[str] = set()

    def _module_ok(self, dotted: str) -> None:
        top = dotted.split(".")[0]
        if top == "axdsl":
            self.problems.append("generated code must not import axdsl")
        elif (
            top not in ALLOWED_THIRD_PARTY
            and top not in sys.stdlib_module_names
            and top != "__future__"
        ):
            self.problems.append(f"import of `{dotted}` is not allowed")

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            dotted = cst.helpers.get_full_name_for_node_or_raise(alias.name)
            self._module_ok(dotted)
            bound = _as_name(alias.asname) if alias.asname else dotted.split(".")[0]
            self.imported.add(bound)
        return False  # names inside an import statement are not uses

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        dotted = cst.helpers.get_full_name_for_node_or_raise(node.module) if node.module else ""
        if not node.relative:  # `from .model import ...`: a sibling generated file
            self._module_ok(dotted)
        if dotted == "__future__":
            return False
        if isinstance(node.names, cst.ImportStar):
            self.problems.append("star imports are not allowed")
            return False
        for alias in node.names:
            bound = (
                _as_name(alias.asname)
                if alias.asname
                else cst.helpers.get_full_name_for_node_or_raise(alias.name)
            )
            self.imported.add(bound)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.used.add(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in FORBIDDEN_CALLS:
            self.problems.append(f"call of `{node.func.value}` is not allowed")
