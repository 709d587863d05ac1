"""The IR's typed views: a field a later stage fills reads as its plain type once that stage ran,
and as an InternalError (a compiler bug, not a user error) before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from axdsl.errors import InternalError, Span
from axdsl.ir import nodes as ir
from axdsl.ir.sections import DirectiveArg
from axdsl.pipeline import compile_spec

SPEC = Path(__file__).resolve().parent.parent / "specs" / "tiny_llama.axl"


@pytest.fixture(scope="module")
def checked() -> ir.Module:
    return compile_spec(SPEC, "cpu", after="infer_shapes")


@pytest.fixture(scope="module")
def compiled() -> ir.Module:
    return compile_spec(SPEC, "gpu-h100-8")


def test_schedule_and_train_settings_read_after_their_passes(checked, compiled):
    with pytest.raises(InternalError, match="before configure_target"):
        _ = checked.target
    with pytest.raises(InternalError, match="before configure_train"):
        _ = checked.train
    assert compiled.target is compiled.schedule and compiled.target.chips == 8
    assert compiled.train is compiled.train_settings and compiled.train.get("batch") >= 1


def test_an_instance_reads_its_forward_children_and_params(checked):
    root = checked.models[0].root
    assert root.fwd is root.forward
    with pytest.raises(InternalError, match="forward of /"):
        _ = replace(root, forward=None).fwd
    child = root.children[0]
    assert root.expect_child(child.name) is child
    with pytest.raises(InternalError, match="child `nope` of /"):
        root.expect_child("nope")
    owner = next(i for i in root.walk() if i.params)
    assert owner.expect_param(owner.params[0].name) is owner.params[0]
    with pytest.raises(InternalError, match="parameter `nope`"):
        owner.expect_param("nope")


def test_inferred_types_and_static_sizes(checked):
    root = checked.models[0].root
    result = root.fwd.body[-1].value
    assert ir.tensor_type(result).dims[-1].size == 256  # [B, S, vocab]
    with pytest.raises(InternalError, match="expected a tensor type"):
        ir.tensor_type(ir.Lit(1, result.span))
    param = next(p for i in root.walk() for p in i.params)
    assert [ir.static_size(d) for d in param.dims] == [d.size for d in param.dims]
    with pytest.raises(InternalError, match="size of dim B"):
        ir.static_size(ir.Dim("B"))


def test_a_default_is_reported_at_the_spec(checked):
    line = Span("x.axl", 3, 1)
    assert checked.report_at(line) is line
    assert checked.train_block is None
    assert checked.report_at(None) == checked.models[0].span


def test_a_keyword_argument_has_a_name():
    span = Span("x.axl", 1, 1)
    assert DirectiveArg("rank", 8, span).key == "rank"
    with pytest.raises(InternalError):
        _ = DirectiveArg(None, 8, span).key
