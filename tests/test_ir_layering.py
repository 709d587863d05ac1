"""The IR is the lowest layer of the compiler: irbuild, passes, primitives and codegen build on
it, and it imports none of them (issue 35: "ir imports primitives" was a cycle in the making)."""

from __future__ import annotations

import ast
from pathlib import Path

IR = Path(__file__).resolve().parent.parent / "axdsl" / "ir"
# What axdsl/ir may import besides itself: diagnostics' spans, and the target profiles (data).
BELOW_IR = ("axdsl.errors", "axdsl.targets")


def _axdsl_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("axdsl")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("axdsl"):
            out.add(node.module if node.module != "axdsl" else f"axdsl.{node.names[0].name}")
    return out


def test_the_ir_imports_nothing_above_it():
    for path in sorted(IR.glob("*.py")):
        above = {
            m
            for m in _axdsl_imports(path)
            if not m.startswith("axdsl.ir") and not m.startswith(BELOW_IR)
        }
        assert not above, f"axdsl/ir/{path.name} imports {sorted(above)}"
