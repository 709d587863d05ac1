"""End-to-end language features: static conditions on dtypes, dropout with explicit rng."""


import jax
import jax.numpy as jnp
import pytest

from axdsl.build import build_files, write_atomic
from axdsl.pipeline import compile_spec
from axdsl.runs import import_output


def _load(tmp_path, name, source):
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source)
    out = tmp_path / "out" / name
    write_atomic(out, build_files(spec, "cpu"))
    return import_output(out)


def test_dtype_equality_in_a_static_condition(tmp_path):
    (tmp_path / "eq.axl").write_text(
        "layer A(d: int, t: dtype = bf16, ok: bool = t == bf16) {\n"
        "  param w: [d] axes(embed)\n"
        "  forward(x: [B, d]) -> [B, d] { if ok { return x * w } else { return x } }\n"
        "}\nmodel m = A { d = 4 }\n"
    )
    root = compile_spec(tmp_path / "eq.axl").models[0].root
    assert root.hparam("ok").value.value is True


@pytest.mark.parametrize("rate", [0.5])
def test_dropout_is_identity_without_rng_and_random_with_it(tmp_path, rate):
    m = _load(tmp_path, "drop", 'import "std/transformer.axl"\n'
              "model drop = DecoderLM { vocab = 32 dim = 16 layers = 2 heads = 2 ffn = 32 dtype = f32 "
              f"block = Block(dropout = {rate}) }}\n")
    cfg = m.Config()
    params = m.init_params(cfg, jax.random.key(0))
    tokens = jnp.ones((2, 8), jnp.int32)
    a, b = m.forward(cfg, params, tokens), m.forward(cfg, params, tokens)
    assert bool((a == b).all())
    c = m.forward(cfg, params, tokens, rng=jax.random.key(1))
    d = m.forward(cfg, params, tokens, rng=jax.random.key(2))
    assert float(jnp.abs(a - c).max()) > 0 and float(jnp.abs(c - d).max()) > 0
