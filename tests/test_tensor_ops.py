"""Tensor operations (docs/language.md "Tensor operations"): each op in a tiny spec, built for cpu,
run, and compared in float32 with numpy; their shape rules and memory rules."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest

from axdsl.build import build_files, write_atomic

RNG = np.random.default_rng(0)


def _load(tmp_path, name: str, source: str):
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source)
    out = tmp_path / "out" / name
    files = build_files(spec, "cpu")
    write_atomic(out, files)
    mod_spec = importlib.util.spec_from_file_location(f"gen_ops_{name}", out / "model.py")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module
    mod_spec.loader.exec_module(module)
    module.SOURCE = files["model.py"]
    return module


def _layer(hparams: str, signature: str, body: str, params: str = "", model: str = "") -> str:
    """A spec of one layer `Op` and its model `op`."""
    return (f"layer Op({hparams}) {{\n{params}  forward{signature} {{\n{body}\n  }}\n}}\n"
            f"model op = Op {{ {model} }}\n")


def _run(tmp_path, name: str, source: str, *inputs, params: dict | None = None):
    m = _load(tmp_path, name, source)
    out = m.forward(m.Config(), params or {}, *(np.asarray(x) for x in inputs))
    return np.asarray(out), m


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


_erf = np.vectorize(math.erf)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# ---------------------------------------------------------------- activations and soft-capping
ACTIVATIONS = {
    "softplus(x)": lambda x: np.log1p(np.exp(x)),
    "gelu_exact(x)": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "relu2(x)": lambda x: np.maximum(x, 0) ** 2,
    "softcap(x, cap)": lambda x: 2.5 * np.tanh(x / 2.5),
    "softcap(x, cap = 2 * cap)": lambda x: 5.0 * np.tanh(x / 5.0),
    'activate(x, "gelu_exact")': lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    'activate(x, "gelu_tanh")': _gelu_tanh,
    'activate(x, "gelu")': _gelu_tanh,
    'activate(x, "softplus")': lambda x: np.log1p(np.exp(x)),
    'activate(x, "relu2")': lambda x: np.maximum(x, 0) ** 2,
}


@pytest.mark.parametrize("call", ACTIVATIONS)
def test_activation_matches_numpy(tmp_path, call):
    src = _layer("dim: int, cap: float = 2.5", "(x: [B, S, dim]) -> [B, S, dim]", f"    return {call}",
                 model="dim = 8")
    x = 3 * _x(2, 5, 8)
    out, _ = _run(tmp_path, "act", src, x)
    np.testing.assert_allclose(out, ACTIVATIONS[call](x), rtol=1e-5, atol=1e-5)


def test_gelu_keeps_its_tanh_meaning_and_code(tmp_path):
    src = _layer("dim: int", "(x: [B, dim]) -> [B, dim]", '    return activate(x, "gelu") + gelu_exact(x)',
                 model="dim = 4")
    _, m = _run(tmp_path, "gelu", src, _x(2, 4))
    assert "jax.nn.gelu(x) + jax.nn.gelu(x, approximate=False)" in m.SOURCE


def test_softcap_code_reads_like_the_formula(tmp_path):
    src = _layer("dim: int, cap: float = 30.0", "(x: [B, dim]) -> [B, dim]", "    return softcap(x, cap)",
                 model="dim = 4")
    _, m = _run(tmp_path, "capcode", src, _x(2, 4))
    assert "cfg.cap * jnp.tanh(x / cfg.cap)" in m.SOURCE
