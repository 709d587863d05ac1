"""Tensor operations (docs/language.md "Tensor operations"): each op in a tiny spec, built for cpu,
run, and compared in float32 with numpy; their shape rules and memory rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from axdsl.analysis.flops import model_flops
from axdsl.build import build_files, write_atomic
from axdsl.pipeline import compile_spec
from axdsl.runs import import_output

RNG = np.random.default_rng(0)


def _load(tmp_path, name: str, source: str):
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source)
    out = tmp_path / "out" / name
    files = build_files(spec, "cpu")
    write_atomic(out, files)
    module = import_output(out)
    module.SOURCE = files["model.py"] + files.get("kernels.py", "")
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


# ---------------------------------------------------------------- slice, concat, pad, stack
HEADS = "heads: int = 2, head_dim: int = 8, rotary_dim: int = 4"
QSIG = "(x: [B, S, heads, head_dim])"


def test_slice_along_a_named_dim(tmp_path):
    src = _layer(HEADS, QSIG + " -> [B, S, heads, rotary_dim]", "    return slice(x, head_dim, 0, rotary_dim)")
    x = _x(2, 3, 2, 8)
    out, m = _run(tmp_path, "slice", src, x)
    np.testing.assert_array_equal(out, x[..., :4])
    assert "x[..., : cfg.rotary_dim]  # [B, S, heads, rotary_dim]" in m.SOURCE


def test_slice_from_a_start_names_the_rest_and_other_dims(tmp_path):
    src = _layer(HEADS, QSIG + " -> [B, S, 1, head_dim - rotary_dim]",
                 "    return slice(slice(x, head_dim, rotary_dim, head_dim), heads, 1, 2)")
    x = _x(2, 3, 2, 8)
    out, m = _run(tmp_path, "slice2", src, x)
    np.testing.assert_array_equal(out, x[:, :, 1:2, 4:])
    assert "return x[..., cfg.rotary_dim :][..., 1:, :]  # [B, S, heads-1, head_dim-rotary_dim]" in m.SOURCE


def test_concat_rebuilds_the_joined_dim(tmp_path):
    body = ("    r = slice(x, head_dim, 0, rotary_dim)\n"
            "    p = slice(x, head_dim, rotary_dim, head_dim)\n"
            "    return concat(p, r, over = head_dim) + concat(r, p, over = rotary_dim)")
    src = _layer(HEADS, QSIG + " -> [B, S, heads, head_dim]", body)
    x = _x(2, 3, 2, 8)
    out, m = _run(tmp_path, "concat", src, x)
    np.testing.assert_allclose(out, np.concatenate([x[..., 4:], x[..., :4]], -1) + x, rtol=1e-6)
    assert "jnp.concatenate([p, r], axis=-1)" in m.SOURCE


def test_concat_along_a_middle_dim(tmp_path):
    src = _layer("dim: int = 4", "(x: [B, 2, dim], y: [B, 3, dim]) -> [B, 5, dim]", "    return concat(x, y, over = 2)")
    x, y = _x(2, 2, 4), _x(2, 3, 4)
    out, _ = _run(tmp_path, "concat2", src, x, y)
    np.testing.assert_array_equal(out, np.concatenate([x, y], 1))


def test_pad_a_named_dim_with_a_constant(tmp_path):
    src = _layer("dim: int = 4, extra: int = 2", "(x: [B, S, dim]) -> [B, S, dim + 3]",
                 "    return pad(x, dim, 1, extra, value = -1.5)")
    x = _x(2, 3, 4)
    out, m = _run(tmp_path, "pad", src, x)
    np.testing.assert_array_equal(out, np.pad(x, [(0, 0), (0, 0), (1, 2)], constant_values=-1.5))
    assert "jnp.pad(x, [(0, 0), (0, 0), (1, cfg.extra)], constant_values=-1.5)" in m.SOURCE


def test_pad_under_leading_dims(tmp_path):
    src = _layer("dim: int = 4", "(x: [..., dim, 3]) -> [..., dim + 2, 3]", "    return pad(x, dim, 2, 0)")
    x = _x(2, 5, 4, 3)
    out, _ = _run(tmp_path, "pad2", src, x)
    np.testing.assert_array_equal(out, np.pad(x, [(0, 0), (0, 0), (2, 0), (0, 0)]))


def test_stack_adds_a_last_dim_of_two(tmp_path):
    src = _layer("dim: int = 4", "(x: [B, dim], y: [B, dim]) -> [B, dim, 2]", "    return stack(x, y)")
    x, y = _x(2, 4), _x(2, 4)
    out, _ = _run(tmp_path, "stack", src, x, y)
    np.testing.assert_array_equal(out, np.stack([x, y], -1))


# ---------------------------------------------------------------- iota, comparisons, where, min, max, cumsum
def test_iota_and_comparisons_make_a_causal_mask(tmp_path):
    body = ("    causal = iota(S, trailing = 1) >= iota(S)\n"
            "    return where(causal, x, -1.0)")
    src = _layer("", "(x: [B, S, S]) -> [B, S, S]", body)
    x = _x(2, 5, 5)
    out, m = _run(tmp_path, "causal", src, x)
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((5, 5), bool)), x, -1.0))
    assert "causal = jnp.arange(x.shape[1], dtype=jnp.int32)[:, None] >= jnp.arange(" in m.SOURCE


COMPARISONS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
               "==": np.equal, "!=": np.not_equal}


@pytest.mark.parametrize("op", COMPARISONS)
def test_comparison_gives_a_bool_tensor_with_broadcasting(tmp_path, op):
    src = _layer("dim: int = 3", "(x: [B, S, dim], y: [S, 1]) -> [B, S, dim]",
                 f"    return where(x {op} y, 1.0, 0.0)")
    x = np.round(_x(2, 4, 3))
    y = np.round(_x(4, 1))
    out, _ = _run(tmp_path, "cmp", src, x, y)
    np.testing.assert_array_equal(out, COMPARISONS[op](x, y).astype(np.float32))


def test_comparison_inside_comparison_is_parenthesized(tmp_path):
    src = _layer("dim: int = 3", "(x: [B, dim], y: [B, dim]) -> [B, dim]",
                 "    return where((x < y) == (y > x), x, y)")
    x, y = _x(2, 3), _x(2, 3)
    out, m = _run(tmp_path, "cmp2", src, x, y)
    np.testing.assert_array_equal(out, x)
    assert "jnp.where((x < y) == (y > x), x, y)" in m.SOURCE


def test_minimum_maximum_and_where_broadcast_named_dims(tmp_path):
    body = "    return minimum(x, y) + maximum(x, 0.25) + where(y > 0.0, x, y)"
    src = _layer("dim: int = 3", "(x: [B, S, dim], y: [S, dim]) -> [B, S, dim]", body)
    x, y = _x(2, 4, 3), _x(4, 3)
    out, _ = _run(tmp_path, "minmax", src, x, y)
    np.testing.assert_allclose(out, np.minimum(x, y) + np.maximum(x, 0.25) + np.where(y > 0, x, y), rtol=1e-6)


def test_cumsum_along_a_named_dim(tmp_path):
    src = _layer("dim: int = 3", "(x: [B, S, dim]) -> [B, S, dim]", "    return cumsum(x, over = S) + cumsum(x, dim)")
    x = _x(2, 4, 3)
    out, _ = _run(tmp_path, "cumsum", src, x)
    np.testing.assert_allclose(out, np.cumsum(x, 1) + np.cumsum(x, 2), rtol=1e-5, atol=1e-6)


def test_segment_positions_restart_at_each_packed_example(tmp_path):
    src = _layer("", "(segments: [B, S]) -> [B, S]", "    return segment_positions(segments)")
    segments = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [5, 0, 0, 0, 0, 0, 0, 0]])
    out, m = _run(tmp_path, "segpos", src, segments)
    expected = [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8)), [0, 0, 1, 2, 3, 4, 5, 6]]
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.int32 and "def segment_positions(" in m.SOURCE
    assert "return segment_positions(segments)" in m.SOURCE


# ---------------------------------------------------------------- conv1d
def _causal_conv(x, w, b=None):
    """out[t] = sum_k w[k] x[t - K + 1 + k], zeros before the start."""
    taps = w.shape[0]
    xp = np.pad(x, [(0, 0), (taps - 1, 0), (0, 0)])
    out = sum(xp[:, k:k + x.shape[1]] * w[k] for k in range(taps))
    return out if b is None else out + b


CONV = ("  param w: [taps, dim] axes(norm, embed)\n"
        "  param b: [dim] axes(embed) init zeros\n")


@pytest.mark.parametrize("bias", [False, True])
def test_conv1d_is_causal_and_depthwise(tmp_path, bias):
    call = "conv1d(x, w, b = b)" if bias else "conv1d(x, w)"
    src = _layer("dim: int = 6, taps: int = 4", "(x: [B, S, dim]) -> [B, S, dim]", f"    return {call}", CONV)
    x, w, b = _x(2, 7, 6), _x(4, 6), _x(6)
    out, m = _run(tmp_path, "conv", src, x, params={"w": w, "b": b})
    np.testing.assert_allclose(out, _causal_conv(x, w, b if bias else None), rtol=1e-5, atol=1e-5)
    assert "def causal_conv1d(" in m.SOURCE
    tail = ', b=params["b"]' if bias else ""
    assert f'return causal_conv1d(x, params["w"]{tail})' in m.SOURCE


def test_conv1d_position_t_does_not_see_the_future(tmp_path):
    src = _layer("dim: int = 3, taps: int = 2", "(x: [B, S, dim]) -> [B, S, dim]", "    return conv1d(x, w)", CONV)
    x = _x(1, 5, 3)
    w = np.ones((2, 3), np.float32)
    later = x.copy()
    later[:, 3:] += 10.0
    a, _ = _run(tmp_path, "conv_a", src, x, params={"w": w})
    b, _ = _run(tmp_path, "conv_b", src, later, params={"w": w})
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=1e-6)


def test_conv1d_flops_count_its_taps(tmp_path):
    spec = tmp_path / "conv.axl"
    spec.write_text(_layer("dim: int = 6, taps: int = 4", "(x: [B, S, dim]) -> [B, S, dim]",
                           "    return conv1d(x, w)", CONV))
    assert model_flops(compile_spec(spec).models[0], seq=8).matmul == 2 * 4 * 6


# ---------------------------------------------------------------- memory rules
# Bytes kept for the backward of `x [2, 8, 6]` f32 (384 bytes) through one op: the output (every
# traced forward keeps its result) plus what jax 0.10 saves (print_saved_residuals).
X = 2 * 8 * 6 * 4
SAVED = {
    "conv1d(x, w)": X + X,  # x (w is a parameter)
    "softcap(x, 2.0)": X + 2 * X,  # tanh's output and x / cap
    "where(x > 0.0, x, 1.0)": X + X // 4,  # the bool condition
    "maximum(x, x * 2.0)": X + 2 * X,  # the two routing weights
    "maximum(x, 0.0)": X + X,  # one: a scalar needs none
    "cumsum(x, over = S)": X,  # linear: nothing
    "concat(slice(x, dim, 0, 2), slice(x, dim, 2, dim), over = dim)": X,
}


@pytest.mark.parametrize("call", SAVED)
def test_memory_rule_keeps_what_jax_saves(tmp_path, call):
    from axdsl.analysis.memory import estimate_memory

    spec = tmp_path / "mem.axl"
    spec.write_text(_layer("dim: int = 6, taps: int = 4", "(x: [B, S, dim]) -> [B, S, dim]", f"    return {call}", CONV))
    assert estimate_memory(compile_spec(spec), batch=2, seq=8).saved == SAVED[call]


# ---------------------------------------------------------------- split and merge
def test_split_a_named_dim_into_two(tmp_path):
    src = _layer("dim: int = 8, heads: int = 2, head_dim: int = dim / heads", "(x: [B, S, dim]) -> [B, S, heads, head_dim]",
                 "    return split(x, dim, [heads, head_dim])", model="")
    x = _x(2, 3, 8)
    out, m = _run(tmp_path, "split", src, x)
    np.testing.assert_array_equal(out, x.reshape(2, 3, 2, 4))
    assert "x.reshape(*x.shape[:-1], cfg.heads, cfg.head_dim)  # [B, S, heads, head_dim]" in m.SOURCE


def test_split_and_merge_a_middle_dim(tmp_path):
    body = ("    y = split(x, dim, [2, 4])\n"
            "    return merge(y * 2.0, 2, 4)")
    src = _layer("dim: int = 8", "(x: [B, dim, 3]) -> [B, dim, 3]", body)
    x = _x(2, 8, 3)
    out, m = _run(tmp_path, "merge", src, x)
    np.testing.assert_array_equal(out, 2 * x)
    assert "y = x.reshape(*x.shape[:-2], 2, 4, *x.shape[-1:])  # [B, 2, 4, 3]" in m.SOURCE
    assert "merge_in = y * 2.0  # [B, 2, 4, 3]\n    return merge_in.reshape(*merge_in.shape[:-3], -1, *merge_in.shape[-1:])" in m.SOURCE


def test_merge_heads_back(tmp_path):
    src = _layer("heads: int = 2, head_dim: int = 4", "(x: [B, S, heads, head_dim]) -> [B, S, heads * head_dim]",
                 "    return merge(x, heads, head_dim)")
    x = _x(2, 3, 2, 4)
    out, m = _run(tmp_path, "merge2", src, x)
    np.testing.assert_array_equal(out, x.reshape(2, 3, 8))
    assert "x.reshape(*x.shape[:-2], -1)  # [B, S, heads*head_dim]" in m.SOURCE
