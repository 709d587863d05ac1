"""Per-pass IR fixtures: tests/ir/<case>.axl is printed after every pass and compared with
tests/ir/<case>.<pass>.ir. The verifier runs after every pass, on every spec and fixture.

Update path: `AXDSL_UPDATE_GOLDEN=1 pytest tests/test_ir_passes.py`, then read the diff.
"""

import difflib
import os
from pathlib import Path

import pytest

from axdsl.ir.printer import print_module
from axdsl.ir.verify import InvalidIR, verify
from axdsl.pipeline import PASS_NAMES, compile_spec

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted(p.stem for p in (ROOT / "tests" / "ir").glob("*.axl"))
SPECS = sorted(p.name for p in (ROOT / "specs").glob("*.axl"))
UPDATE = os.environ.get("AXDSL_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pass_name", PASS_NAMES)
def test_ir_after_pass_matches_fixture(case, pass_name, in_root):
    module = compile_spec(Path("tests/ir") / f"{case}.axl", after=pass_name)
    verify(module)
    text = print_module(module)
    expected_path = ROOT / "tests" / "ir" / f"{case}.{pass_name}.ir"
    if UPDATE:
        expected_path.write_text(text)
    expected = expected_path.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                        str(expected_path), "actual"))
    assert text == expected, diff


@pytest.mark.parametrize("spec", SPECS)
def test_verifier_passes_after_every_pass(spec, in_root):
    seen = []
    compile_spec(Path("specs") / spec, on_pass=lambda name, m: (verify(m), seen.append(name)))
    assert tuple(seen) == PASS_NAMES


def test_verifier_catches_broken_ir(in_root):
    from dataclasses import replace

    module = compile_spec(Path("tests/ir/repeat.axl"))
    root = module.models[0].root
    steps = root.children[0]
    broken_steps = replace(steps, params=tuple(replace(p, stack=()) for p in steps.params))
    broken = replace(module, models=(replace(module.models[0], root=replace(root, children=(broken_steps,) + root.children[1:])),))
    with pytest.raises(InvalidIR, match="stack dims"):
        verify(broken)


def test_stacked_params_and_inheritance(in_root):
    module = compile_spec(Path("tests/ir/repeat.axl"))
    w = module.models[0].root.child("steps").param("w")
    assert [d.size for d in w.full_dims] == [3, 4, 4] and w.full_axes == ("layers", "embed", "mlp")
    net = compile_spec(Path("tests/ir/inherit.axl")).models[0].root
    mlp = net.child("mlp")
    origin = mlp.hparam("hidden").origin
    assert mlp.layer == "MLP" and origin.kind.value == "inherited" and str(origin) == "inherited from /"
    assert mlp.hparam("act").value.value == "relu"


def test_verifier_catches_a_sharding_that_uses_a_mesh_axis_twice(in_root):
    from dataclasses import replace

    module = compile_spec(Path("tests/ir/schedule.axl"))
    root = module.models[0].root
    bad = replace(root, params=tuple(replace(p, sharding=(("fsdp",), ("fsdp",))) for p in root.params))
    broken = replace(module, models=(replace(module.models[0], root=bad),))
    with pytest.raises(InvalidIR, match="uses a mesh axis twice"):
        verify(broken)
