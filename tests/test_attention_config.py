"""The configurable `attention` primitive: soft-capping, an explicit scale, a value head dim of
its own (MLA), an additive bias, a boolean mask and segment ids for packed sequences.

Each feature is built for cpu from a tiny spec, run, and compared with a numpy reference in
float32. Kernel selection is checked on gpu-h100 / tpu-v5e: a kernel that cannot run a feature
is passed over with its reason in the generated comment (as tests/test_kernels.py checks for
dtypes and head dims), and the choice of kernel never changes what the CPU computes.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.build import build_files
from axdsl.errors import CompileError
from tests.targets_util import import_model, kernels_of

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


def _load(tmp_path: Path, name: str, source: str, kernel: str = "xla"):
    """Build `source` for cpu with attention `kernel` and import its model.py."""
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source + f'target "cpu" {{ kernels(attention = {kernel}) }}\n', encoding="utf-8")
    files = build_files(spec, "cpu")
    module = import_model(files, tmp_path / "out" / name)
    module.SOURCE = files["model.py"] + files.get("kernels.py", "")
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
    assert f"{spec}:3:41: error: `softcap` must be >= 0, got -1.0" in text  # at the value
    assert "hint: 0 means no soft-capping" in text


# ----------------------------------------------------------------------------- v head dim
@pytest.mark.parametrize("causal", [True, False])
def test_v_head_dim_of_its_own_matches_numpy(tmp_path, causal):
    m = _load(tmp_path, "mla", _layer(f"attention(q, k, v, causal = {str(causal).lower()})", v_head_dim=12))
    assert _has(m.SOURCE, f"einsum_attention(q, k, v, causal={causal})")
    q, k, v = _qkv(v_head_dim=12)
    got = _run(m, q, k, v)
    assert got.shape == (B, S, HEADS, 12)
    np.testing.assert_allclose(got, reference(q, k, v, causal=causal), atol=TOL, rtol=TOL)


def test_v_head_dim_counts_in_the_flops(tmp_path):
    from axdsl.analysis.flops import model_flops
    from axdsl.pipeline import compile_spec

    def flops(vd: int) -> int:
        spec = tmp_path / f"f{vd}.axl"
        spec.write_text(_layer("attention(q, k, v, causal = false)", v_head_dim=vd), encoding="utf-8")
        return model_flops(compile_spec(spec, "cpu").models[0], seq=S).attention

    # 2 x keys x heads x (head_dim + v_head_dim) per token
    assert flops(HEAD_DIM) == 2 * S * HEADS * (HEAD_DIM + HEAD_DIM)
    assert flops(24) == 2 * S * HEADS * (HEAD_DIM + 24)


STD_ATTENTION = """\
import "std/transformer.axl"

