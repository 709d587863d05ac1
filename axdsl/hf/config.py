"""Hugging Face families and config.json <-> Arch: detect, compare (import) and write (export)."""

from __future__ import annotations

import json
import math
from typing import Any

from axdsl.hf.arch import FIELDS, Arch
from axdsl.hf.bert import BLOCK as BERT_BLOCK
from axdsl.hf.bert import bert_config
from axdsl.hf.errors import HFError
from axdsl.hf.fields import ROPE_FIELDS, ROPE_SCALING_FIELDS, rope_parameters
from axdsl.hf.gemma import gemma2_config, gemma3_config
from axdsl.hf.values import hf_values
from axdsl.hf.vit import ROOT as VIT_ROOT
from axdsl.hf.vit import vit_config

FAMILIES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "phi": "PhiForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "bert": "BertForMaskedLM",
    "vit": "ViTForImageClassification",
    "t5": "T5ForConditionalGeneration",
}
_ARCH_TO_FAMILY = {v: k for k, v in FAMILIES.items()}


def family_of_config(cfg: dict) -> str:
    """The family of a config.json: its `model_type`, else its `architectures`."""
    mt = cfg.get("model_type")
    if mt in FAMILIES:
        return mt
    for a in cfg.get("architectures") or []:
        if a in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[a]
    raise HFError(
        f"unsupported model_type {mt!r} (architectures {cfg.get('architectures')})",
        [f"supported: {', '.join(f'{k} ({c})' for k, c in FAMILIES.items())}"],
    )


def family_of_arch(arch: Arch) -> str:
    """The HF family a spec's model exports to, from its structure."""
    if arch["block"] == BERT_BLOCK:
        return "bert"
    if arch["root"] == VIT_ROOT:
        return "vit"
    if arch["block"] == "T5":
        return "t5"
    if arch["block"] == "MambaBlock":
        return "mamba2"
    if arch["attn"] == "MLAttention" or arch["mlp"] == "DeepSeekMoE":
        return "deepseek_v3"
    if arch["block"] == "ParallelBlock":
        return "phi" if arch["shared_norm"] else "gpt_neox"
    if arch["norm"] == "GemmaRMSNorm" or arch["post_norms"]:
        return "gemma3_text" if arch["qk_norm"] else "gemma2"
    if arch["positions"] == "learned" or arch["norm"] == "LayerNorm":
        return "gpt2"
    if arch["mlp"] == "MoE":
        return "qwen3_moe" if arch["qk_norm"] else "mixtral"
    if arch["qk_norm"]:
        return "qwen3"
    if arch["attn_bias"] and not arch["out_bias"]:
        return "qwen2"
    return "mistral" if arch["window"] else "llama"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _skipped(arch: Arch, vals: dict) -> set[str]:
    """Fields that do not apply when the two sides already differ in a field above them."""
    skip = set()
    if arch["mlp"] != vals.get("mlp"):
        skip |= {
            "hidden",
            "act",
            "mlp_bias",
            "experts",
            "top_k",
            "normalize",
            "shared",
            "groups",
            "top_groups",
            "routed_scale",
            "score",
        }
    if not (arch["dense_layers"] and vals.get("dense_layers")):
        skip.add("dense_hidden")
    if arch["attn"] != vals.get("attn"):
        skip |= {
            "q_rank",
            "kv_rank",
            "nope_dim",
            "v_head_dim",
            "rope_interleaved",
            "latent_norm_eps",
            "scale",
        }
    if arch["norm"] != vals.get("norm"):
        skip.add("norm_bias")
    if arch["block"] != vals.get("block"):
        skip.add("shared_norm")
    if not (arch["rope"] and vals.get("rope")):
        skip |= {"rope_theta", "rope_dim", "rope_scaling", *ROPE_FIELDS}
    elif arch["rope_scaling"] != vals.get("rope_scaling"):
        skip |= set(ROPE_FIELDS)
    else:
        skip |= set(ROPE_FIELDS) - set(ROPE_SCALING_FIELDS.get(arch["rope_scaling"], ()))
    if not (arch["qk_norm"] and vals.get("qk_norm")):
        skip.add("qk_norm_eps")
    if arch["positions"] != "learned" or vals.get("positions") != "learned":
        skip.add("max_seq")  # only the learned position table depends on it
    return skip


