"""The `ssd` primitive (Mamba-2's chunked state-space scan, axdsl/primitives/ssd.py): its helper
(axdsl/kernels/ssd.py) against a naive sequential recurrence in numpy and against transformers'
torch chunk scan, and the primitive in a tiny spec, built for cpu and run."""

from __future__ import annotations


import numpy as np
import pytest

from axdsl.analysis.flops import model_flops
from axdsl.build import build_files, write_atomic
from axdsl.runs import import_output

RNG = np.random.default_rng(0)


def _helper():
    from axdsl.kernels.ssd import ssd  # the helper's own source, which model.py copies

    return ssd


def _inputs(batch=2, seq=11, heads=4, head_dim=3, groups=2, state=5):
    x = RNG.standard_normal((batch, seq, heads, head_dim)).astype(np.float32)
    dt = np.log1p(np.exp(RNG.standard_normal((batch, seq, heads)))).astype(np.float32)  # softplus
    a = -np.exp(RNG.standard_normal(heads)).astype(np.float32)
    b = RNG.standard_normal((batch, seq, groups, state)).astype(np.float32)
    c = RNG.standard_normal((batch, seq, groups, state)).astype(np.float32)
    return x, dt, a, b, c


def naive_ssd(x, dt, a, b, c):
    """state[t] = exp(dt a) state[t-1] + dt x[t] b[t]^T, y[t] = state[t] c[t], one step at a time."""
    batch, seq, heads, head_dim = x.shape
    per = heads // b.shape[2]
    x, dt, a, b, c = (np.asarray(t, np.float64) for t in (x, dt, a, b, c))
    y = np.zeros_like(x)
    for h in range(heads):
        g = h // per
        state = np.zeros((batch, head_dim, b.shape[3]))
        for t in range(seq):
            decay = np.exp(dt[:, t, h] * a[h])[:, None, None]
            state = (
                decay * state + dt[:, t, h, None, None] * x[:, t, h, :, None] * b[:, t, g, None, :]
            )
            y[:, t, h] = np.einsum("bpn,bn->bp", state, c[:, t, g])
    return y


@pytest.mark.parametrize("chunk", [1, 4, 11, 16])
def test_ssd_matches_the_sequential_recurrence(chunk):
    inputs = _inputs()
    y = np.asarray(_helper()(*inputs, chunk=chunk))
    assert y.dtype == np.float32 and y.shape == inputs[0].shape
    np.testing.assert_allclose(y, naive_ssd(*inputs), rtol=1e-5, atol=1e-5)


def test_ssd_matches_transformers_chunk_scan():
    torch = pytest.importorskip("torch")
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

    x, dt, a, b, c = _inputs(seq=13)
    raw = RNG.standard_normal(dt.shape).astype(np.float32)  # before softplus, as HF takes it
    bias = RNG.standard_normal(dt.shape[-1]).astype(np.float32)
    dt = np.log1p(np.exp(raw + bias)).astype(np.float32)
    t = torch.from_numpy
    with torch.no_grad():
        want = (
            mamba2_chunk_scan.__wrapped__(
                t(x), t(raw), t(a), t(b), t(c), chunk_size=4, dt_bias=t(bias), dt_softplus=True
            )
            if hasattr(mamba2_chunk_scan, "__wrapped__")
            else mamba2_chunk_scan(
                t(x), t(raw), t(a), t(b), t(c), chunk_size=4, dt_bias=t(bias), dt_softplus=True
            )
        )
    np.testing.assert_allclose(
        np.asarray(_helper()(x, dt, a, b, c, chunk=4)), want.numpy(), rtol=1e-5, atol=1e-5
    )


def test_ssd_is_deterministic_and_pads_a_partial_chunk():
    inputs = _inputs(seq=7)
    ssd = _helper()
    one, two = np.asarray(ssd(*inputs, chunk=4)), np.asarray(ssd(*inputs, chunk=4))
    assert np.array_equal(one, two)
    np.testing.assert_allclose(one, np.asarray(ssd(*inputs, chunk=8)), rtol=1e-5, atol=1e-6)


SPEC = """
layer Scan(heads: int = 4, head_dim: int = 3, groups: int = 2, state: int = 5) {
  param A_log: [heads] axes(heads) init zeros
  forward(x: [B, S, heads, head_dim], dt: [B, S, heads], b: [B, S, groups, state],
          c: [B, S, groups, state]) -> [B, S, heads, head_dim] {
    return ssd(x, dt, -exp(A_log), b, c, chunk = 4)
  }
}
model scan = Scan {}
"""


