"""Per-pass IR fixtures (tests/ir/<pass>.test) and the IR verifier after every pass.

One fixture file per pass of `axdsl.pipeline.PASS_NAMES`, in the style of mypyc's test-data
files and sqlglot's per-rule optimizer fixtures. Text before the first case describes the file;
then each case is a tiny spec and what this one pass does to it:

    [case repeat_stacks_params]        a name, unique in the file (`[case NAME target=cpu-8]`
    # one line saying what it shows     picks a target; the default is cpu)
    layer Step(dim: int) { ... }       the spec, compiled as NAME.axl in a temporary directory
    model stack = Stack { dim = 4 }
    [out]
    @@ model stack > /steps : Step x3  the printed IR before and after the pass, changed lines
    -      param w: [dim=4, ...] ...    only: `-` before, `+` after, each hunk headed by where
    +      param w: [layers=3] + ...    it sits (model and instance, or the module section)

`resolve` (AST -> IR) has no IR before it, so its [out] is the whole printed IR. A pass that
rejects the spec shows its diagnostics (`NAME.axl:line:col: error: ...`, the line, a caret and
the hint); one that changes nothing shows `(no change)`. A case whose spec fails before reaching
its pass fails the test, and the verifier runs after every pass of every case.

Update: `AXDSL_UPDATE_GOLDEN=1 python -m pytest tests/test_ir_passes.py` rewrites every [out]
block from the compiler's output and keeps the cases; read the diff before committing (mypyc:
"carefully inspect the diff"). The tests use only compile_spec, print_module and verify.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from axdsl.errors import CompileError
from axdsl.ir.printer import print_module
from axdsl.passes.verify import InvalidIR, verify
from axdsl.pipeline import PASS_NAMES, compile_spec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "ir"
SPECS = sorted(p.name for p in (ROOT / "specs").glob("*.axl"))
UPDATE = os.environ.get("AXDSL_UPDATE_GOLDEN") == "1"
NO_CHANGE = "(no change)"


# ---------------------------------------------------------------------------- the fixture format
@dataclass(frozen=True)
class Case:
    """One `[case]`: a spec compiled for `target`, and the expected output of one pass."""

    name: str
    target: str
    spec: str
    out: str


CASE_LINE = re.compile(r"\[case (?P<name>[A-Za-z0-9_]+)(?: target=(?P<target>[A-Za-z0-9_*-]+))?\]")


def parse_fixture(text: str) -> tuple[str, list[Case]]:
    """Split a fixture file into its preamble and cases; [out] ends a spec, [case] a case."""
    preamble, cases, current = [], [], None
    for line in text.splitlines():
        m = CASE_LINE.fullmatch(line)
        if m:
            current = {"name": m["name"], "target": m["target"] or "cpu", "spec": [], "out": None}
            cases.append(current)
        elif current is None:
            preamble.append(line)
        elif line == "[out]" and current["out"] is None:
            current["out"] = []
        else:
            current["spec" if current["out"] is None else "out"].append(line)
    return _join(preamble), [Case(c["name"], c["target"], _join(c["spec"]), _join(c["out"] or []))
                             for c in cases]


def render_fixture(preamble: str, cases: list[Case]) -> str:
    """The inverse of parse_fixture, used by the update path."""
    blocks = [preamble] if preamble else []
    for c in cases:
        head = f"[case {c.name}" + (f" target={c.target}" if c.target != "cpu" else "") + "]"
        blocks.append(f"{head}\n{c.spec}\n[out]\n{c.out}")
    return "\n\n".join(blocks) + "\n"


def _join(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")


def fixture_cases() -> list[tuple[str, str]]:
    out = []
    for path in sorted(FIXTURES.glob("*.test")):
        out.extend((path.stem, c.name) for c in parse_fixture(path.read_text())[1])
    return out


def load_case(pass_name: str, case_name: str) -> Case:
    cases = parse_fixture((FIXTURES / f"{pass_name}.test").read_text())[1]
    return next(c for c in cases if c.name == case_name)


# ---------------------------------------------------------------------------- running one case
def compile_case(case: Case, workdir: Path, pass_name: str):
    """Compile the case as workdir/NAME.axl up to `pass_name` (cwd must be workdir, so spans read
    `NAME.axl:3:5`); return the printed IR after each pass run, and the error that stopped it.

    The verifier checks the IR after every pass of a case that compiles. A case that shows a
    pass rejecting bad input skips it: that input may break the very invariant the pass reports
    to the user (check rejects the axes/dims mismatch the verifier would flag as a compiler bug).
    """
    path = workdir / f"{case.name}.axl"
    path.write_text(case.spec + "\n")
    modules = {}  # pass name -> the module after it
    try:
        compile_spec(Path(path.name), target=case.target, after=pass_name,
                     on_pass=modules.__setitem__)
    except CompileError as exc:
        return {name: print_module(m) for name, m in modules.items()}, exc
    for module in modules.values():
        verify(module)
    return {name: print_module(m) for name, m in modules.items()}, None


def pass_output(case: Case, pass_name: str, workdir: Path) -> str:
    """What `pass_name` does to the case: its diagnostics, its IR changes, or resolve's whole IR."""
    printed, error = compile_case(case, workdir, pass_name)
    previous = PASS_NAMES[PASS_NAMES.index(pass_name) - 1] if pass_name != PASS_NAMES[0] else None
    if error is not None:
        failed_in = PASS_NAMES[len(printed)]
        assert failed_in == pass_name, f"fails in {failed_in}, not {pass_name}:\n{error}"
        return str(error)
    if previous is None:
        return printed[pass_name].rstrip("\n")
    return changed_lines(printed[previous], printed[pass_name])