def mismatches(arch: Arch, family: str, cfg: dict) -> list[str]:
    """Every way config.json and the spec's model disagree (empty: the weights map)."""
    vals, src, unsupported = hf_values(family, cfg)
    out = [f"config.json: {u} is not supported" for u in unsupported] + list(arch.problems)
    skip = _skipped(arch, vals)
    if "layer_ropes" not in vals and len(set(arch["layer_ropes"] or ())) > 1:
        out.append(
            f"the spec's layers differ in their rotary embedding ({family}'s config.json states one for "
            "all layers; Gemma 3 states one per layer type)"
        )
    for fld, value in vals.items():
        if fld in skip or _same(arch[fld], value):
            continue
        out.append(
            f"config.json has {src[fld]}, the spec has {FIELDS[fld]} = {json.dumps(arch[fld])}"
        )
    return out


def _gpt2_config(v: dict, dtype: str) -> dict:
    acts = {"gelu": "gelu_new", "relu": "relu", "silu": "silu"}
    return {
        "architectures": [FAMILIES["gpt2"]],
        "model_type": "gpt2",
        "vocab_size": v["vocab"],
        "n_embd": v["dim"],
        "n_layer": v["layers"],
        "n_head": v["heads"],
        "n_inner": v["hidden"],
        "n_positions": v["max_seq"],
        "n_ctx": v["max_seq"],
        "activation_function": acts.get(v["act"], v["act"]),
        "layer_norm_epsilon": v["norm_eps"],
        "tie_word_embeddings": v["tied"],
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def _decoder_config(v: dict, family: str, dtype: str) -> dict:
    theta = v["rope_theta"] if v["rope_theta"] is not None else 10000.0
    out = {
        "architectures": [FAMILIES[family]],
        "model_type": family,
        "vocab_size": v["vocab"],
        "hidden_size": v["dim"],
        "intermediate_size": v["hidden"],
        "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"],
        "num_key_value_heads": v["kv_heads"],
        "head_dim": v["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": v["max_seq"],
        "rms_norm_eps": v["norm_eps"],
        "rope_theta": theta,
        "rope_parameters": rope_parameters(v, theta),
        "tie_word_embeddings": v["tied"],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }
    if family in ("llama", "qwen3", "qwen3_moe"):
        out["attention_bias"] = v["attn_bias"]
    if family == "llama":
        out["mlp_bias"] = False
    if family in ("mistral", "mixtral"):
        out["sliding_window"] = v["window"] or None
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=v["layers"])
    if family == "mixtral":
        out.update(
            num_local_experts=v["experts"],
            num_experts_per_tok=v["top_k"],
            router_jitter_noise=0.0,
            output_router_logits=False,
        )
    if family == "qwen3_moe":
        out.update(
            num_experts=v["experts"],
            num_experts_per_tok=v["top_k"],
            moe_intermediate_size=v["hidden"],
            norm_topk_prob=v["normalize"],
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
        )
    return out


