"""The configurable `attention` primitive: soft-capping, an explicit scale, a value head dim of
its own (MLA), an additive bias, a boolean mask and segment ids for packed sequences.

Each feature is built for cpu from a tiny spec, run, and compared with a numpy reference in
float32. Kernel selection is checked on gpu-h100 / tpu-v5e: a kernel that cannot run a feature
is passed over with its reason in the generated comment (as tests/test_kernels.py checks for
dtypes and head dims), and the choice of kernel never changes what the CPU computes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.build import build_files
from axdsl.errors import CompileError

TOL = 1e-5
B, S, HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 8


def _layer(call: str, v_head_dim: int = HEAD_DIM, extra_args: str = "") -> str:
    """A layer whose forward is one attention call on q, k, v [B, S, heads, head_dim]."""
    return (
        f"layer Attn(heads: int = {HEADS}, kv_heads: int = {KV_HEADS}, hd: int = {HEAD_DIM}, "
        f"vd: int = {v_head_dim}) {{\n"
        "  forward(q: [B, S, heads, hd], k: [B, S, kv_heads, hd], v: [B, S, kv_heads, vd]"
        f"{extra_args}) -> [B, S, heads, vd] {{\n"
        f"    return {call}\n"
        "  }\n"
        "}\n"
        "model m = Attn {}\n"
    )


def _load(tmp_path: Path, name: str, source: str):
    """Build `source` for cpu and import its model.py."""
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source, encoding="utf-8")
    out = tmp_path / "out" / name
    out.mkdir(parents=True)
    text = build_files(spec, "cpu")["model.py"]
    (out / "model.py").write_text(text, encoding="utf-8")
    mod_spec = importlib.util.spec_from_file_location(f"attn_cfg_{name}", out / "model.py")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module
    mod_spec.loader.exec_module(module)
    module.SOURCE = text
    return module


def _has(source: str, code: str) -> bool:
    """`code` appears in `source`, whatever line breaks the formatter put into it."""
    return "".join(code.split()) in "".join(source.split())


def _qkv(v_head_dim: int = HEAD_DIM, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, S, HEADS, HEAD_DIM)).astype(np.float32) * 2
    k = rng.normal(size=(B, S, KV_HEADS, HEAD_DIM)).astype(np.float32) * 2
    v = rng.normal(size=(B, S, KV_HEADS, v_head_dim)).astype(np.float32)
    return q, k, v


def reference(q, k, v, causal=False, window=0, scale=None, softcap=0.0, bias=None, mask=None,
              segment_ids=None):
    """Attention in numpy, float64: query head h reads kv head h // (heads // kv_heads)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    logits = np.einsum("bqhd,bshd->bhqs", q, k) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap:
        logits = softcap * np.tanh(logits / softcap)
    if bias is not None:
        logits = logits + bias
    seq = q.shape[1]
    pos_q, pos_k = np.arange(seq)[:, None], np.arange(seq)[None, :]
    keep = np.ones((1, 1, seq, seq), bool)
    if causal:
        keep = keep & (pos_k <= pos_q)
    if window:
        keep = keep & (pos_k > pos_q - window)
    if mask is not None:
        keep = keep & mask
    if segment_ids is not None:
        keep = keep & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    logits = np.where(keep, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqs,bshd->bqhd", probs, v)


def _run(module, *args):
    return np.asarray(jax.jit(module.forward, static_argnums=0)(module.Config(), {}, *args))


# ----------------------------------------------------------------------------- softcap, scale
@pytest.mark.parametrize("causal", [True, False])
def test_softcap_matches_numpy(tmp_path, causal):
    m = _load(tmp_path, "softcap", _layer(
        f"attention(q, k, v, causal = {str(causal).lower()}, softcap = 2.0)"))
    assert _has(m.SOURCE, "einsum_attention(q, k, v, causal=") and "softcap=2.0" in m.SOURCE
    q, k, v = _qkv()
    got = _run(m, q, k, v)
    want = reference(q, k, v, causal=causal, softcap=2.0)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
    uncapped = reference(q, k, v, causal=causal)
    assert np.abs(want - uncapped).max() > 0.05  # the cap matters for these logits


def test_explicit_scale_matches_numpy(tmp_path):
    m = _load(tmp_path, "scale", _layer("attention(q, k, v, causal = true, scale = 0.7)"))
    assert _has(m.SOURCE, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=0.7, implementation="xla")')
    q, k, v = _qkv()
    np.testing.assert_allclose(_run(m, q, k, v), reference(q, k, v, causal=True, scale=0.7),
                               atol=TOL, rtol=TOL)


def test_softcap_scale_and_window_together(tmp_path):
    m = _load(tmp_path, "all", _layer(
        "attention(q, k, v, causal = true, window = 3, scale = 0.25, softcap = 1.5)"))
    q, k, v = _qkv()
    want = reference(q, k, v, causal=True, window=3, scale=0.25, softcap=1.5)
    np.testing.assert_allclose(_run(m, q, k, v), want, atol=TOL, rtol=TOL)


def test_zero_scale_and_softcap_keep_the_default_call(tmp_path):
    m = _load(tmp_path, "default", _layer("attention(q, k, v, causal = true, scale = 0.0, softcap = 0.0)"))
    assert _has(m.SOURCE, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")')
    assert "einsum_attention" not in m.SOURCE
    q, k, v = _qkv()
    np.testing.assert_allclose(_run(m, q, k, v), reference(q, k, v, causal=True), atol=TOL, rtol=TOL)


def test_negative_softcap_is_a_located_error(tmp_path):
    spec = tmp_path / "neg.axl"
    spec.write_text(_layer("attention(q, k, v, softcap = -1.0)"), encoding="utf-8")
    with pytest.raises(CompileError) as info:
        build_files(spec, "cpu")
    text = info.value.render()
    assert f"{spec}:3:12: error: `softcap` must be >= 0, got -1.0" in text
    assert "hint: 0 means no soft-capping" in text


# ----------------------------------------------------------------------------- kernels
# head_dim 128, bf16, max_seq 128: cuDNN and splash both run the plain call (tests/test_kernels.py).
LM = """\
import "std/transformer.axl"

model small = DecoderLM {
  vocab = 256  dim = 256  layers = 2  heads = 2  kv_heads = 1  ffn = 512  max_seq = 128
  block = Block(attn = Attention(ATTN))
  dtype = bf16
}

target "*" { quantize(none) }
"""


def _lm(tmp_path: Path, name: str, attn: str) -> Path:
    spec = tmp_path / f"{name}.axl"
    spec.write_text(LM.replace("ATTN", attn), encoding="utf-8")
    return spec


def test_softcap_rules_out_cudnn_with_the_reason(tmp_path):
    gpu = build_files(_lm(tmp_path, "capped", "softcap = 50.0"), "gpu-h100-8")["model.py"]
    assert "# attention: cudnn not used: softcap 50.0: soft-capping is not supported by cuDNN" in gpu
    assert _has(gpu, "einsum_attention(q, k, v, causal=True, softcap=50.0)")
    assert 'implementation="cudnn"' not in gpu


def test_explicit_scale_keeps_cudnn(tmp_path):
    gpu = build_files(_lm(tmp_path, "scaled", "scale = 0.125"), "gpu-h100-8")["model.py"]
    assert _has(gpu, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=0.125, implementation="cudnn")')
    assert "# attention:" not in gpu


def test_forcing_cudnn_with_softcap_is_a_located_error(tmp_path):
    spec = _lm(tmp_path, "forced", "softcap = 50.0")
    spec.write_text(spec.read_text().replace('target "*" {', 'target "*" {\n  kernels(attention = cudnn)\n '))
    with pytest.raises(CompileError) as info:
        build_files(spec, "gpu-h100-8")
    assert ("the `cudnn` attention kernel cannot run this attention: softcap 50.0: soft-capping is "
            "not supported by cuDNN") in info.value.render()


def test_kernel_choice_does_not_change_cpu_numerics(tmp_path):
    """The gpu file (XLA fallback chosen for softcap) computes on the CPU what the cpu file does."""
    spec = _lm(tmp_path, "same", "softcap = 5.0, scale = 0.2")
    outputs = []
    for target in ("cpu", "gpu-h100-8", "tpu-v5e-8"):
        text = build_files(spec, target)["model.py"]
        path = tmp_path / target / "model.py"
        path.parent.mkdir()
        path.write_text(text, encoding="utf-8")
        mod_spec = importlib.util.spec_from_file_location(f"attn_same_{target.replace('-', '_')}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        cfg = module.Config(dtype=jnp.float32)
        params = jax.jit(module.init_params, static_argnums=0)(cfg, jax.random.key(0))
        params["blocks"]["attn"] = jax.tree.map(lambda w: w * 8.0, params["blocks"]["attn"])
        tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab)
        outputs.append(np.asarray(jax.jit(module.forward, static_argnums=0)(cfg, params, tokens)))
    for got in outputs[1:]:
        np.testing.assert_allclose(got, outputs[0], atol=TOL, rtol=TOL)
