"""Hugging Face interop (axdsl/hf/): import-hf and export-hf against real transformers models.

For every family a tiny random transformers model (PyTorch on CPU, float32) is saved with
save_pretrained, imported into a matching spec, and the generated model's logits are compared with
HF's (max abs difference < 1e-4). Then export -> import is bitwise lossless and transformers loads
the export and gives the same logits. transformers, torch and safetensors are optional: these tests
are skipped without them. The checks of the zoo specs against published configs need neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from axdsl import hf as axhf

ROOT = Path(__file__).resolve().parent.parent

HEADER = 'import "std/transformer.axl"\n'

# family -> (spec of one model `m`, transformers config kwargs). Each mirrors its zoo spec's
# structure at test size; dims differ from dim / heads where the family allows it (qwen3).
CASES = {
    "gpt2": (
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  ffn = 256  max_seq = 32
          positions = "learned"  tied = true  norm = LayerNorm(eps = 1e-5)
          block = Block(attn = Attention(rope = false, bias = true),
                        mlp = MLP(hidden = ffn, act = "gelu", bias = true))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_inner=256, n_positions=32,
             activation_function="gelu_new", layer_norm_epsilon=1e-5),
    ),
    "llama": (  # Llama 3 style (GQA, theta 500k), with attention biases to cover them
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)
          block = Block(attn = Attention(bias = true))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
             attention_bias=True),
    ),
    "llama:llama3": (  # Llama 3.1/3.2's rope scaling; original_max_seq 8 < 16 tokens, so all of it matters
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)  tied = true
          block = Block(attn = Attention(rope_scaling = "llama3", rope_factor = 8.0, rope_low_freq = 1.0,
                                         rope_high_freq = 4.0, rope_original_max_seq = 8))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, tie_word_embeddings=True,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8}),
    ),
    "llama:yarn": (  # YaRN with its default attention factor
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          rope_theta = 10000.0  norm = RMSNorm(eps = 1e-5)
          block = Block(attn = Attention(rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 16))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16}),
    ),
    "mistral": (  # window 8 < the test's 16 tokens, so the window matters
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          norm = RMSNorm(eps = 1e-5)  rope_theta = 10000.0
          block = Block(attn = Attention(window = 8))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             sliding_window=8),
    ),
    "mixtral": (
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 32  max_seq = 64
          norm = RMSNorm(eps = 1e-5)  rope_theta = 1000000.0
          block = Block(mlp = MoE(hidden = ffn, experts = 4, top_k = 2, capacity_factor = 0.0))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    ),
    "qwen2": (  # q, k, v biases and no output bias
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          norm = RMSNorm(eps = 1e-6)  rope_theta = 1000000.0
          block = Block(attn = Attention(bias = true, out_bias = false))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             tie_word_embeddings=False),
    ),
    "phi": (  # Phi-2's layout: one LayerNorm for parallel attention and MLP, half the head rotates
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  ffn = 256  max_seq = 64
          norm = LayerNorm(eps = 1e-5)  rope_theta = 10000.0  head_bias = true
          block = ParallelBlock(shared_norm = true, attn = Attention(bias = true, rope_dim = 8),
                                mlp = MLP(hidden = ffn, act = "gelu", bias = true))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, layer_norm_eps=1e-5, hidden_act="gelu_new",
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    ),
    "gpt_neox": (  # Pythia: two LayerNorms, parallel residual, a quarter of the head rotates, exact gelu
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  ffn = 256  max_seq = 64
          norm = LayerNorm(eps = 1e-5)  rope_theta = 10000.0
          block = ParallelBlock(attn = Attention(bias = true, rope_dim = 4),
                                mlp = MLP(hidden = ffn, act = "gelu_exact", bias = true))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, layer_norm_eps=1e-5, hidden_act="gelu",
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
             use_parallel_residual=True, attention_bias=True),
    ),
    "gemma2": (  # local (window 8 < 16 tokens) and global layers in turn, soft caps, sandwich norms
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 4  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          rope_theta = 10000.0  tied = true  norm = GemmaRMSNorm(eps = 1e-6)
          embed_multiplier = sqrt(dim)  logit_softcap = 3.0
          block = [Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                         attn = Attention(head_dim = 32, scale = 0.125, softcap = 2.0, window = 8)),
                   Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                         attn = Attention(head_dim = 32, scale = 0.125, softcap = 2.0))]
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             query_pre_attn_scalar=64, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
             sliding_window=8, hidden_activation="gelu_pytorch_tanh"),
    ),
    "gemma3_text": (  # a pattern of two local layers (window 8 < 16 tokens, rotary base 10k) and a global one
        # (base 1M, linear x 8) over 4 layers: one scanned group, then a local layer after the scan; q/k norms
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 4  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          tied = true  norm = GemmaRMSNorm(eps = 1e-6)  embed_multiplier = sqrt(dim)
          block = [Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                         attn = Attention(head_dim = 32, scale = 0.125, qk_norm = true, window = 8)),
                   Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                         attn = Attention(head_dim = 32, scale = 0.125, qk_norm = true, window = 8)),
                   Block(post_norms = true, mlp = GatedMLP(hidden = ffn, act = "gelu_tanh"),
                         attn = Attention(head_dim = 32, scale = 0.125, qk_norm = true, rope_theta = 1000000.0,
                                          rope_scaling = "linear", rope_factor = 8.0))]
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
             rms_norm_eps=1e-6, query_pre_attn_scalar=64, sliding_window=8, hidden_activation="gelu_pytorch_tanh",
             layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}),
    ),
    "mamba2": (  # attention-free: 2 groups of B and C over 4 heads, 16 tokens in chunks of 6 (the last partial)
        """import "std/mamba.axl"
        model m = DecoderLM {
          vocab = 96  dim = 32  layers = 2  heads = 4  positions = "none"  tied = true
          norm = RMSNorm(eps = 1e-5)
          block = MambaBlock(mixer = Mamba2Mixer(head_dim = 16, groups = 2, state = 8, chunk = 6))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2,
             n_groups=2, state_size=8, conv_kernel=4, chunk_size=6, layer_norm_epsilon=1e-5,
             tie_word_embeddings=True),
    ),
    "qwen3": (  # dense Qwen3, tied like Qwen3-0.6B
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          norm = RMSNorm(eps = 1e-6)  rope_theta = 1000000.0  tied = true
          block = Block(attn = Attention(head_dim = 32, qk_norm = true))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             tie_word_embeddings=True),
    ),
    "qwen3_moe": (  # head_dim 32 != dim / heads, qk-norm, 4 experts top-2 renormalized
        """model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  max_seq = 64
          norm = RMSNorm(eps = 1e-6)  rope_theta = 1000000.0
          block = Block(attn = Attention(head_dim = 32, qk_norm = true),
                        mlp = MoE(hidden = 32, experts = 4, top_k = 2, capacity_factor = 0.0))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=64, rms_norm_eps=1e-6,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
    ),
    "deepseek_v3": (  # latent attention (yarn, mscale^2 scale), 1 dense layer then 2 MoE layers: 8 experts in
        # 2 groups (1 chosen), top-2, a random selection bias, weights x 2.5, one shared expert
        """import "std/deepseek.axl"
        model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  dense_layers = 1  heads = 4  ffn = 128  max_seq = 64
          norm = RMSNorm(eps = 1e-6)  rope_theta = 10000.0
          dense_block = Block(attn = MLAttention(q_rank = 32, kv_rank = 16, nope_dim = 8, rope_dim = 4, v_head_dim = 12,
                                                 rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 16,
                                                 rope_mscale_all_dim = 1.0),
                              mlp = SwiGLU(hidden = ffn))
          block = Block(attn = MLAttention(q_rank = 32, kv_rank = 16, nope_dim = 8, rope_dim = 4, v_head_dim = 12,
                                           rope_scaling = "yarn", rope_factor = 4.0, rope_original_max_seq = 16,
                                           rope_mscale_all_dim = 1.0),
                        mlp = DeepSeekMoE(hidden = 16, experts = 8, top_k = 2, groups = 2, top_groups = 1,
                                          scale = 2.5, shared = 1))
          dtype = f32  param_dtype = f32
        }""",
        dict(vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=16, num_hidden_layers=3,
             first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
             kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, n_routed_experts=8,
             num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5, n_shared_experts=1,
             norm_topk_prob=True, max_position_embeddings=64, rms_norm_eps=1e-6, num_mtp_layers=0,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0}),
    ),
}


def _write_spec(tmp: Path, family: str) -> Path:
    spec = tmp / f"hf_{family.replace(':', '_')}.axl"
    spec.write_text(HEADER + CASES[family][0] + "\n")
    return spec


def _hf_model(case: str, **overrides):
    """A random transformers model of CASES[case] (a family, or "family:variant")."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    family = case.split(":")[0]
    conf = transformers.AutoConfig.for_model(family, **{**CASES[case][1], **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(conf).eval()
    # HF initializes norms to 1 and biases to 0: randomize everything so each tensor's place shows.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            else:  # GPT-2's Conv1D is [in, out]; everything else [..., in]
                fan_in = p.shape[0] if family == "gpt2" and p.ndim == 2 and "wte" not in name \
                    and "wpe" not in name else p.shape[-1]
                p.copy_(noise / fan_in ** 0.5)
        for name, b in model.named_buffers():  # DeepSeek's router selection bias (a buffer in HF)
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return model


def _hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


def _restore(model, cfg, path: Path):
    import jax
    import orbax.checkpoint as ocp

    abstract = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path.absolute(), abstract)


def _leaves(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


MAX_DIFFS: dict[str, float] = {}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(CASES))
def test_logits_match_transformers_and_roundtrip(family, tmp_path, capsys):
    pytest.importorskip("transformers")
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from tests.targets_util import import_generated

    spec = _write_spec(tmp_path, family)
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["m"]
    hf = _hf_model(family)
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)

    assert axhf.import_hf(spec, hf_dir, None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    assert "wrote" in capsys.readouterr().out
    params = _restore(model, cfg, tmp_path / "ckpt")
    shapes = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    assert jax.tree.structure(params) == jax.tree.structure(shapes)

    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (2, 16))
    ours = np.asarray(model.forward(cfg, params, jnp.asarray(tokens)))
    ref = _hf_logits(hf, tokens)
    diff = float(np.abs(ours - ref).max())
    MAX_DIFFS[family] = diff
    print(f"{family}: max |logits - HF logits| = {diff:.2e} (logits std {ref.std():.2f})")
    assert ours.shape == ref.shape
    assert diff < 1e-4

    # export -> import is lossless, and transformers loads the export with the same tensors
    out = tmp_path / "export"
    assert axhf.export_hf(spec, tmp_path / "ckpt", out, None) == 0, capsys.readouterr().err
    assert axhf.import_hf(spec, out, "m", tmp_path / "ckpt2") == 0, capsys.readouterr().err
    again = _restore(model, cfg, tmp_path / "ckpt2")
    for (path, a), (_, b) in zip(_leaves(params), _leaves(again)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), path
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    sd, sd2 = hf.state_dict(), hf2.state_dict()
    assert set(sd) == set(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    assert np.abs(_hf_logits(hf2, tokens) - ref).max() <= 1e-6


def _train_checkpoint(run: Path, params) -> None:
    """A checkpoint as the generated train.py writes it: Composite(state=..., data=...)."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    state = {"params": params, "opt_state": {"mu": params, "count": jnp.int32(3)},
             "step": jnp.int32(3), "bad_steps": jnp.int32(0)}
    mngr = ocp.CheckpointManager((run / "checkpoints").absolute(),
                                 options=ocp.CheckpointManagerOptions(create=True))
    mngr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                         data=ocp.args.JsonSave({"step": 3})))
    mngr.wait_until_finished()
    mngr.close()


@pytest.mark.slow
def test_export_from_train_run(tmp_path, capsys):
    """export-hf reads a train.py run (run dir, checkpoints/ dir or step dir) like a params checkpoint."""
    pytest.importorskip("transformers")
    import jax
    import torch
    import transformers

    from tests.targets_util import import_generated

    spec = _write_spec(tmp_path, "mixtral")
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    cfg = model.CONFIGS["m"]
    params = model.init_params(cfg, jax.random.key(7))
    run = tmp_path / "run"
    _train_checkpoint(run, params)
    outs = []
    for i, where in enumerate((run, run / "checkpoints", run / "checkpoints" / "3")):
        out = tmp_path / f"export{i}"
        assert axhf.export_hf(spec, where, out, None) == 0, capsys.readouterr().err
        outs.append(out)
    from safetensors.numpy import load_file

    first = load_file(outs[0] / "model.safetensors")
    for out in outs[1:]:
        other = load_file(out / "model.safetensors")
        assert set(first) == set(other) and all(np.array_equal(first[k], other[k]) for k in first)
    hf = transformers.AutoModelForCausalLM.from_pretrained(outs[0]).eval()
    table = np.asarray(params["embed"]["table"])
    assert torch.equal(hf.model.embed_tokens.weight, torch.from_numpy(table.copy()))
    w1 = np.asarray(params["blocks"]["mlp"]["w_gate"])[1, 2]  # layer 1, expert 2: [dim, hidden]
    assert np.array_equal(first["model.layers.1.block_sparse_moe.experts.2.w1.weight"], w1.T)
    # an existing export is not overwritten
    assert axhf.export_hf(spec, run, outs[0], None) == 1
    assert "already holds a model" in capsys.readouterr().err


def test_bf16_safetensors_import_exactly(tmp_path, capsys):
    """bf16 sharded checkpoints (as on the hub) load without torch and widen exactly to f32.

    Only the index's shards are read: a stray copy (as Mistral's consolidated.safetensors) is not.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import orbax.checkpoint as ocp
    from safetensors.numpy import save_file

    spec = _write_spec(tmp_path, "llama")
    hf = _hf_model("llama").to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    save_file({"tok_embeddings.weight": np.zeros((2, 2), np.float32)},
              tmp_path / "hf" / "consolidated.safetensors")
    assert axhf.import_hf(spec, tmp_path / "hf", None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore((tmp_path / "ckpt").absolute())
    table = np.asarray(params["embed"]["table"])
    assert table.dtype == np.float32
    assert np.array_equal(table, hf.model.embed_tokens.weight.detach().float().numpy())
    wk = np.asarray(params["blocks"]["attn"]["wk"])[1]  # [dim, kv_heads, head_dim]
    ref = hf.model.layers[1].self_attn.k_proj.weight.detach().float().numpy()  # [kv_heads * head_dim, dim]
    assert np.array_equal(wk.reshape(64, -1).T, ref)


def test_config_mismatches_are_named(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    spec = _write_spec(tmp_path, "mistral")
    conf = transformers.AutoConfig.for_model("mistral", **{
        **CASES["mistral"][1], "hidden_size": 128, "num_key_value_heads": 4, "sliding_window": 16,
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}})
    conf.save_pretrained(tmp_path / "hf")
    assert axhf.import_hf(spec, tmp_path / "hf", "m", tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in ("hidden_size=128", "dim = 64", "num_key_value_heads=4", "kv_heads = 2",
                   "sliding_window=16", "attention window = 8", "rope_type='dynamic'"):
        assert needle in err, (needle, err)
    assert not (tmp_path / "ckpt").exists()
    # a family the spec's structure is not: GPT-2 weights into a Mistral spec
    gpt2 = transformers.AutoConfig.for_model("gpt2", **CASES["gpt2"][1])
    gpt2.save_pretrained(tmp_path / "hf2")
    assert axhf.import_hf(spec, tmp_path / "hf2", None, tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "matches no model" in err and "positions" in err and "norm layer" in err
    # no such model
    assert axhf.import_hf(spec, tmp_path / "hf", "nope", None) == 1
    assert "has no model `nope`" in capsys.readouterr().err


def test_missing_and_unused_tensors_are_named(tmp_path, capsys):
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file

    spec = _write_spec(tmp_path, "mixtral")
    hf_dir = tmp_path / "hf"
    _hf_model("mixtral").save_pretrained(hf_dir)
    tensors = load_file(hf_dir / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    tensors["model.layers.0.mlp.extra.weight"] = np.zeros((2, 2), np.float32)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(8, np.float32)  # a buffer: ignored
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    assert axhf.import_hf(spec, hf_dir, None, tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "missing tensor model.layers.1.block_sparse_moe.experts.3.w2.weight" in err
    assert "model.layers.0.mlp.extra.weight [2, 2] maps to no parameter" in err
    assert "inv_freq" not in err
    assert not (tmp_path / "ckpt").exists()


def test_mamba2_imports_mamba_ssm_embedding_name(tmp_path, capsys):
    """mamba_ssm's checkpoints name the table backbone.embedding (transformers renames it on load)."""
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file

    from tests.targets_util import import_generated

    spec = _write_spec(tmp_path, "mamba2")
    model, _ = import_generated(spec, "cpu", tmp_path / "gen")
    hf_dir = tmp_path / "hf"
    _hf_model("mamba2").save_pretrained(hf_dir)
    tensors = load_file(hf_dir / "model.safetensors")
    table = tensors.pop("backbone.embeddings.weight")
    save_file({**tensors, "backbone.embedding.weight": table}, hf_dir / "model.safetensors", metadata={"format": "pt"})
    assert axhf.import_hf(spec, hf_dir, None, tmp_path / "ckpt") == 0, capsys.readouterr().err
    params = _restore(model, model.CONFIGS["m"], tmp_path / "ckpt")
    assert np.array_equal(np.asarray(params["embed"]["table"]), table)


def test_fused_transformers5_expert_layout_imports(tmp_path, capsys):
    """transformers 5's in-memory MoE layout (experts.gate_up_proj / down_proj) is read too."""
    pytest.importorskip("transformers")
    import orbax.checkpoint as ocp
    from safetensors.torch import save_file

    spec = _write_spec(tmp_path, "qwen3_moe")
    hf = _hf_model("qwen3_moe")
    hf.save_pretrained(tmp_path / "hub")
    assert axhf.import_hf(spec, tmp_path / "hub", None, tmp_path / "a") == 0, capsys.readouterr().err
    fused = tmp_path / "fused"
    hf.config.save_pretrained(fused)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd
    save_file(sd, fused / "model.safetensors", metadata={"format": "pt"})
    assert axhf.import_hf(spec, fused, None, tmp_path / "b") == 0, capsys.readouterr().err
    with ocp.StandardCheckpointer() as ckptr:
        a, b = ckptr.restore((tmp_path / "a").absolute()), ckptr.restore((tmp_path / "b").absolute())
    for (path, x), (_, y) in zip(_leaves(a), _leaves(b)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), path


# Published config.json values of the zoo's real models (the keys that shape the weights).
PUBLISHED = {
    ("gpt2_small", "gpt2_small"): {  # openai-community/gpt2
        "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05},
    ("gpt2_medium", "gpt2_medium"): {  # openai-community/gpt2-medium
        "model_type": "gpt2", "vocab_size": 50257, "n_embd": 1024, "n_layer": 24, "n_head": 16,
        "n_positions": 1024, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05},
    ("llama2_7b", "llama2_7b"): {  # meta-llama/Llama-2-7b-hf
        "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "hidden_act": "silu"},
    ("llama3_8b", "llama3_8b"): {  # meta-llama/Meta-Llama-3-8B
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "hidden_act": "silu"},
    ("mistral_7b", "mistral_7b"): {  # mistralai/Mistral-7B-v0.1
        "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "hidden_act": "silu"},
    ("mixtral_8x7b", "mixtral_8x7b"): {  # mistralai/Mixtral-8x7B-v0.1
        "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05,
        "rope_theta": 1e6, "sliding_window": None, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, "hidden_act": "silu"},
    ("mamba2_2_7b", "mamba2_2_7b"): {  # state-spaces/mamba2-2.7b in transformers' Mamba2Config keys
        "model_type": "mamba2", "vocab_size": 50288, "hidden_size": 2560, "num_hidden_layers": 64,
        "num_heads": 80, "head_dim": 64, "expand": 2, "state_size": 128, "n_groups": 1, "conv_kernel": 4,
        "chunk_size": 256, "use_conv_bias": True, "use_bias": False, "hidden_act": "silu",
        "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True, "residual_in_fp32": True,
        "time_step_limit": [0.0, {"__float__": "Infinity"}]},
    ("qwen3_30b_a3b", "qwen3_30b_a3b"): {  # Qwen/Qwen3-30B-A3B
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "use_sliding_window": False, "hidden_act": "silu"},
    ("gemma3_1b", "gemma3_1b"): {  # google/gemma-3-1b-pt (transformers 4.50 keys: rope_local_base_freq,
        # sliding_window_pattern; no layer_types)
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 262144},
    ("deepseek_v3", "deepseek_v3"): {  # deepseek-ai/DeepSeek-V3 (its quantization_config left out)
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
        "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
        "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128,
        "vocab_size": 129280},
}


@pytest.mark.parametrize("spec,model", list(PUBLISHED))
def test_zoo_specs_match_published_configs(spec, model):
    """The zoo's real-size specs are the published HF models, field by field (no jax, no torch)."""
    archs = {a.name: a for a in axhf.load_spec(ROOT / "specs" / f"{spec}.axl")}
    arch = archs[model]
    published = PUBLISHED[(spec, model)]
    family = axhf.family_of_config(published)
    assert axhf.mismatches(arch, family, published) == []
    assert axhf.family_of_arch(arch) == family
    # what export writes describes the same model
    written = json.loads(json.dumps(axhf.hf_config(arch, family)))
    assert axhf.mismatches(arch, family, written) == []
    # and one changed field is caught
    key = {"gpt2": "n_head", "mamba2": "num_heads"}.get(family, "num_key_value_heads")
    bad = 2 if published.get(key) == 1 else 1
    wrong = {**published, key: bad}
    assert any(m.startswith(f"config.json has {key}={bad},") for m in axhf.mismatches(arch, family, wrong))



def test_deepseek_layers_mismatch_names_both_keys():
    """The spec's `layers` counts DeepSeek's MoE layers: the message said `num_hidden_layers=58`
    for a config.json holding 61 (with 3 dense layers first)."""
    archs = {a.name: a for a in axhf.load_spec(ROOT / "specs" / "deepseek_v3.axl")}
    published = PUBLISHED[("deepseek_v3", "deepseek_v3")]
    wrong = {**published, "num_hidden_layers": 62}
    problems = axhf.mismatches(archs["deepseek_v3"], "deepseek_v3", wrong)
    assert "config.json has MoE layers (num_hidden_layers 62 - first_k_dense_replace 3)=59, the spec has layers = 58" in problems


def test_gemma2_default_scale_matches_query_pre_attn_scalar(tmp_path):
    """A Gemma 2 spec that leaves `scale` at its default (head_dim ** -0.5) was refused against a
    config.json whose query_pre_attn_scalar is head_dim: the same scale."""
    spec = ROOT / "specs" / "gemma2_2b.axl"
    cfg = axhf.hf_config({a.name: a for a in axhf.load_spec(spec)}["gemma2_2b"], "gemma2")
    (tmp_path / "g.axl").write_text(spec.read_text().replace("scale = 0.0625, ", ""))
    default = {a.name: a for a in axhf.load_spec(tmp_path / "g.axl")}["gemma2_2b"]
    assert default.facts.scale == 0.0 and axhf.mismatches(default, "gemma2", cfg) == []
    assert axhf.mismatches(default, "gemma2", {**cfg, "query_pre_attn_scalar": 224}) != []

# The config.json files Meta published on the Hugging Face hub (transformers 4.43 format:
# `rope_scaling` beside a top-level `rope_theta`).
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
LLAMA_3_2_1B = {
    **LLAMA_3_1_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "head_dim": 64,
    "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


GEMMA_2_2B = {  # google/gemma-2-2b
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "torch_dtype": "float32", "use_cache": True, "vocab_size": 256000,
}


def test_published_gemma_2_config_matches_its_spec(in_root):
    """google/gemma-2-2b's config.json (no layer_types: sliding on even layers) agrees with the zoo
    spec; a spec whose pattern starts with the global layer does not."""
    arch = axhf.pick(axhf.load_spec(Path("specs/gemma2_2b.axl")), "gemma2_2b", Path("gemma2_2b"))
    assert axhf.mismatches(arch, "gemma2", GEMMA_2_2B) == []
    swapped = {**GEMMA_2_2B, "layer_types": ["full_attention", "sliding_attention"] * 13}
    [problem] = axhf.mismatches(arch, "gemma2", swapped)
    assert problem.startswith("config.json has layer_types=") and "the layers' attention windows" in problem
    exported = axhf.hf_config(arch, "gemma2")
    assert exported["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert exported["query_pre_attn_scalar"] == 256 and exported["final_logit_softcapping"] == 30.0


def test_gemma_3_layers_take_their_rotary_and_window_from_their_layer_type(in_root):
    """gemma3_1b: five local layers (base 10k, window 512) then a global one (base 1M), 26 = 4 x 6 + 2
    (the last two local, after the scan). A config whose global layers scale their rotary (Gemma 3
    4B and up: linear x 8) is named, in transformers 5's keys as in 4.50's; the export writes
    rope_parameters per layer type, and the tail's tensors map to HF layers 24 and 25."""
    arch = axhf.pick(axhf.load_spec(Path("specs/gemma3_1b.axl")), "gemma3_1b", Path("gemma3_1b"))
    assert (arch.pattern, arch.tail) == (6, 2)
    assert arch.facts.layer_windows == (512,) * 5 + (0,) + (512,) * 5 + (0,) + (512,) * 5 + (0,) + (512,) * 5 + (0,) + (512,) * 2
    assert arch.facts.layer_ropes[5] == (1e6, "none", 1.0) and arch.facts.layer_ropes[25] == (1e4, "none", 1.0)
    published = PUBLISHED[("gemma3_1b", "gemma3_1b")]
    scaled = {**published, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    [problem] = axhf.mismatches(arch, "gemma3_text", scaled)
    assert problem.startswith("config.json has rope_parameters=") and '"factor": 8.0' in problem
    v5 = {k: v for k, v in published.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}
    [again] = axhf.mismatches(arch, "gemma3_text", v5)
    assert again.startswith("config.json has rope_parameters=") and '"factor": 8.0' in again
    assert axhf.mismatches(arch, "gemma3_text", {**v5, "rope_parameters": {
        **v5["rope_parameters"], "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}) == []
    exported = axhf.hf_config(arch, "gemma3_text")
    assert exported["rope_parameters"] == {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                           "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    assert exported["sliding_window"] == 512 and exported["attn_logit_softcapping"] is None
    from axdsl.hf.families import rules

    tail = {r.paths[0]: r for r in rules("gemma3_text", arch, None) if r.paths[0][:2] == ("blocks", "tail")}
    wq = tail[("blocks", "tail", "1", "attn", "wq")]
    assert not wq.layered and list(wq.save((np.zeros((1152, 4, 256)),), 0)) == ["model.layers.25.self_attn.q_proj.weight"]


@pytest.mark.parametrize("spec, cfg", [("llama3_1_8b", LLAMA_3_1_8B), ("llama3_2_1b", LLAMA_3_2_1B)])
def test_published_llama_3_1_and_3_2_configs_match_their_specs(spec, cfg, in_root):
    """The real checkpoints' config.json agrees with the zoo spec in every field (then the tensors
    are Llama's, which the tiny models above check); a different rope factor is named."""
    arch = axhf.pick(axhf.load_spec(Path(f"specs/{spec}.axl")), spec, Path(spec))
    assert axhf.mismatches(arch, "llama", cfg) == []
    wrong = {**cfg, "rope_scaling": {**cfg["rope_scaling"], "factor": 16.0}}
    assert axhf.mismatches(arch, "llama", wrong) == [
        "config.json has factor=16.0, the spec has attention rope_factor = " + json.dumps(cfg["rope_scaling"]["factor"])]
    exported = axhf.hf_config(arch, "llama")["rope_parameters"]
    assert exported == {"rope_type": "llama3", "rope_theta": 500000.0, **{
        k: v for k, v in cfg["rope_scaling"].items() if k != "rope_type"}}
