"""qwen3_moe: Qwen3MoeForCausalLM, qk_norm and a MoE (normalize = norm_topk_prob) in every block."""

from __future__ import annotations

from axdsl.hf.decoder import (
    Decoder,
    decoder_config,
    decoder_rows,
    decoder_rules,
    decoder_unsupported,
)
from axdsl.hf.decoder_arch import read_decoder
from axdsl.hf.facts import Arch
from axdsl.hf.family import Family
from axdsl.hf.decoder import Moe, MoeFacts
from axdsl.hf.fields import Defaults, _when

CONFIG = Decoder(
    qk_norm=True,
    moe=Moe(
        experts=128,
        top_k=8,
        hidden_key="moe_intermediate_size",
        hidden=768,
        normalize_key="norm_topk_prob",
    ),
    unsupported=(
        lambda c: _when(
            bool(c.cfg.get("mlp_only_layers")),
            f"mlp_only_layers={c.cfg.get('mlp_only_layers')} (every axdsl block is MoE)",
        ),
        lambda c: _when(
            c.get("decoder_sparse_step", 1) != 1,
            f"decoder_sparse_step={c.cfg.get('decoder_sparse_step')} (every axdsl block is MoE)",
        ),
    ),
)


def _export(arch: Arch[MoeFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "qwen3_moe", "Qwen3MoeForCausalLM", dtype),
        "attention_bias": arch.facts.attn_bias,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": arch.facts.layers,
        "num_experts": arch.facts.experts,
        "num_experts_per_tok": arch.facts.top_k,
        "moe_intermediate_size": arch.facts.hidden,
        "norm_topk_prob": arch.facts.normalize,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
    }


FAMILY = Family(
    name="qwen3_moe",
    hf_class="Qwen3MoeForCausalLM",
    rank=10,
    facts=MoeFacts,
    claims=lambda arch: arch.facts.mlp == "MoE" and bool(arch.facts.qk_norm),
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
    # Qwen3MoeConfig's (the experts' width is the Moe's moe_intermediate_size)
    defaults=Defaults(vocab=151936, dim=2048, layers=24, kv_heads=4),
)
