"""`repeat`: scanned blocks with side inputs, layer patterns and prefixes, each checked against an
unrolled float64 numpy reference, and the generated code holding one `jax.lax.scan` per repeat."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.build import build_files
from tests.targets_util import import_generated

CROSS = """\
# A decoder whose repeated block reads the encoder's memory: x is carried, mem is a side input.
layer CrossBlock(dim: int, heads: int, head_dim: int = dim / heads) {
  param wq: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wk: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wv: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.2)
  param wo: [heads, head_dim, dim] axes(heads, head_dim, embed) init normal(0.2)
  param w1: [dim, dim] axes(embed, mlp) init normal(0.2)
  forward(x: [B, S, dim], mem: [B, T, dim]) -> [B, S, dim] {
    o = attention(x @ wq, mem @ wk, mem @ wv, causal = false)
    x = x + einsum("B S heads head_dim, heads head_dim dim -> B S dim", o, wo)
    return x + silu(x @ w1)
  }
}

layer CrossDecoder(dim: int, heads: int, layers: int) {
  child blocks = repeat(layers, CrossBlock())
  forward(x: [B, S, dim], mem: [B, T, dim]) -> [B, S, dim] {
    return blocks(x, mem * 0.5)
  }
}
model cross = CrossDecoder { dim = 8  heads = 2  layers = 3 }
"""


def _build(tmp: Path, name: str, source: str):
    spec = tmp / f"{name}.axl"
    spec.write_text(source, encoding="utf-8")
    model, _ = import_generated(spec, "cpu", tmp)
    return model, build_files(spec, "cpu")["model.py"]


def _np(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _cross_block(p, x, mem):
    q = np.einsum("bsd,dhk->bshk", x, p["wq"])
    k = np.einsum("btd,dhk->bthk", mem, p["wk"])
    v = np.einsum("btd,dhk->bthk", mem, p["wv"])
    w = _softmax(np.einsum("bshk,bthk->bhst", q, k) / np.sqrt(q.shape[-1]))
    o = np.einsum("bhst,bthk->bshk", w, v)
    x = x + np.einsum("bshk,hkd->bsd", o, p["wo"])
    return x + _silu(x @ p["w1"])


def _layer(stacked: dict, i: int) -> dict:
    return jax.tree.map(lambda a: a[i], stacked)


def test_a_repeated_block_takes_a_side_input(tmp_path):
    model, code = _build(tmp_path, "cross", CROSS)
    cfg = model.Config()
    params = model.init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 5, 8), jnp.float32)
    mem = jax.random.normal(jax.random.key(2), (2, 7, 8), jnp.float32)
    got = jax.jit(lambda p, x, m: model.forward(cfg, p, x, m))(params, x, mem)
    ref, p, m = np.asarray(x, np.float64), _np(params), np.asarray(mem, np.float64) * 0.5
    for i in range(3):
        ref = _cross_block(_layer(p["blocks"], i), ref, m)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5)
    assert code.count("jax.lax.scan(") == 1
    assert "blocks_in = mem * 0.5" in code  # computed once, before the scan, and closed over