# A line that opens a part of the printed module: a model, an instance, or a module section.
SECTION = re.compile(r"(model |train$|target |schedule |config |training$)|\s+/\S* : ")


def changed_lines(before: str, after: str) -> str:
    """The lines the pass changed, hunk by hunk, each under `@@ where it sits`.

    A hunk is a run of changed lines within one section, `-` lines (before) then `+` lines
    (after); unchanged lines are left out, and a change that spans sections is split.
    """
    a, b = _body(before), _body(after)
    hunks: list[tuple[str, list[str]]] = []
    contiguous = False
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            contiguous = False
            continue
        sections: dict[str, list[str]] = {}
        for i in range(i1, i2):
            sections.setdefault(_where(a, i, i1), []).append("-" + a[i])
        for j in range(j1, j2):
            sections.setdefault(_where(b, j, j1), []).append("+" + b[j])
        for where, lines in sections.items():
            if contiguous and hunks[-1][0] == where:
                hunks[-1][1].extend(lines)
            else:
                hunks.append((where, lines))
            contiguous = True
    return "\n".join(f"@@ {where}\n" + "\n".join(lines) for where, lines in hunks) or NO_CHANGE


def _body(printed: str) -> list[str]:
    """The printed module without its `# spec ...` / `# passes: ...` header."""
    lines = printed.splitlines()
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return lines


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _where(lines: list[str], index: int, start: int) -> str:
    """Where lines[index], in a change that begins at lines[start], sits: its model and nearest
    enclosing section outside the change ("module" for a change at the top level)."""
    section = _enclosing(lines, index)
    while section is not None and section >= start:  # a section the change adds or rewrites
        section = _enclosing(lines, section)
    if section is None:
        return "module"
    model = next(line for line in reversed(lines[:section + 1]) if _indent(line) == 0)
    inner = lines[section].strip()
    return inner if model == inner or not model.startswith("model ") else f"{model} > {inner}"


def _enclosing(lines: list[str], index: int) -> int | None:
    """The index of the section line that encloses lines[index], None at the top level."""
    depth = _indent(lines[index])
    return next((i for i in range(index - 1, -1, -1)
                 if _indent(lines[i]) < depth and SECTION.match(lines[i])), None)


