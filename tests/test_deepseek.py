"""DeepSeek-V3 pieces against transformers: multi-head latent attention (std/deepseek.axl
MLAttention) and its `broadcast` primitive, in float32."""

from __future__ import annotations


import numpy as np
import pytest

from axdsl.build import build_files, write_atomic
from axdsl.runs import import_output

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds  # noqa: E402

RNG = np.random.default_rng(0)


def _load(tmp_path, name: str, source: str):
    spec = tmp_path / f"{name}.axl"
    spec.write_text(source)
    out = tmp_path / "out" / name
    write_atomic(out, build_files(spec, "cpu"))
    return import_output(out)


def test_broadcast_inserts_copies_along_a_new_dim(tmp_path):
    m = _load(tmp_path, "bc", """
layer Op(dim: int, heads: int) {
  forward(x: [B, S, dim]) -> [B, heads, S, dim] {
    return broadcast(x, heads, before = S) * 2.0
  }
}
model op = Op { dim = 3  heads = 5 }
""")
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    out = np.asarray(m.forward(m.Config(), {}, x))
    np.testing.assert_allclose(out, np.broadcast_to(2 * x[:, None], (2, 5, 4, 3)), rtol=0, atol=0)


MLA = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 8, "qk_nope_head_dim": 8,
       "qk_rope_head_dim": 4, "v_head_dim": 6}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


def _spec(q_rank: int, rope: dict) -> str:
    yarn = ("  rope_scaling = \"yarn\"  rope_factor = 4.0  rope_original_max_seq = 8  rope_mscale_all_dim = 1.0\n"
            if rope["rope_type"] == "yarn" else "")
    return ('import "std/deepseek.axl"\nmodel mla = MLAttention {\n'
            f"  dim = 32  heads = 4  q_rank = {q_rank}  kv_rank = 8  nope_dim = 8  rope_dim = 4  v_head_dim = 6\n"
            f"{yarn}}}\n")


def _t(w) -> np.ndarray:
    return w.detach().numpy().T


@pytest.mark.parametrize("q_rank,rope", [(16, YARN), (0, DEFAULT)], ids=["q_lora_yarn", "q_proj_default"])
def test_latent_attention_matches_transformers(tmp_path, q_rank, rope):
    cfg = transformers.DeepseekV3Config(**MLA, q_lora_rank=q_rank or None, rope_parameters=rope,
                                        max_position_embeddings=32, num_hidden_layers=1)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = hf_ds.DeepseekV3Attention(cfg, 0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randn(2, 12, 32)
    pos = torch.arange(12)[None]
    cos_sin = hf_ds.DeepseekV3RotaryEmbedding(cfg)(x, pos)
    mask = torch.full((12, 12), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = attn(x, cos_sin, mask)[0].numpy()
    heads, qk, v = 4, 12, 6
    params = {"wkv_a": _t(attn.kv_a_proj_with_mqa.weight),
              "kv_norm": {"scale": attn.kv_a_layernorm.weight.detach().numpy()},
              "wkv_b": _t(attn.kv_b_proj.weight).reshape(8, heads, 8 + v),
              "wo": _t(attn.o_proj.weight).reshape(heads, v, 32)}
    if q_rank:
        params |= {"wq_a": _t(attn.q_a_proj.weight), "q_norm": {"scale": attn.q_a_layernorm.weight.detach().numpy()},
                   "wq_b": _t(attn.q_b_proj.weight).reshape(q_rank, heads, qk)}
    else:
        params["wq"] = _t(attn.q_proj.weight).reshape(32, heads, qk)
    m = _load(tmp_path, f"mla{q_rank}", _spec(q_rank, rope))
    assert np.isclose(m.Config().scale, attn.scaling)
    got = np.asarray(m.forward(m.Config(), params, x.numpy()))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def _moe_spec(groups: int, top_groups: int) -> str:
    return ('import "std/deepseek.axl"\nmodel dsmoe = DeepSeekMoE {\n'
            f"  dim = 16  hidden = 8  experts = 8  top_k = 3  groups = {groups}  top_groups = {top_groups}"
            "  scale = 2.5  shared = 2\n}\n")


@pytest.mark.parametrize("groups,top_groups", [(4, 2), (1, 1)], ids=["grouped", "ungrouped"])
def test_deepseek_moe_matches_transformers(tmp_path, groups, top_groups):
    """Sigmoid scores, a selection-only bias, group-limited top-k, normalized and scaled weights,
    and the shared experts: DeepseekV3MoE's output, token by token."""
    cfg = transformers.DeepseekV3Config(hidden_size=16, moe_intermediate_size=8, n_routed_experts=8,
                                        num_experts_per_tok=3, n_group=groups, topk_group=top_groups,
                                        routed_scaling_factor=2.5, n_shared_experts=2, norm_topk_prob=True)
    torch.manual_seed(1)
    moe = hf_ds.DeepseekV3MoE(cfg).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.5)
        moe.gate.e_score_correction_bias.normal_(0.0, 0.5)  # large enough to change choices
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        want = moe(x).numpy()
    gate_up, hidden = moe.experts.gate_up_proj.detach().numpy(), 8
    shared = moe.shared_experts
    params = {"router": _t(moe.gate.weight), "score_bias": moe.gate.e_score_correction_bias.numpy(),
              "w_gate": gate_up[:, :hidden].transpose(0, 2, 1), "w_up": gate_up[:, hidden:].transpose(0, 2, 1),
              "w_down": moe.experts.down_proj.detach().numpy().transpose(0, 2, 1),
              "shared_mlp": {"w_gate": _t(shared.gate_proj.weight), "w_up": _t(shared.up_proj.weight),
                             "w_down": _t(shared.down_proj.weight)}}
    m = _load(tmp_path, f"dsmoe{groups}", _moe_spec(groups, top_groups))
    got = m.forward(m.Config(), params, x.numpy())
    got = np.asarray(got[0] if isinstance(got, tuple) else got)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)