model attn = Attention {
  dim = 16  heads = 4  kv_heads = 2  head_dim = 8  rope = false  SETTINGS
}
"""


def _std_attention(x, p, scale=None, softcap=0.0):
    """std Attention (rope off) in numpy: projections, biases, attention, output projection."""
    q = np.einsum("bsd,dhe->bshe", x, p["wq"]) + p.get("bq", 0)
    k = np.einsum("bsd,dke->bske", x, p["wk"]) + p.get("bk", 0)
    v = np.einsum("bsd,dke->bske", x, p["wv"]) + p.get("bv", 0)
    o = reference(q, k, v, causal=True, scale=scale, softcap=softcap)
    return np.einsum("bshe,hed->bsd", o, p["wo"]) + p.get("bo", 0)


def _random_params(params, seed: int = 8):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=w.shape).astype(np.float32) * 0.5 for name, w in params.items()}


def test_std_attention_with_v_head_dim_and_qwen2_biases(tmp_path):
    """v_head_dim 12 (not head_dim 8) sizes wv, bv and wo; out_bias = false drops bo only."""
    m = _load(tmp_path, "std_mla", STD_ATTENTION.replace(
        "SETTINGS", "v_head_dim = 12  bias = true  out_bias = false  softcap = 3.0  scale = 0.3"))
    cfg = m.Config()
    params = jax.jit(m.init_params, static_argnums=0)(cfg, jax.random.key(0))
    assert params["wv"].shape == (16, 2, 12) and params["wo"].shape == (4, 12, 16)
    assert params["bv"].shape == (2, 12) and "bq" in params and "bo" not in params
    params = _random_params(params)
    x = np.random.default_rng(9).normal(size=(B, S, 16)).astype(np.float32)
    got = np.asarray(jax.jit(m.forward, static_argnums=0)(cfg, params, x))
    np.testing.assert_allclose(got, _std_attention(x, params, scale=0.3, softcap=3.0), atol=TOL, rtol=TOL)


def test_std_attention_defaults_keep_the_plain_call(tmp_path):
    m = _load(tmp_path, "std_plain", STD_ATTENTION.replace("SETTINGS", "bias = true"))
    assert _has(m.SOURCE, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")')
    cfg = m.Config()
    params = _random_params(jax.jit(m.init_params, static_argnums=0)(cfg, jax.random.key(0)))
    assert "bo" in params  # out_bias defaults to bias
    x = np.random.default_rng(10).normal(size=(B, S, 16)).astype(np.float32)
    got = np.asarray(jax.jit(m.forward, static_argnums=0)(cfg, params, x))
    np.testing.assert_allclose(got, _std_attention(x, params), atol=TOL, rtol=TOL)


# ----------------------------------------------------------------------------- bias, mask
MASKED = _layer("attention(q, k, v, causal = true, bias = bias, mask = mask)",
                extra_args=", bias: [B, heads, S, S], mask: [1, 1, S, S]")


def _bias_and_mask(seed: int = 3):
    rng = np.random.default_rng(seed)
    bias = rng.normal(size=(B, HEADS, S, S)).astype(np.float32)
    mask = rng.random((1, 1, S, S)) > 0.3
    mask[..., np.arange(S), np.arange(S)] = True  # every query keeps itself
    return bias, mask


def test_bias_and_mask_match_numpy(tmp_path):
    m = _load(tmp_path, "masked", MASKED)
    assert _has(m.SOURCE, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, bias=bias, mask=mask, '
                          'implementation="xla")')
    q, k, v = _qkv()
    bias, mask = _bias_and_mask()
    want = reference(q, k, v, causal=True, bias=bias, mask=mask)
    np.testing.assert_allclose(_run(m, q, k, v, bias, mask), want, atol=TOL, rtol=TOL)
    assert np.abs(want - reference(q, k, v, causal=True)).max() > 0.05


def test_bias_and_mask_with_softcap_and_v_head_dim(tmp_path):
    source = _layer("attention(q, k, v, causal = true, softcap = 2.0, bias = bias, mask = mask)",
                    v_head_dim=4, extra_args=", bias: [B, heads, S, S], mask: [1, 1, S, S]")
    m = _load(tmp_path, "masked_mla", source)
    assert _has(m.SOURCE, "einsum_attention(q, k, v, causal=True, softcap=2.0, bias=bias, mask=mask)")
    q, k, v = _qkv(v_head_dim=4)
    bias, mask = _bias_and_mask()
    want = reference(q, k, v, causal=True, softcap=2.0, bias=bias, mask=mask)
    np.testing.assert_allclose(_run(m, q, k, v, bias, mask), want, atol=TOL, rtol=TOL)


def test_a_bias_broadcast_over_batch_and_heads(tmp_path):
    """ALiBi-style: one [1, 1, S, S] bias for every batch row and head."""
    m = _load(tmp_path, "alibi", _layer("attention(q, k, v, causal = true, bias = bias)",
                                        extra_args=", bias: [1, 1, S, S]"))
    q, k, v = _qkv()
    pos = np.arange(S)
    bias = (-0.5 * np.abs(pos[:, None] - pos[None, :]))[None, None].astype(np.float32)
    want = reference(q, k, v, causal=True, bias=bias)
    np.testing.assert_allclose(_run(m, q, k, v, bias), want, atol=TOL, rtol=TOL)


# ----------------------------------------------------------------------------- segment ids
SEGMENTS = _layer("attention(q, k, v, causal = true, segment_ids = seg)", extra_args=", seg: [B, S]")


def test_segment_ids_keep_attention_inside_each_packed_sequence(tmp_path):
    m = _load(tmp_path, "packed", SEGMENTS)
    assert "same_segment = seg[:, None, :, None] == seg[:, None, None, :]" in m.SOURCE
    q, k, v = _qkv()
    seg = np.array([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    got = _run(m, q, k, v, seg)
    np.testing.assert_allclose(got, reference(q, k, v, causal=True, segment_ids=seg), atol=TOL, rtol=TOL)
    # The second packed sequence computes what it computes alone.
    alone = reference(q[:1, 3:7], k[:1, 3:7], v[:1, 3:7], causal=True)
    np.testing.assert_allclose(got[:1, 3:7], alone, atol=TOL, rtol=TOL)


def test_segment_ids_and_a_mask_together(tmp_path):
    m = _load(tmp_path, "packed_masked", _layer(
        "attention(q, k, v, causal = true, softcap = 3.0, mask = mask, segment_ids = seg)",
        extra_args=", mask: [1, 1, S, S], seg: [B, S]"))
    assert _has(m.SOURCE, "mask=mask & same_segment")
    q, k, v = _qkv()
    _, mask = _bias_and_mask()
    seg = np.array([[0, 0, 1, 1, 1, 1, 2, 2], [5, 5, 5, 5, 7, 7, 7, 7]], np.int32)
    want = reference(q, k, v, causal=True, softcap=3.0, mask=mask, segment_ids=seg)
    np.testing.assert_allclose(_run(m, q, k, v, mask, seg), want, atol=TOL, rtol=TOL)


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
    """Softcap and scale: XLA's einsum_attention on cpu and gpu-h100 (cuDNN passed over), splash
    on tpu-v5e (in interpret mode here); all three files compute the same logits on the CPU."""
    spec = _lm(tmp_path, "same", "softcap = 5.0, scale = 0.2")
    outputs, calls = [], {"cpu": "einsum_attention(", "gpu-h100-8": "einsum_attention(",
                          "tpu-v5e-8": "splash_attention(q, k, v"}
    for target, call in calls.items():
        files = build_files(spec, target)
        assert call in files["model.py"], target
        module = import_model(files, tmp_path / target)
        if hasattr(kernels_of(module), "PALLAS_INTERPRET"):
            kernels_of(module).PALLAS_INTERPRET = True
        cfg = module.Config(dtype=jnp.float32)
        params = jax.jit(module.init_params, static_argnums=0)(cfg, jax.random.key(0))
        params["blocks"]["attn"] = jax.tree.map(lambda w: w * 8.0, params["blocks"]["attn"])
        tokens = jax.random.randint(jax.random.key(1), (2, cfg.max_seq), 0, cfg.vocab)
        outputs.append(np.asarray(jax.jit(module.forward, static_argnums=0)(cfg, params, tokens)))
    assert np.abs(outputs[0]).max() > 0.1
    for got in outputs[1:]:
        np.testing.assert_allclose(got, outputs[0], atol=1e-4, rtol=1e-4)


# A layer-level spec in bf16 with head_dim 128, so that cuDNN and splash could run its plain call.
WIDE = """\
layer Attn(heads: int = 2, hd: int = 128, vd: int = VD, dtype: dtype = bf16, max_seq: int = 128) {
  forward(q: [B, S, heads, hd], k: [B, S, heads, hd], v: [B, S, heads, vd]EXTRA) -> [B, S, heads, vd] {
    return CALL
  }
}
model m = Attn {}
"""


def _wide(tmp_path: Path, call: str, vd: int = 128, extra: str = "") -> Path:
    spec = tmp_path / "wide.axl"
    spec.write_text(WIDE.replace("VD", str(vd)).replace("EXTRA", extra).replace("CALL", call),
                    encoding="utf-8")
    return spec


def test_v_head_dim_rules_out_cudnn_with_the_reason(tmp_path):
    spec = _wide(tmp_path, "attention(q, k, v, causal = true)", vd=32)
    gpu = build_files(spec, "gpu-h100-8")["model.py"]
    assert ("# attention: cudnn not used: v_head_dim 32 differs from head_dim 128; "
            "jax.nn.dot_product_attention needs v shaped like k") in gpu
    assert _has(gpu, "einsum_attention(q, k, v, causal=True)")
    tpu = build_files(spec, "tpu-v5e-8")["model.py"]
    assert "# attention: splash not used: m has v_head_dim 32; splash needs a multiple of 64" in tpu


def test_bias_and_segment_ids_run_on_cudnn_as_a_dense_bias(tmp_path):
    spec = _wide(tmp_path, "attention(q, k, v, causal = true, bias = bias, segment_ids = seg)",
                 extra=", bias: [1, heads, S, S], seg: [B, S]")
    gpu = build_files(spec, "gpu-h100-8")["model.py"]
    assert _has(gpu, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, bias=bias, mask=same_segment, '
                     'implementation="cudnn")')
    tpu = build_files(spec, "tpu-v5e-8")["model.py"]
    assert "# attention: splash not used: an additive bias; splash attention has no bias input" in tpu


def test_a_key_padding_mask_rules_out_cudnn(tmp_path):
    """A [B, 1, 1, S] mask broadcasts in XLA, but jax's cuDNN bias must span [S, S]."""
    spec = _wide(tmp_path, "attention(q, k, v, causal = true, mask = keep)", extra=", keep: [B, 1, 1, S]")
    gpu = build_files(spec, "gpu-h100-8")["model.py"]
    assert "# attention: cudnn not used: a mask that is not [..., S, S]" in gpu
    assert _has(gpu, 'jax.nn.dot_product_attention(q, k, v, is_causal=True, mask=keep, implementation="xla")')


