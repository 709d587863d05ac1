"""The libcst check rejects anything outside the allowed shape of generated code; model.py puts
the layers right after Config and names each dim with one einsum letter."""

import re
from pathlib import Path

import pytest

from axdsl.build import committed_outputs
from axdsl.codegen.emit import import_block
from axdsl.codegen.format import GeneratedCodeError, check_generated
from axdsl.codegen.names import EinsumLetters, dim_label
from axdsl.ir.expr import BinOp, Binary, Field


@pytest.mark.parametrize(
    "source, problem",
    [
        ("import axdsl\nprint(axdsl)\n", "must not import axdsl"),
        ("import requests\nrequests.get\n", "not allowed"),
        ("import jax\n", "unused import `jax`"),
        ("from os import *\n", "star imports"),
        ("eval('1')\n", "call of `eval`"),
        ("exec('x = 1')\n", "call of `exec`"),
        ("def f(:\n", "does not parse"),
    ],
)
def test_check_generated_rejects(source, problem):
    with pytest.raises(GeneratedCodeError, match=problem):
        check_generated(source, "model.py")


def test_check_generated_accepts_plain_jax():
    check_generated("import jax\nimport jax.numpy as jnp\nx = jnp.ones(3) + jax.numpy.zeros(3)\n", "m.py")


# ----------------------------------------------------------------------------- structure of model.py
ROOT = Path(__file__).resolve().parent.parent


def test_einsum_letters_are_one_per_dim_for_the_whole_model():
    letters = EinsumLetters()
    assert [letters[k] for k in ("B", "S", "dim", "heads", "head_dim", "kv_heads")] == list("bsdhek")
    assert letters["heads"] == "h" and letters["head_dim"] == "e"  # the same letter on every later use
    assert letters["dim'"] not in "bsdhek"  # a second dim of one einsum gets its own letter
    assert letters.legend().startswith("b=B s=S d=dim h=heads e=head_dim k=kv_heads")


def test_dims_are_named_as_config_names_them():
    assert dim_label("hidden", Field("ffn")) == "ffn"
    assert dim_label("head_dim", Binary(BinOp.FLOORDIV, Field("dim"), Field("heads"))) == "head_dim"
    assert dim_label("B") == "B"


def test_imports_come_in_isort_order_and_unknown_ones_fail():
    assert import_block({"import jax", "import zlib", "import dataclasses"}) == (
        "import dataclasses\nimport zlib\n\nimport jax")
    with pytest.raises(AssertionError, match="no place"):
        import_block({"import os"})


@pytest.mark.parametrize("out", [o for o, _, _ in committed_outputs()], ids=str)
def test_model_reads_config_then_layers_with_one_letter_per_dim(out):
    text = (ROOT / out / "model.py").read_text()
    lines = text.splitlines()
    config = next(i for i, line in enumerate(lines) if line.startswith("class Config"))
    configs_end = next(i for i, line in enumerate(lines) if i > config and line == "}")
    first_def = next(i for i, line in enumerate(lines) if line.startswith("def "))
    between = [line for line in lines[configs_end + 1 : first_def] if line.strip()]
    assert lines[config:configs_end] and first_def > configs_end
    assert all(line.startswith("#") for line in between), "the first layer follows CONFIGS directly"
    assert first_def < text.index("def param_table")
    layers = text[text.index("# ---") : text.index("def param_table")]
    legend = re.search(r"# Einsum letters, one per dim in every layer function[^:]*: (.*)", layers)
    meaning = dict(pair.split("=") for pair in legend.group(1).split()) if legend else {}
    assert len(set(meaning.values())) == len(meaning), "one letter per dim"
    for spec in re.findall(r'einsum\("([a-z.,>-]+)"', layers):
        assert set(spec) - set(".,->") <= set(meaning), spec


# ----------------------------------------------------------------------------- plan_functions
NORMS = """import "std/layers.axl"

layer Net(dim: int) {
  child norm = RMSNorm(dim = dim)
  child out_norm = RMSNorm(dim = dim, eps = 1e-5)
  forward(x: [B, S, dim]) -> [B, S, dim] {
    return out_norm(norm(x))
  }
}

model net = Net { dim = 16 }
"""


def _norms_module(tmp_path, monkeypatch):
    from axdsl.pipeline import compile_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "norms.axl").write_text(NORMS)
    return compile_spec(Path("norms.axl"))


def test_model_prints_the_functions_plan_functions_records(tmp_path, monkeypatch):
    from axdsl.codegen.emit import emit_model

    module = _norms_module(tmp_path, monkeypatch)
    plan = {f.name: f.paths for f in module.models[0].functions}
    assert plan == {"rms_norm": ("/norm",), "rms_norm_2": ("/out_norm",), "net": ("/",)}
    source = emit_model(module).model
    assert "def rms_norm_2(" in source
    assert re.search(r"rms_norm_2\(cfg, params\[.out_norm.\]", source)
    assert re.search(r"(?<!_)rms_norm\(cfg, params\[.norm.\]", source)


def test_a_plan_sharing_instances_that_print_differently_is_a_compiler_bug(
    tmp_path, monkeypatch
):
    from dataclasses import replace

    from axdsl.codegen.emit import emit_model
    from axdsl.errors import InternalError
    from axdsl.ir.nodes import SharedFunction

    module = _norms_module(tmp_path, monkeypatch)
    model = module.models[0]
    wrong = (SharedFunction("rms_norm", "RMSNorm", ("/norm", "/out_norm")), model.functions[-1])
    module = replace(module, models=(replace(model, functions=wrong),))
    with pytest.raises(InternalError, match="bodies differ"):
        emit_model(module)


def test_model_copies_the_helpers_plan_functions_records_and_checks_them(tmp_path, monkeypatch):
    from dataclasses import replace

    from axdsl.codegen.emit import emit_model
    from axdsl.errors import InternalError

    module = _norms_module(tmp_path, monkeypatch)
    assert module.helpers == ()  # norms call no generated helper
    assert emit_model(module).kernels is None  # no kernels.py
    with pytest.raises(InternalError, match="recorded helpers \\['dense'\\]"):
        emit_model(replace(module, helpers=("dense",)))


def test_the_model_file_stays_at_nanogpt_scale_and_its_helpers_import_by_name():
    """llama3_8b's gpu-h100 model.py (fp8 matmuls, fused loss, KV cache, sharding) stays within
    500 lines: the helpers it calls live in kernels.py beside it, imported by name, and kernels.py
    reads nothing of model.py."""
    out = ROOT / "generated" / "llama3_8b" / "gpu_h100"
    model, kernels = (out / "model.py").read_text(), (out / "kernels.py").read_text()
    assert len(model.splitlines()) <= 500
    assert "from .kernels import apply_rope, cached_attention, fp8_einsum, fused_cross_entropy\n" in model
    assert "def fp8_einsum(" in kernels and "def fp8_einsum(" not in model
    assert "from ." not in kernels and "cfg." not in kernels