# ---------------------------------------------------------------------------- the fixture tests
@pytest.mark.parametrize("pass_name, case_name", fixture_cases())
def test_pass_fixture(pass_name, case_name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    case = load_case(pass_name, case_name)
    actual = pass_output(case, pass_name, tmp_path)
    fixture = FIXTURES / f"{pass_name}.test"
    if UPDATE and actual != case.out:
        preamble, cases = parse_fixture(fixture.read_text())
        cases = [replace(c, out=actual) if c.name == case_name else c for c in cases]
        fixture.write_text(render_fixture(preamble, cases))
        return
    diff = "\n".join(difflib.unified_diff(case.out.splitlines(), actual.splitlines(),
                                          f"{fixture.name} [case {case_name}]", "actual",
                                          lineterm=""))
    assert actual == case.out, diff


@pytest.mark.parametrize("pass_name, case_name", fixture_cases())
def test_fixture_spec_verifies_through_every_pass(pass_name, case_name, tmp_path, monkeypatch):
    """A case is valid input for every later pass too, unless it shows its own pass's errors."""
    monkeypatch.chdir(tmp_path)
    printed, error = compile_case(load_case(pass_name, case_name), tmp_path, PASS_NAMES[-1])
    reached = PASS_NAMES[len(printed)] if error is not None else None
    assert reached in (None, pass_name), f"fails in {reached}:\n{error}"


def test_every_pass_has_fixtures():
    files = {p.stem for p in FIXTURES.glob("*.test")}
    unpaired = files ^ set(PASS_NAMES)
    assert not unpaired, f"a fixture file without a pass, or a pass without one: {unpaired}"
    for name in PASS_NAMES:
        cases = parse_fixture((FIXTURES / f"{name}.test").read_text())[1]
        names = [c.name for c in cases]
        assert len(names) >= 2 and len(set(names)) == len(names), f"{name}.test: {names}"
        assert all(c.spec and c.out for c in cases), f"{name}.test: a case lacks a spec or [out]"


@pytest.mark.parametrize("pass_name", PASS_NAMES)
def test_fixture_file_round_trips(pass_name):
    """The update path rewrites a file through parse and render; nothing else may change."""
    text = (FIXTURES / f"{pass_name}.test").read_text()
    assert render_fixture(*parse_fixture(text)) == text


def test_changed_lines_names_where_each_change_sits():
    before = "model m\n  / : Net\n    dim: int = 4\n    /mlp : MLP\n      param w: [dim=4]\n"
    after = ("model m\n  / : Net\n    dim: int = 4\n    /mlp : MLP x2\n"
             "      param w: [layers=2] + [dim=4]\nschedule cpu\n  mesh(data = -1)\n")
    assert changed_lines(before, after) == (
        "@@ model m > / : Net\n-    /mlp : MLP\n-      param w: [dim=4]\n"
        "+    /mlp : MLP x2\n+      param w: [layers=2] + [dim=4]\n"
        "@@ module\n+schedule cpu\n+  mesh(data = -1)")
    only_params = changed_lines(before, after.replace(" x2", ""))
    assert only_params.splitlines()[0] == "@@ model m > /mlp : MLP"
    assert changed_lines(before, before) == NO_CHANGE


# ---------------------------------------------------------------------------- the verifier
@pytest.mark.parametrize("spec", SPECS)
def test_verifier_passes_after_every_pass(spec, in_root):
    seen = []
    compile_spec(Path("specs") / spec, on_pass=lambda name, m: (verify(m), seen.append(name)))
    assert tuple(seen) == PASS_NAMES


def _compile_fixture_spec(pass_name: str, case_name: str, workdir: Path):
    case = load_case(pass_name, case_name)
    path = workdir / f"{case.name}.axl"
    path.write_text(case.spec + "\n")
    return compile_spec(path, target=case.target)


def test_verifier_catches_broken_ir(tmp_path):
    module = _compile_fixture_spec("stack_repeats", "repeat_stacks_params", tmp_path)
    root = module.models[0].root
    steps = root.children[0]
    broken_steps = replace(steps, params=tuple(replace(p, stack=()) for p in steps.params))
    broken = replace(module, models=(replace(module.models[0], root=replace(root, children=(broken_steps,) + root.children[1:])),))
    with pytest.raises(InvalidIR, match="stack dims"):
        verify(broken)


def test_stacked_params_and_inheritance(tmp_path):
    module = _compile_fixture_spec("stack_repeats", "repeat_stacks_params", tmp_path)
    w = module.models[0].root.child("steps").param("w")
    assert [d.size for d in w.full_dims] == [3, 4, 4] and w.full_axes == ("layers", "embed", "mlp")
    net = _compile_fixture_spec("resolve", "layer_valued_hparam_and_inheritance", tmp_path)
    net = net.models[0].root
    mlp = net.child("mlp")
    origin = mlp.hparam("hidden").origin
    assert mlp.layer == "MLP" and origin.kind.value == "inherited" and str(origin) == "inherited from /"
    assert mlp.hparam("act").value.value == "relu"


def test_verifier_catches_a_sharding_that_uses_a_mesh_axis_twice(tmp_path):
    module = _compile_fixture_spec("quantize_matmuls", "layers_pattern_picks_paths", tmp_path)
    root = module.models[0].root
    bad = replace(root, params=tuple(replace(p, sharding=(("fsdp",), ("fsdp",))) for p in root.params))
    broken = replace(module, models=(replace(module.models[0], root=bad),))
    with pytest.raises(InvalidIR, match="uses a mesh axis twice"):
        verify(broken)