def test_cudnn_choice_computes_what_cpu_does(tmp_path, monkeypatch):
    """The gpu file's cuDNN call, run with cuDNN swapped for XLA, matches the cpu file and numpy."""
    spec = _wide(tmp_path, "attention(q, k, v, causal = true, scale = 0.05, bias = bias, segment_ids = seg)",
                 extra=", bias: [1, heads, S, S], seg: [B, S]")
    original, implementations = jax.nn.dot_product_attention, []

    def xla_for_cudnn(*args, implementation=None, **kwargs):
        implementations.append(implementation)
        return original(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", xla_for_cudnn)
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(2, 8, 2, 128)).astype(np.float32) for _ in range(3))
    bias = rng.normal(size=(1, 2, 8, 8)).astype(np.float32)
    seg = np.array([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    want = reference(q, k, v, causal=True, scale=0.05, bias=bias, segment_ids=seg)
    for target in ("cpu", "gpu-h100-8"):
        module = import_model(build_files(spec, target), tmp_path / target)
        np.testing.assert_allclose(_run(module, q, k, v, bias, seg), want, atol=TOL, rtol=TOL)
    assert implementations == ["xla", "cudnn"]


# ----------------------------------------------------------------------------- splash
def _tpu_module(tmp_path: Path, spec: Path, name: str):
    files = build_files(spec, "tpu-v5e-8")
    return import_model(files, tmp_path / name), files["model.py"] + files["kernels.py"]


@pytest.mark.parametrize("mesh", [False, True], ids=["no_mesh", "mesh"])
def test_splash_runs_scale_softcap_and_segment_ids(tmp_path, monkeypatch, mesh):
    """The TPU file picks splash for all three and, in interpret mode on the CPU, matches numpy."""
    spec = _wide(tmp_path, "attention(q, k, v, causal = true, scale = 0.05, softcap = 2.0, segment_ids = seg)",
                 extra=", seg: [B, S]")
    tpu, text = _tpu_module(tmp_path, spec, f"segments_{mesh}")
    assert _has(text, "splash_attention(q, k, v, causal=True, window=None, scale=0.05, softcap=2.0, "
                      "segment_ids=seg)")
    assert "# attention:" not in text
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(2, 128, 2, 128)).astype(np.float32) for _ in range(3))
    seg = np.repeat(np.array([[0, 1, 2, 3], [0, 0, 1, 1]], np.int32), 32, axis=1)
    want = reference(q, k, v, causal=True, scale=0.05, softcap=2.0, segment_ids=seg)
    if mesh:
        with jax.set_mesh(tpu.make_mesh()):
            got = _run(tpu, q, k, v, seg)
    else:
        got = _run(tpu, q, k, v, seg)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_splash_runs_a_v_head_dim_of_its_own(tmp_path, monkeypatch):
    spec = _wide(tmp_path, "attention(q, k, v, causal = true)", vd=256)
    tpu, text = _tpu_module(tmp_path, spec, "mla")
    assert _has(text, "splash_attention(q, k, v, causal=True, window=None)")
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    rng = np.random.default_rng(6)
    q, k = (rng.normal(size=(1, 128, 2, 128)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(1, 128, 2, 256)).astype(np.float32)
    got = _run(tpu, q, k, v)
    assert got.shape == (1, 128, 2, 256)
    np.testing.assert_allclose(got, reference(q, k, v, causal=True), atol=1e-4, rtol=1e-4)


def test_splash_gradients_with_softcap_and_segment_ids_match_the_cpu_file(tmp_path, monkeypatch):
    spec = _wide(tmp_path, "attention(q, k, v, causal = true, softcap = 2.0, segment_ids = seg)",
                 extra=", seg: [B, S]")
    tpu, _ = _tpu_module(tmp_path, spec, "grads")
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    cpu = _load(tmp_path, "grads_cpu", spec.read_text())
    assert "einsum_attention(" in cpu.SOURCE  # XLA on cpu, splash on tpu
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(1, 128, 2, 128)).astype(np.float32) for _ in range(3))
    w = rng.normal(size=(1, 128, 2, 128)).astype(np.float32)
    seg = np.repeat(np.array([[0, 1]], np.int32), 64, axis=1)

    def grads(module):
        loss = lambda q, k, v: jnp.sum(module.forward(module.Config(), {}, q, k, v, seg) * w)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    for got, want in zip(grads(tpu), grads(cpu)):
        np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=1e-4)


