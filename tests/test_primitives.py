"""The primitive registry: each primitive is one entry, and adding one is a one-module change.

The last test copies the compiler, adds a single new module under axdsl/primitives/ (a
`softsign` primitive with its signature, emitter, helper function and memory rule) and shows that
a spec can then call it: it checks, builds, gets FLOPs and a memory estimate, and the generated
model ships the helper and computes softsign, without any other file of the compiler changing.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from axdsl import primitives
from axdsl.passes.verify import InvalidIR, verify
from axdsl.pipeline import compile_spec

ROOT = Path(__file__).resolve().parent.parent


def test_every_callable_primitive_has_a_signature_emitter_and_shape_rule():
    names = primitives.callable_names()
    assert {"attention", "einsum", "moe", "rope", "silu", "embed"} <= set(names)
    for name in names:
        prim = primitives.get(name)
        assert prim.name == name and callable(prim.emit) and callable(prim.shape)
        assert prim.signature.doc, name
    assert primitives.get("quantized").internal and "quantized" not in names


def test_flags_replace_name_checks():
    assert primitives.get("moe").aux_loss and primitives.get("dropout").uses_rng
    assert primitives.get("attention").has_kernels and primitives.get("einsum").has_kernels
    assert not primitives.get("softmax").has_kernels
    assert primitives.get("embed").gathers and primitives.get("transpose").see_through


def test_helpers_and_kernels_live_on_their_primitive():
    from axdsl.targets import profiles

    owners = {h.name: n for n, p in primitives.REGISTRY.items() for h in p.helpers}
    assert owners["apply_rope"] == "rope" and owners["splash_attention"] == "attention"
    assert {owners["moe.route"], owners["moe.run.capacity"], owners["fp8_einsum"]} == {"moe", "quantized"}
    # the one helper no primitive owns: a pipelined model's main repeat (plan_pipeline)
    assert set(primitives.HELPERS) == set(owners) | {primitives.PIPELINE_HELPER.name}
    for profile in profiles().values():  # every kernel a profile prefers is one its primitive has
        for op, kernels in profile.kernels.items():
            rule = primitives.get(op).kernels
            assert rule is not None and set(kernels) <= set(rule.names), (profile.name, op, kernels)
            assert kernels[-1] == rule.fallback, (profile.name, op)


def test_verifier_rejects_a_primitive_call_that_does_not_match_its_entry(in_root):
    from dataclasses import replace

    from axdsl.ir.rewrite import map_forward

    module = compile_spec(Path("specs/tiny_llama.axl"))

    def break_rope(e):
        return replace(e, attrs=e.attrs + (("speed", 1),)) if getattr(e, "name", "") == "rope" else e

    root = module.models[0].root
    blocks = root.child("blocks")
    attn = blocks.child("attn")
    bad_attn = replace(attn, forward=map_forward(attn.forward, break_rope))
    bad_blocks = replace(blocks, children=tuple(bad_attn if c.name == "attn" else c for c in blocks.children))
    bad_root = replace(root, children=tuple(bad_blocks if c.name == "blocks" else c for c in root.children))
    broken = replace(module, models=(replace(module.models[0], root=bad_root),) + module.models[1:])
    with pytest.raises(InvalidIR, match="`rope` has attributes"):
        verify(broken)


SOFTSIGN = '''
"""softsign(x) = x / (1 + |x|), elementwise, through a helper function copied into the model."""

from axdsl.primitives.base import Helper, Primitive, Saves, Signature, saves_memory

SOFTSIGN = \'\'\'def softsign(x: jax.Array) -> jax.Array:
    """x / (1 + |x|), elementwise."""
    return x / (1 + jnp.abs(x))\'\'\'


def _emit(ctx, prim, args, precs):
    ctx.use_helper("softsign")
    return f"softsign({args[0]})"


PRIMITIVES = (
    Primitive("softsign", Signature(("x",), doc="elementwise x / (1 + |x|)"), emit=_emit,
              helpers=(Helper("softsign", SOFTSIGN),), memory=saves_memory(Saves(input=True))),
)
'''

SPEC = '''
import "std/transformer.axl"

layer SoftMLP(dim: int, hidden: int) {
  param w_up: [dim, hidden] axes(embed, mlp) init normal(0.02)
  param w_down: [hidden, dim] axes(mlp, embed) init normal(0.02)
  forward(x: [B, S, dim]) -> [B, S, dim] {
    return softsign(x @ w_up) @ w_down
  }
}

model toy = DecoderLM {
  vocab = 64  dim = 16  layers = 2  heads = 2  kv_heads = 2  ffn = 32  max_seq = 32
  block = Block(mlp = SoftMLP(hidden = ffn))
}
'''

CHECK = '''
import sys
from pathlib import Path
from axdsl.build import build_files
from axdsl.analysis.flops import model_flops
from axdsl.analysis.memory import estimate_memory
from axdsl.pipeline import compile_spec

spec = Path(sys.argv[1])
module = compile_spec(spec)
files = build_files(spec, "cpu")
assert "def softsign(" in files["kernels.py"] and "softsign(dense(x, " in files["model.py"], files["model.py"]
flops = model_flops(module.models[0], seq=16)
assert flops.matmul > 0
est = estimate_memory(module, "toy")
assert any("softsign" in k for k in est.detail), est.detail
out = Path(sys.argv[2])
out.mkdir()
(out / "__init__.py").write_text("")
(out / "model.py").write_text(files["model.py"])
(out / "kernels.py").write_text(files["kernels.py"])
print("ok")
'''

RUN = '''
import sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, sys.argv[1])
import toy_out.model as m
cfg = m.Config()
params = m.init_params(cfg, jax.random.key(0))
tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
logits = m.forward(cfg, params, tokens)
assert logits.shape == (2, 8, 64) and bool(jnp.all(jnp.isfinite(logits)))
x = jnp.linspace(-3, 3, 7)
np.testing.assert_allclose(m.softsign(x), x / (1 + jnp.abs(x)), rtol=1e-6)
print("ran")
'''


def test_adding_a_primitive_is_one_new_module(tmp_path):
    copy = tmp_path / "repo"
    for name in ("axdsl", "grammar", "templates"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "axdsl" / "primitives" / "softsign.py").write_text(SOFTSIGN)
    # The only difference between the copy and the compiler is the new module.
    cmp = filecmp.dircmp(ROOT / "axdsl", copy / "axdsl", ignore=["__pycache__"])
    assert _differences(cmp) == ["primitives/softsign.py"]
    spec = tmp_path / "toy.axl"
    spec.write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(copy), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", CHECK, str(spec), str(tmp_path / "toy_out")],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr
    run = subprocess.run([sys.executable, "-c", RUN, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0 and "ran" in run.stdout, run.stderr
    # Without the module, the same spec is a located error, not a crash.
    without = subprocess.run([sys.executable, "-m", "axdsl", "check", str(spec)],
                             env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, cwd=tmp_path)
    assert without.returncode == 1 and "unknown function `softsign`" in without.stderr


def _differences(cmp: filecmp.dircmp, prefix: str = "") -> list[str]:
    out = [prefix + n for n in cmp.left_only + cmp.right_only + cmp.diff_files]
    for name, sub in cmp.subdirs.items():
        out += _differences(sub, f"{prefix}{name}/")
    return sorted(out)

