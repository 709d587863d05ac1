"""Attention kernels: which one each target gets, and that each computes what XLA computes.

The chosen kernel is one call in the generated code (cuDNN through jax.nn.dot_product_attention,
TPU splash through the `splash_attention` helper). On this CPU machine the splash helper runs its
Pallas kernel in interpret mode (`PALLAS_INTERPRET = True` on the imported module); cuDNN cannot
run here, so the GPU file is run with cuDNN swapped for XLA to show that the rest of it computes
the same. The TPU file is also lowered for TPU to see the splash kernel in the StableHLO.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axdsl.build import build_files
from axdsl.errors import CompileError
from tests.targets_util import import_model, kernels_of

# head_dim 128, bf16, max_seq 128: both cuDNN and splash apply. kv_heads 1 exercises GQA/MQA.
SMALL = """\
import "std/transformer.axl"

model small = DecoderLM {
  vocab = 256  dim = 256  layers = 2  heads = 2  kv_heads = 1  ffn = 512  max_seq = 128
  dtype = bf16
}

target "*" { quantize(none) }
"""


def _spec(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.axl"
    path.write_text(text, encoding="utf-8")
    return path


def _variant(**changes: str) -> str:
    """SMALL with some `name = value` settings of the model changed."""
    text = SMALL
    for key, value in changes.items():
        text, n = re.subn(rf"\b{key} = \S+", f"{key} = {value}", text)
        assert n == 1, key
    return text


@functools.cache
def _files(spec: Path, target: str) -> dict[str, str]:
    return build_files(spec, target)


def _source(spec: Path, target: str) -> str:
    """model.py and the kernels.py it imports from, as one text."""
    files = _files(spec, target)
    return files["model.py"] + files.get("kernels.py", "")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The SMALL spec's generated model.py text for cpu, gpu-h100-8 and tpu-v5e-8."""
    tmp = tmp_path_factory.mktemp("kernels")
    spec = _spec(tmp, "small", SMALL)
    return tmp, {t: _source(spec, t) for t in ("cpu", "gpu-h100-8", "tpu-v5e-8")}


@pytest.fixture(scope="module")
def models(built):
    tmp, sources = built
    return {
        t: import_model(_files(tmp / "small.axl", t), tmp / t.replace("-", "_"))
        for t in sources
    }


# ----------------------------------------------------------------------------- which kernel
def test_kernel_per_target(built):
    _, src = built
    assert "vjp_attention(q, k, v, causal=True)" in src["cpu"] and "splash" not in src["cpu"]
    assert 'implementation="cudnn"' in src["gpu-h100-8"] and "splash" not in src["gpu-h100-8"]
    tpu = src["tpu-v5e-8"]
    assert "splash_attention(q, k, v, causal=True, window=None)" in tpu
    assert "implementation=" not in tpu
    assert (
        "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel"
        in tpu
    )
    assert "PALLAS_INTERPRET = False" in tpu
    for text in src.values():
        assert "# attention:" not in text  # nothing was rejected


def test_f32_model_falls_back_with_the_reason(tmp_path):
    spec = _spec(tmp_path, "tiny", _variant(dim="64", heads="2", dtype="f32"))
    gpu = _source(spec, "gpu-h100-8")
    assert 'implementation="xla"' in gpu
    assert (
        "# attention: cudnn not used: small computes in f32; cuDNN flash attention needs bf16 or f16"
        in gpu
    )
    tpu = _source(spec, "tpu-v5e-8")
    assert "splash_attention" not in tpu and 'implementation="xla"' in tpu
    assert (
        "# attention: splash not used: small has head_dim 32; splash needs a multiple of 64" in tpu
    )


@pytest.mark.parametrize(
    "seq, head_dim, want",
    [
        (2048, 64, (1024, 1024, 1024, True)),  # Llama 3.2 1B: 8.60 -> 6.64 ms on the chip
        (32768, 128, (2048, 1024, 512, True)),  # 32k tokens: 162.3 -> 104.8 ms
        (4096, 128, (1024, 1024, 1024, True)),
        (8192, 256, (512, 512, 512, False)),  # wide heads keep what ran before
        (384, 64, (128, 128, 128, False)),
    ],
)
def test_splash_tiles_by_length(seq, head_dim, want):
    """The measured tiles (benchmarks/tpu_kernels.py splash): fused backward at lengths of whole
    1024s, what ran before elsewhere; every tile divides the sequence."""
    from axdsl.kernels.splash import splash_block_sizes

    sizes = splash_block_sizes(seq, head_dim)
    assert (
        sizes.block_q,
        sizes.block_kv,
        sizes.block_kv_compute,
        sizes.use_fused_bwd_kernel,
    ) == want
    assert (
        seq % sizes.block_q == 0
        and seq % sizes.block_kv == 0
        and sizes.block_kv % sizes.block_kv_compute == 0
    )