def test_memory_counts_the_v_head_dim_and_the_softcap_residuals(tmp_path):
    from axdsl.analysis.memory import estimate_memory
    from axdsl.ir import nodes as ir
    from axdsl.pipeline import compile_spec

    def detail(attn: str) -> dict[str, int]:
        spec = _lm(tmp_path, f"mem_{len(attn)}", attn)
        spec.write_text(spec.read_text().replace("dtype = bf16", "dtype = f32"))
        est = estimate_memory(compile_spec(spec, "cpu"), "small", batch=2, seq=128,
                              remat=ir.RematPolicy("none"))
        return {k.rsplit("/blocks/attn: ", 1)[-1]: v for k, v in est.detail.items() if "/blocks/attn: " in k}

    plain, wide = detail("head_dim = 128"), detail("head_dim = 128, v_head_dim = 256, softcap = 20.0")
    assert plain["attention"] == 2 * 128 * 2 * 128 * 4  # [B, S, heads, v_head_dim] in f32
    assert wide["attention"] == 2 * plain["attention"]
    assert "attention soft-capped logits" not in plain
    scores = 2 * 2 * 128 * 128 * 4  # [B, heads, S, S] in f32, kept twice more for tanh's backward
    assert wide["attention soft-capped logits"] == wide["attention soft-cap slope"] == scores