def test_inlined_hyperparameter_expressions_keep_their_grouping(tmp_path):
    """A derived default written into another layer's code stays one operand: mscale * mscale with
    mscale = (a) * (b) + 1 is (((a) * (b)) + 1) * (...), not (a) * (b) + 1 * (a) * (b) + 1."""
    m = _load(tmp_path, "grouping", """
layer Inner(f: float = 4.0, m: float = (0.1 * 2.0) * (log(max(f, 1.0))) + 1.0, s: float = m * m / sqrt(4.0)) {
  forward(x: [B, S]) -> [B, S] {
    return x * s
  }
}
layer Outer(dim: int = 1) {
  child inner = Inner(f = 40.0)
  forward(x: [B, S]) -> [B, S] {
    return inner(x)
  }
}
model outer = Outer {}
""")
    mscale = 0.2 * np.log(40.0) + 1.0
    out = np.asarray(m.forward(m.Config(), {"inner": {}}, np.ones((1, 2), np.float32)))
    np.testing.assert_allclose(out, mscale * mscale / 2.0, rtol=1e-6)


def test_selection_bias_gets_no_gradient(tmp_path):
    """score_bias only picks experts (a discrete choice): its gradient is exactly zero, so training
    leaves it to DeepSeek's balancing rule; the router and experts do get gradients."""
    import jax
    import jax.numpy as jnp

    m = _load(tmp_path, "dsgrad", _moe_spec(4, 2))
    cfg = m.Config()
    params = m.init_params(cfg, jax.random.key(0))
    params["score_bias"] = jnp.linspace(-0.1, 0.1, 8)
    x = jnp.asarray(RNG.standard_normal((2, 6, 16)).astype(np.float32))

    def loss(p):
        out = m.forward(cfg, p, x)
        return jnp.sum((out[0] if isinstance(out, tuple) else out) ** 2)

    grads = jax.grad(loss)(params)
    assert not np.any(np.asarray(grads["score_bias"]))
    assert np.any(np.asarray(grads["router"])) and np.any(np.asarray(grads["w_gate"]))