def test_splash_fused_backward_bounded_by_its_dq_copies():
    """Past 4 GiB of per-key-tile dq copies (seq / 1024 of them) the two backward kernels run; the
    memory model (primitives/attention.py) makes the same choice."""
    from axdsl.kernels import splash
    from axdsl.primitives import attention

    assert attention.SPLASH_FUSED_DQ_BYTES == splash.SPLASH_FUSED_DQ_BYTES
    q32k = 16 * 32768 * 128 * 2  # one sequence of 16 heads of 128: 32 copies = 4 GiB
    for seq, q_bytes in (
        (32768, q32k),
        (32768, 2 * q32k),
        (65536, 2 * q32k),
        (2048, 4 * 32 * 2048 * 64 * 2),
    ):
        fused = splash.splash_block_sizes(seq, 128, q_bytes).use_fused_bwd_kernel
        assert (
            fused
            == attention.splash_fused_backward(seq, 128, q_bytes)
            == (seq // 1024 * q_bytes <= 4 << 30)
        )
    assert not splash.splash_block_sizes(65536, 128, 2 * q32k).use_fused_bwd_kernel


def test_splash_runs_head_dim_64(tmp_path):
    """Llama 3.2 1B's heads of 64 get splash on TPU (measured on a v5e: faster than XLA's)."""
    spec = _spec(tmp_path, "tiny", _variant(dim="128", heads="2"))
    tpu = _source(spec, "tpu-v5e-8")
    assert "splash_attention(q, k, v, causal=True, window=None)" in tpu
    assert "# attention:" not in tpu


def test_cudnn_head_dim_limit_depends_on_the_gpu(tmp_path):
    spec = _spec(tmp_path, "wide", _variant(dim="512", heads="2"))  # head_dim 256
    assert 'implementation="cudnn"' in _source(spec, "gpu-h100-8")
    a100 = _source(spec, "gpu-a100-8")
    assert 'implementation="xla"' in a100
    assert (
        "cudnn not used: small has head_dim 256; cuDNN needs a multiple of 8 up to 128 on gpu-a100"
        in a100
    )


def test_cudnn_not_used_when_the_sequence_is_sharded(tmp_path):
    text = SMALL.replace(
        'target "*"', 'target "gpu-*" { mesh(fsdp = -1, seq = 2) quantize(none) }\n\ntarget "*"'
    )
    gpu = _source(_spec(tmp_path, "cp", text), "gpu-h100-8")
    assert 'implementation="xla"' in gpu
    assert "cudnn not used: the sequence is sharded over seq on gpu-h100-8" in gpu


def test_forcing_splash_on_gpu_is_a_located_error(tmp_path):
    text = SMALL.replace('target "*" {', 'target "*" {\n  kernels(attention = splash)\n ')
    spec = _spec(tmp_path, "forced", text)
    with pytest.raises(CompileError) as info:
        build_files(spec, "gpu-h100-8")
    rendered = info.value.render()
    assert f"{spec}:9:11: error: gpu-h100 has no `splash` attention kernel" in rendered
    assert "splash_attention(" in _source(spec, "tpu-v5e-8")  # where it exists, it is used


def test_forcing_a_kernel_whose_constraints_fail_is_a_located_error(tmp_path):
    text = _variant(dtype="f32").replace(
        'target "*" {', 'target "*" {\n  kernels(attention = cudnn)\n '
    )
    spec = _spec(tmp_path, "forced32", text)
    with pytest.raises(CompileError) as info:
        build_files(spec, "gpu-h100-8")
    rendered = info.value.render()
    assert (
        f"{spec}:9:11: error: /blocks/attn: the `cudnn` attention kernel cannot run this attention: "
        "small computes in f32; cuDNN flash attention needs bf16 or f16"
    ) in rendered
    assert "hint: use kernels(attention = auto) to fall back" in rendered


def test_forcing_xla_on_tpu(tmp_path):
    text = SMALL.replace(
        'target "*" {', 'target "tpu-*" { kernels(attention = xla) quantize(none) }\n\ntarget "*" {'
    )
    tpu = _source(_spec(tmp_path, "xla", text), "tpu-v5e-8")
    assert 'implementation="xla"' in tpu and "splash" not in tpu


# ----------------------------------------------------------------------------- numerics
F32_TOL = 1e-5  # forward logits, absolute and relative
GRAD_TOL = 1e-4  # gradients, relative to each leaf's largest magnitude


def _inputs(model):
    cfg = dataclasses.replace(model.Config(), dtype=jnp.float32)
    params = jax.jit(model.init_params, static_argnums=0)(cfg, jax.random.key(0))
    # Larger attention weights than the init, so that the attention pattern matters.
    params["blocks"]["attn"] = jax.tree.map(lambda w: w * 4.0, params["blocks"]["attn"])
    tokens = jax.random.randint(jax.random.key(1), (8, cfg.max_seq + 1), 0, cfg.vocab)
    return cfg, params, tokens


def _logits_and_grads(model, cfg, params, tokens):
    """Forward logits, and the gradients of the next-token loss, in one jitted function."""

    def run(params):
        logits, pullback = jax.vjp(lambda p: model.forward(cfg, p, tokens[:, :-1]), params)
        labels = jax.nn.one_hot(tokens[:, 1:], cfg.vocab)
        dlogits = (jax.nn.softmax(logits) - labels) / labels[..., 0].size  # d mean CE / d logits
        return logits, pullback(dlogits)[0]

    logits, grads = jax.jit(run)(params)
    return np.asarray(logits), grads


@pytest.fixture(scope="module")
def reference(models):
    cpu = models["cpu"]
    cfg, params, tokens = _inputs(cpu)
    return cfg, params, tokens, _logits_and_grads(cpu, cfg, params, tokens)


def _assert_close(got, want):
    logits, grads = got
    want_logits, want_grads = want
    assert np.abs(want_logits).max() > 0.1
    np.testing.assert_allclose(logits, want_logits, atol=F32_TOL, rtol=F32_TOL)
    for path, g, w in zip(
        jax.tree_util.tree_leaves_with_path(want_grads),
        jax.tree.leaves(grads),
        jax.tree.leaves(want_grads),
    ):
        err = float(jnp.abs(g - w).max() / jnp.abs(w).max())
        assert err < GRAD_TOL, (jax.tree_util.keystr(path[0]), err)


@pytest.mark.parametrize("mesh", [False, True], ids=["no_mesh", "mesh"])
def test_splash_matches_xla(models, reference, monkeypatch, mesh):
    tpu = models["tpu-v5e-8"]
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    cfg, params, tokens, want = reference
    calls = []
    kernel = kernels_of(tpu).splash_attention_kernel.make_splash_mha
    monkeypatch.setattr(
        kernels_of(tpu).splash_attention_kernel,
        "make_splash_mha",
        lambda *a, **kw: calls.append(kw["interpret"]) or kernel(*a, **kw),
    )
    if mesh:
        with jax.set_mesh(tpu.make_mesh()):
            got = _logits_and_grads(tpu, cfg, params, tokens)
    else:
        got = _logits_and_grads(tpu, cfg, params, tokens)
    assert calls and all(calls)  # the splash kernel ran, in interpret mode
    _assert_close(got, want)


def test_gpu_file_matches_cpu_with_cudnn_swapped_for_xla(models, reference, monkeypatch):
    gpu = models["gpu-h100-8"]
    cfg, params, tokens, want = reference
    implementations = []
    original = jax.nn.dot_product_attention

    def xla_for_cudnn(*args, implementation=None, **kwargs):
        implementations.append(implementation)
        return original(
            *args, implementation="xla" if implementation == "cudnn" else implementation, **kwargs
        )

    monkeypatch.setattr(jax.nn, "dot_product_attention", xla_for_cudnn)
    got = _logits_and_grads(gpu, cfg, params, tokens)
    assert implementations and set(implementations) == {"cudnn"}
    _assert_close(got, want)


@pytest.mark.parametrize("causal, window", [(False, None), (True, 100), (False, 200)])
def test_splash_masks_match_xla(models, monkeypatch, causal, window):
    """Full, and sliding-window masks (window tokens including the current one) over 2 tiles."""
    tpu = models["tpu-v5e-8"]
    monkeypatch.setattr(kernels_of(tpu), "PALLAS_INTERPRET", True)
    kq, kk, kv = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(kq, (1, 256, 2, 128))
    k, v = jax.random.normal(kk, (1, 256, 1, 128)), jax.random.normal(kv, (1, 256, 1, 128))
    got = tpu.splash_attention(q, k, v, causal=causal, window=window)
    want = jax.nn.dot_product_attention(
        q,
        k,
        v,
        is_causal=causal,
        implementation="xla",
        local_window_size=(window - 1, 0) if window else None,
    )
    np.testing.assert_allclose(got, want, atol=F32_TOL, rtol=F32_TOL)


def test_splash_rejects_a_sequence_not_divisible_by_128(models):
    tpu = models["tpu-v5e-8"]
    q = jnp.zeros((1, 100, 2, 128))
    with pytest.raises(ValueError, match="divisible by 128, got 100"):
        tpu.splash_attention(q, q[:, :, :1], q[:, :, :1], causal=True, window=None)


# ----------------------------------------------------------------------------- TPU lowering
@pytest.mark.parametrize("mesh", [False, True], ids=["no_mesh", "mesh"])
def test_tpu_lowering_contains_the_splash_kernel(models, mesh):
    tpu = models["tpu-v5e-8"]
    assert kernels_of(tpu).PALLAS_INTERPRET is False
    cfg = tpu.Config()
    params = jax.eval_shape(lambda: tpu.init_params(cfg, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((8, cfg.max_seq + 1), jnp.int32)
    step = jax.jit(jax.value_and_grad(tpu.loss_fn, argnums=1, has_aux=True), static_argnums=0)

    def lower():
        return step.trace(cfg, params, tokens).lower(lowering_platforms=("tpu",)).as_text()

    if mesh:
        with jax.set_mesh(tpu.make_mesh()):
            text = lower()
    else:
        text = lower()
    # The forward kernel (once: this small step fits with nothing recomputed, fit_remat's none)
    # and the two backward kernels (dq, dkv), each a Mosaic `tpu_custom_call`; nothing else is one.
    kernels = re.findall(r"splash_mha_(fwd|dq|dkv)", text)
    assert sorted(set(kernels)) == ["dkv", "dq", "fwd"]
    assert text.count("stablehlo.custom_call @tpu_custom_call") == len(kernels) == 3


def test_models_of_different_structures_are_an_error_not_a_crash(tmp_path):
    """select_kernels looks each attention call up in every model; a model without it (another
    structure) is left to the one-structure-per-spec error, not an internal StopIteration."""
    from axdsl.build import build_files
    from axdsl.errors import CompileError

    spec = tmp_path / "two.axl"
    spec.write_text(
        'import "std/transformer.axl"\n'
        "model long = DecoderLM { vocab = 64  dim = 64  layers = 2  heads = 2  ffn = 128 }\n"
        "layer Id(d: int = 4) { forward(x: [B, d]) -> [B, d] { return x } }\n"
        "model other = Id {}\n"
    )
    with pytest.raises(CompileError, match="has a different structure"):
        build_files(spec, "gpu-h100")


def test_models_whose_parameters_differ_inside_a_block_are_an_error(tmp_path):
    """Models of a spec share one parameter table sized by Config fields: a size written inside a
    block (`MoE(experts = 4)`) that differs from the first model's was silently the first
    model's (a 128-expert table for a 32-expert model); now it is a located error."""
    from axdsl.build import build_files
    from axdsl.errors import CompileError

    spec = tmp_path / "moe.axl"
    spec.write_text(
        'import "std/transformer.axl"\n'
        "model big = DecoderLM { vocab = 64  dim = 64  layers = 2  heads = 2  ffn = 32\n"
        "  block = Block(mlp = MoE(hidden = ffn, experts = 8, top_k = 2)) }\n"
        "model cut extends big {\n"
        "  block = Block(mlp = MoE(hidden = ffn, experts = 4, top_k = 2)) }\n"
    )
    with pytest.raises(
        CompileError, match="`cut` has a parameter table .* other than `big`'s.*experts = 4"
    ):
        build_files(spec, "cpu")