# ----------------------------------------------------------------------------- the vjp kernel
@pytest.mark.parametrize("call, extra, v_head_dim", [
    ("attention(q, k, v, causal = true)", "", HEAD_DIM),
    ("attention(q, k, v, causal = false, scale = 0.3)", "", HEAD_DIM),
    ("attention(q, k, v, causal = true, window = 3)", "", 4),
    ("attention(q, k, v, causal = true, mask = mask, segment_ids = seg)", ", mask: [1, 1, S, S], seg: [B, S]",
     HEAD_DIM),
    ("attention(q, k, v, causal = false, mask = mask)", ", mask: [1, 1, 1, S]", HEAD_DIM),
])
def test_vjp_kernel_values_and_gradients_match_xla(tmp_path, call, extra, v_head_dim):
    """cpu's first attention kernel, `vjp` (a hand-written backward), gives XLA's values and the
    gradients autodiff gives XLA's call: GQA, causal or not, scale, window, its own v head dim,
    mask and segment ids; with all queries in one block, and (causal or windowed) in blocks of 2
    that skip the keys no query of theirs sees."""
    source = _layer(call, v_head_dim=v_head_dim, extra_args=extra)
    fast, slow = _load(tmp_path, "vjp", source, "vjp"), _load(tmp_path, "xla", source, "xla")
    assert "vjp_attention(q, k, v, causal=" in fast.SOURCE and "vjp_attention" not in slow.SOURCE
    q, k, v = _qkv(v_head_dim)
    _, mask = _bias_and_mask()
    seg = np.array([[0, 0, 0, 1, 1, 1, 1, 2], [4, 4, 4, 4, 4, 4, 4, 4]], np.int32)
    rest = ((mask, seg) if "seg" in call else (mask[:, :, :1],)) if "mask" in call else ()
    d_out = np.random.default_rng(7).normal(size=(B, S, HEADS, v_head_dim)).astype(np.float32)

    def value_and_grads(m):
        f = lambda q, k, v: jnp.sum(m.forward(m.Config(), {}, q, k, v, *rest) * d_out)  # noqa: E731
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)

    want, want_grads = value_and_grads(slow)
    kernels = kernels_of(fast)
    for block in (kernels.VJP_QUERY_BLOCK, 2):  # one block of all S queries; 4 blocks of 2 queries
        kernels.VJP_QUERY_BLOCK = block
        got, got_grads = value_and_grads(fast)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
        for g, w in zip(got_grads, want_grads):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=1e-4)


