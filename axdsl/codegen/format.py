"""Format generated code with black and check it with libcst before anything is written.

The check enforces the allowed shape of generated code: it parses; it imports only jax, numpy,
optax, orbax, tqdm, tensorboardX (issue 13: TensorBoard event files), the standard library
and sibling generated files (never axdsl); every import is used; and it calls
none of the builtins that run or load arbitrary code. A failure is a compiler bug.
"""

from __future__ import annotations

import sys

import black
import libcst as cst

# tokenizers (HF's, issue 13) is imported by runtime.py only inside the functions for text with a
# tokenizer; tensorboardX writes the TensorBoard event files.
ALLOWED_THIRD_PARTY = {"jax", "numpy", "optax", "orbax", "tqdm", "tokenizers", "tensorboardX"}
FORBIDDEN_CALLS = {"exec", "eval", "compile", "__import__", "globals", "locals", "breakpoint",
                   "setattr", "delattr", "input"}
BLACK_MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY311})


class GeneratedCodeError(Exception):
    """Generated code broke a rule: always a compiler bug, never a user mistake."""


def format_code(source: str) -> str:
    try:
        return black.format_str(source, mode=BLACK_MODE)
    except black.InvalidInput as exc:  # a compiler bug: show the offending source
        raise GeneratedCodeError(f"generated code does not parse: {exc}\n{source}") from None


def check_generated(source: str, path: str) -> None:
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise GeneratedCodeError(f"{path}: generated code does not parse: {exc}") from None
    visitor = _Checker()
    tree.visit(visitor)
    problems = list(visitor.problems)
    for name in sorted(visitor.imported):
        if name not in visitor.used:
            problems.append(f"unused import `{name}`")
    if problems:
        raise GeneratedCodeError(f"{path}: " + "; ".join(problems))


class _Checker(cst.CSTVisitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.imported: set[str] = set()
        self.used: set[str] = set()

    def _module_ok(self, dotted: str) -> None:
        top = dotted.split(".")[0]
        if top == "axdsl":
            self.problems.append("generated code must not import axdsl")
        elif top not in ALLOWED_THIRD_PARTY and top not in sys.stdlib_module_names and top != "__future__":
            self.problems.append(f"import of `{dotted}` is not allowed")

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            dotted = cst.helpers.get_full_name_for_node(alias.name)
            self._module_ok(dotted)
            bound = alias.asname.name.value if alias.asname else dotted.split(".")[0]
            self.imported.add(bound)
        return False  # names inside an import statement are not uses

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        dotted = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
        if not node.relative:  # `from .model import ...`: a sibling generated file
            self._module_ok(dotted)
        if dotted == "__future__":
            return False
        if isinstance(node.names, cst.ImportStar):
            self.problems.append("star imports are not allowed")
            return False
        for alias in node.names:
            self.imported.add(alias.asname.name.value if alias.asname else alias.name.value)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.used.add(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in FORBIDDEN_CALLS:
            self.problems.append(f"call of `{node.func.value}` is not allowed")
