"""Mamba-2 in std/mamba.axl: the mixer against transformers' Mamba2Mixer (its torch path, no CUDA
kernels) on random weights, in float32."""

from __future__ import annotations


import numpy as np
import pytest

from axdsl.build import build_files, write_atomic
from axdsl.runs import import_output

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MIXER = """
import "std/mamba.axl"
model mix = Mamba2Mixer {{ dim = 16  head_dim = 4  groups = {groups}  state = 8  conv_kernel = 4  chunk = 4 }}
"""


def _module(tmp_path, name: str, source: str):
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source)
    files = build_files(spec, "cpu")
    write_atomic(tmp_path / "out" / name, files)
    return import_output(tmp_path / "out" / name)


def _hf_mixer(groups: int):
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    cfg = Mamba2Config(hidden_size=16, expand=2, head_dim=4, num_heads=8, n_groups=groups, state_size=8,
                       conv_kernel=4, chunk_size=4, num_hidden_layers=1, vocab_size=32)
    torch.manual_seed(0)
    mixer = Mamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in mixer.named_parameters():
            if name == "A_log":
                p.copy_(torch.rand_like(p) * 2 - 1)
            elif name in ("dt_bias", "D", "norm.weight", "conv1d.bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name in ("D", "norm.weight") else 0.0))
            else:
                p.copy_(torch.randn_like(p) * 0.3)
    return mixer


def _params(mixer) -> dict:
    """transformers' fused in_proj rows [z, x, B, C, dt] and conv1d channels [x, B, C], split."""
    sd = {k: v.detach().numpy() for k, v in mixer.state_dict().items()}
    inner, gs = mixer.intermediate_size, mixer.n_groups * mixer.ssm_state_size
    z, x, b, c, dt = np.split(sd["in_proj.weight"].T, np.cumsum([inner, inner, gs, gs]), axis=1)
    conv_w = np.split(sd["conv1d.weight"][:, 0, :].T, np.cumsum([inner, gs]), axis=1)
    conv_b = np.split(sd["conv1d.bias"], np.cumsum([inner, gs]))
    convs = {f"conv_{n}": {"w": w, "b": bias} for n, w, bias in zip("xbc", conv_w, conv_b)}
    return {"in_z": z, "in_x": x, "in_b": b, "in_c": c, "in_dt": dt, **convs, "dt_bias": sd["dt_bias"],
            "A_log": sd["A_log"], "D": sd["D"], "norm": {"scale": sd["norm.weight"]},
            "out_proj": sd["out_proj.weight"].T}


@pytest.mark.parametrize("groups", [1, 2])
def test_mixer_matches_transformers(tmp_path, groups):
    m = _module(tmp_path, "mix", MIXER.format(groups=groups))
    mixer = _hf_mixer(groups)
    x = np.random.default_rng(1).standard_normal((2, 10, 16)).astype(np.float32)  # 10: a partial chunk
    with torch.no_grad():
        want = mixer(torch.from_numpy(x)).numpy()
    got = np.asarray(m.forward(m.Config(), _params(mixer), x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # measured: 1.9e-6 of 7


def test_decay_rates_and_step_sizes_start_as_mambas_do(tmp_path):
    """A_log starts at log(1), log(2), ... per head (transformers' init_mamba2_weights, exactly) and
    softplus(dt_bias) is a log-uniform step in [dt_min, dt_max] = [0.001, 0.1], drawn per head and
    per layer; not the zeros (every head one decay rate, a step of log 2) std once used."""
    import jax

    module = _module(tmp_path, "init", """
import "std/mamba.axl"
model m = DecoderLM { vocab = 32  dim = 64  layers = 3  heads = 16  positions = "none"
                      block = MambaBlock(mixer = Mamba2Mixer(head_dim = 8, state = 8, chunk = 4)) }
""")
    params = module.init_params(module.CONFIGS["m"], jax.random.key(0))
    mixer = params["blocks"]["mixer"]
    a_log, dt_bias = np.asarray(mixer["A_log"]), np.asarray(mixer["dt_bias"])
    assert a_log.shape == dt_bias.shape == (3, 16)
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    hf = Mamba2Mixer(Mamba2Config(hidden_size=64, expand=2, head_dim=8, num_heads=16, n_groups=1, state_size=8,
                                  num_hidden_layers=1, vocab_size=32), layer_idx=0)
    hf.init_mamba2_weights()
    for layer in a_log:
        np.testing.assert_allclose(layer, hf.A_log.detach().numpy(), rtol=1e-6)
    dt = np.log1p(np.exp(dt_bias.astype(np.float64)))  # softplus
    hf_dt = np.log1p(np.exp(hf.dt_bias.detach().numpy().astype(np.float64)))
    assert dt.min() >= 0.001 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    assert hf_dt.min() >= 0.001 * (1 - 1e-5) and hf_dt.max() <= 0.1 * (1 + 1e-5)
    assert len(np.unique(dt)) == dt.size  # drawn, not a constant
    assert not np.allclose(dt[0], dt[1])  # each layer its own draw
