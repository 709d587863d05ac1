"""The `>>>` examples in axdsl's docstrings run, under the README's `python -m pytest -q`.

Every module under axdsl/ whose source holds `>>>` is found here (a new example joins without a
list to edit) and run with doctest from the repository root, so examples may name `specs/...`.
The modules with examples are on the build path, which never imports jax: a fresh interpreter
runs them again and checks that jax stayed out.
"""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules_with_examples() -> list[str]:
    """Dotted names of the axdsl modules whose source contains a `>>>` example."""
    paths = sorted((ROOT / "axdsl").rglob("*.py"))
    return [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths
            if ">>>" in p.read_text(encoding="utf-8")]


MODULES = modules_with_examples()


def run_examples(module_name: str) -> tuple[doctest.TestResults, str]:
    """Run one module's docstring examples; return the counts and doctest's failure report."""
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.append)
    return runner.summarize(verbose=False), "".join(report)


def test_examples_are_found():
    assert "axdsl.analysis.flops" in MODULES


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_pass(module_name, in_root):
    results, report = run_examples(module_name)
    assert results.attempted > 0, f"{module_name} has `>>>` but doctest found no example"
    assert results.failed == 0, report


def test_examples_do_not_import_jax():
    code = ("import sys\n"
            "sys.path.insert(0, 'tests')\n"
            "from test_doctests import MODULES, run_examples\n"
            "failed = sum(run_examples(m)[0].failed for m in MODULES)\n"
            "print(failed, 'jax' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"], done.stdout + done.stderr
