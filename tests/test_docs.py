"""docs/language.md: every example marked *Complete* is a whole spec that builds for cpu.

An example is the first ```axl block after a line holding `*Complete`. Each is written to a
temporary file and built (parse, IR, passes, codegen, formatting and checks) exactly as
`axdsl build --target cpu` builds it, so the reference cannot drift from the compiler.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from axdsl.build import build_files

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "language.md"
BLOCK = re.compile(r"^```axl\n(.*?)^```", re.MULTILINE | re.DOTALL)


def complete_examples() -> list[tuple[int, str]]:
    """(line number, source) of every ```axl block that follows a `*Complete` marker."""
    text = DOC.read_text(encoding="utf-8")
    out = []
    for marker in re.finditer(r"\*Complete", text):
        block = BLOCK.search(text, marker.end())
        if block is not None:
            out.append((text.count("\n", 0, block.start()) + 1, block.group(1)))
    return sorted(set(out))


EXAMPLES = complete_examples()


def test_the_reference_has_complete_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("line,source", EXAMPLES, ids=[f"line{n}" for n, _ in EXAMPLES])
def test_complete_example_builds(line, source, tmp_path):
    spec = tmp_path / f"example_{line}.axl"
    spec.write_text(source, encoding="utf-8")
    files = build_files(spec, "cpu", root=tmp_path.name)
    assert "def init_params" in files["model.py"], f"docs/language.md:{line}"