def _parallel_config(v: dict, family: str, dtype: str) -> dict:
    """Phi and GPT-NeoX: parallel residual blocks, LayerNorm, partial rotary."""
    theta = v["rope_theta"] if v["rope_theta"] is not None else 10000.0
    acts = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}
    out = {
        "architectures": [FAMILIES[family]],
        "model_type": family,
        "vocab_size": v["vocab"],
        "hidden_size": v["dim"],
        "intermediate_size": v["hidden"],
        "num_hidden_layers": v["layers"],
        "num_attention_heads": v["heads"],
        "hidden_act": acts.get(v["act"], v["act"]),
        "max_position_embeddings": v["max_seq"],
        "layer_norm_eps": v["norm_eps"],
        "rope_theta": theta,
        "rope_parameters": rope_parameters(v, theta),
        "tie_word_embeddings": v["tied"],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }
    out["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    if family == "phi":
        out.update(
            num_key_value_heads=v["kv_heads"], qk_layernorm=False, resid_pdrop=0.0, embd_pdrop=0.0
        )
    else:
        out.update(
            use_parallel_residual=True,
            attention_bias=v["attn_bias"],
            hidden_dropout=0.0,
            rotary_pct=out["rope_parameters"]["partial_rotary_factor"],
            rotary_emb_base=theta,
        )
    return out


def _mamba2_config(v: dict, dtype: str) -> dict:
    """Mamba-2: attention-free blocks; transformers' Mamba2Config keys."""
    return {
        "architectures": [FAMILIES["mamba2"]],
        "model_type": "mamba2",
        "vocab_size": v["vocab"],
        "hidden_size": v["dim"],
        "num_hidden_layers": v["layers"],
        "num_heads": v["heads"],
        "head_dim": v["ssm_head_dim"],
        "expand": v["ssm_expand"],
        "state_size": v["ssm_state"],
        "n_groups": v["ssm_groups"],
        "conv_kernel": v["conv_kernel"],
        "chunk_size": v["chunk"],
        "use_conv_bias": v["conv_bias"],
        "use_bias": False,
        "hidden_act": "silu",
        "layer_norm_epsilon": v["norm_eps"],
        "tie_word_embeddings": v["tied"],
        "residual_in_fp32": True,
        "initializer_range": 0.1,
        "use_cache": True,
        "dtype": dtype,
    }


def _deepseek_config(v: dict, dtype: str) -> dict:
    """DeepSeek-V3: latent attention, dense first layers, then DeepSeek's MoE."""
    theta = v["rope_theta"] if v["rope_theta"] is not None else 10000.0
    rope = rope_parameters({**v, "rope_dim": None}, theta)
    return {
        "architectures": [FAMILIES["deepseek_v3"]],
        "model_type": "deepseek_v3",
        "vocab_size": v["vocab"],
        "hidden_size": v["dim"],
        "intermediate_size": v["dense_hidden"] or v["hidden"],
        "moe_intermediate_size": v["hidden"],
        "num_hidden_layers": v["dense_layers"] + v["layers"],
        "first_k_dense_replace": v["dense_layers"],
        "num_attention_heads": v["heads"],
        "num_key_value_heads": v["kv_heads"],
        "q_lora_rank": v["q_rank"] or None,
        "kv_lora_rank": v["kv_rank"],
        "qk_nope_head_dim": v["nope_dim"],
        "qk_rope_head_dim": v["rope_dim"],
        "v_head_dim": v["v_head_dim"],
        "rope_interleave": v["rope_interleaved"],
        "n_routed_experts": v["experts"],
        "num_experts_per_tok": v["top_k"],
        "n_group": v["groups"],
        "topk_group": v["top_groups"],
        "routed_scaling_factor": v["routed_scale"],
        "norm_topk_prob": v["normalize"],
        "n_shared_experts": v["shared"],
        "hidden_act": "silu",
        "max_position_embeddings": v["max_seq"],
        "rms_norm_eps": v["norm_eps"],
        "rope_theta": theta,
        "rope_parameters": rope,
        "attention_bias": False,
        "tie_word_embeddings": v["tied"],
        "num_nextn_predict_layers": 0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
    }


def hf_config(arch: Arch, family: str) -> dict:
    """The config.json of `arch` as a `family` model (export)."""
    dtypes = {a[1] for a in arch.params.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    if family == "gpt2":
        return _gpt2_config(arch.values, dtype)
    if family in ("phi", "gpt_neox"):
        return _parallel_config(arch.values, family, dtype)
    if family == "gemma2":
        return gemma2_config(arch.values, dtype)
    if family == "gemma3_text":
        return gemma3_config(arch.values, dtype)
    if family == "mamba2":
        return _mamba2_config(arch.values, dtype)
    if family == "deepseek_v3":
        return _deepseek_config(arch.values, dtype)
    if family == "bert":
        return bert_config(arch.values, dtype)
    if family == "vit":
        return vit_config(arch.values, dtype)
    if family == "t5":
        from axdsl.hf.t5 import hf_config as t5_config

        return t5_config(arch, dtype)
    return _decoder_config(arch.values, family, dtype)