def test_vjp_blocks_cover_what_each_query_sees_and_nothing_above_the_diagonal():
    """The helper's query blocks (the rule aot's memory model runs too): at most 8, covering every
    query, each over exactly the keys its queries see."""
    from axdsl.primitives import attention_kernels as ak

    from axdsl.codegen.helpers import source_text

    # the generated helper copies the rule aot imports (axdsl/kernels/vjp_blocks.py): one home
    assert ak.VJP_ATTENTION[0].module == "vjp_blocks"
    assert source_text(ak.VJP_ATTENTION).startswith("VJP_QUERY_BLOCK = 128")
    for seq in (8, 100, 128, 384, 512, 1000, 8192):
        for causal, window in ((True, None), (False, None), (True, 3), (False, 200), (True, 4096)):
            blocks = ak.vjp_blocks(seq, seq, causal, window)
            assert len(blocks) <= 8 and blocks[0][0] == 0 and blocks[-1][1] == seq
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            for start, end, first, last in blocks:  # every key a query of the block sees, no fewer
                assert first == (max(0, start - window + 1) if window else 0)
                assert last == (end if causal else seq)
    assert ak.vjp_blocks(512, 512, True, None) == [(0, 128, 0, 128), (128, 256, 0, 256), (256, 384, 0, 384),
                                                  (384, 512, 0, 512)]
    assert ak.vjp_blocks(16, 32, True, None) == [(0, 16, 0, 32)]  # cross attention: one block
    assert ak.vjp_kept_keys(512, True, None) == 320  # 10 of 16 (128 x 128) tiles kept
    assert ak.vjp_kept_keys(512, False, None) == 512


def test_vjp_kernel_passes_over_soft_caps_and_biases(tmp_path):
    """Soft-capping and an additive bias have no written-out backward: cpu falls back to xla."""
    m = _load(tmp_path, "capped", _layer("attention(q, k, v, causal = true, softcap = 2.0)"), "auto")
    assert "vjp_attention" not in m.SOURCE and "vjp not used: softcap 2.0" in m.SOURCE
    with pytest.raises(CompileError, match="the `vjp` attention kernel cannot run this attention"):
        _load(tmp_path, "biased", _layer("attention(q, k, v, causal = true, bias = bias)",
                                         extra_args=", bias: [1, 1, S, S]"), "vjp")