def test_ssd_primitive_in_a_spec(tmp_path):
    spec = tmp_path / "scan.axl"
    spec.write_text(SPEC)
    files = build_files(spec, "cpu")
    write_atomic(tmp_path / "out", files)
    source = files["model.py"]
    assert "def ssd(" in files["kernels.py"] and "import functools" in files["kernels.py"]
    assert 'ssd(x, dt, -jnp.exp(params["A_log"]), b, c, chunk=4)' in source
    module = import_output(tmp_path / "out")
    x, dt, a, b, c = _inputs()
    log_a = np.log(-a)
    y = module.forward(module.Config(), {"A_log": log_a}, x, dt, b, c)
    np.testing.assert_allclose(np.asarray(y), naive_ssd(x, dt, a, b, c), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seq, chunk", [(8, 4), (16, 8), (12, 8), (5, 8)])
def test_memory_rule_keeps_what_jax_saves(tmp_path, seq, chunk):
    """The memory rule's bytes equal jax's saved residuals of the helper (plus the forward's result)."""
    import jax
    from jax._src.ad_checkpoint import saved_residuals

    from axdsl.analysis.memory import estimate_memory
    from axdsl.pipeline import compile_spec

    spec = tmp_path / "mem.axl"
    spec.write_text(f"""
layer Scan(heads: int = 4, head_dim: int = 3, groups: int = 2, state: int = 5) {{
  forward(x: [B, S, heads, head_dim], dt: [B, S, heads], a: [heads], b: [B, S, groups, state],
          c: [B, S, groups, state]) -> [B, S, heads, head_dim] {{
    return ssd(x, dt, a, b, c, chunk = {chunk})
  }}
}}
model scan = Scan {{}}
""")
    inputs = _inputs(batch=2, seq=seq)
    ssd = _helper()
    residuals = saved_residuals(
        lambda *t: ssd(*t, chunk=chunk).sum(), *(jax.numpy.asarray(t) for t in inputs)
    )
    measured = sum(int(np.prod(r.shape)) * r.dtype.itemsize for r, _ in residuals)
    result = inputs[0].nbytes  # every traced forward keeps its result
    assert estimate_memory(compile_spec(spec), batch=2, seq=seq).saved == result + measured


def test_flops_count_the_chunked_products(tmp_path):
    from axdsl.pipeline import compile_spec

    spec = tmp_path / "scan.axl"
    spec.write_text(SPEC)
    model = compile_spec(spec).models[0]
    heads, head_dim, groups, state = 4, 3, 2, 5
    for seq, chunk in ((16, 4), (2, 2)):  # the chunk is 4; a sequence shorter than it is one chunk
        flops = model_flops(model, seq=seq)
        assert flops.matmul == 0
        assert (
            flops.attention
            == 2 * chunk * (groups * state + heads * head_dim) + 4 * heads * head_dim * state
        )


def test_gpu_keeps_the_measured_extras(tmp_path, monkeypatch):
    """XLA:GPU keeps the fused set (XLA:TPU's) and the SSD values platforms.GPU names: with
    float32 x, the float32 decay, C.B per group and the read-out product (x in float32 is kept
    only when x is not float32)."""
    import dataclasses

    from axdsl.analysis import platforms
    from axdsl.analysis.memory import estimate_memory
    from axdsl.ir import nodes as ir
    from axdsl.pipeline import compile_spec
    from axdsl.primitives.ssd import FUSED_KEEPS

    spec = tmp_path / "mem.axl"
    spec.write_text("""
layer Scan(heads: int = 4, head_dim: int = 3, groups: int = 2, state: int = 5) {
  forward(x: [B, S, heads, head_dim], dt: [B, S, heads], a: [heads], b: [B, S, groups, state],
          c: [B, S, groups, state]) -> [B, S, heads, head_dim] {
    return ssd(x, dt, a, b, c, chunk = 4)
  }
}
model scan = Scan {}
""")
    gpu = platforms.GPU
    assert not platforms.TPU.ssd_extra_keeps and not gpu.ssd_extra_keeps & FUSED_KEEPS
    kept = estimate_memory(compile_spec(spec, "gpu-h100-1"), batch=2, seq=8).saved
    fused = dataclasses.replace(gpu, ssd_extra_keeps=frozenset())
    monkeypatch.setitem(platforms.FACTS, ir.ChipKind.GPU, fused)
    less = estimate_memory(compile_spec(spec, "gpu-h100-1"), batch=2, seq=8).saved
    # float32 [B, heads, S, chunk] decay, [B, S, heads, head_dim] read-out, [B, groups, S, chunk] C.B
    assert kept - less == 4 * (2 * 4 * 8 * 4 + 2 * 8 * 4 * 3 + 2 * 2 * 8 * 4)
