"""mixtral: MixtralForCausalLM, Llama with a MoE (normalize = true) and an optional window."""

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
from axdsl.hf.fields import Defaults


def _moe_names(keys: set[str] | None) -> tuple[str, tuple[str, str, str]]:
    """The hub's block_sparse_moe with experts' w1 (gate), w3 (up), w2 (down); transformers 5
    renames the module `mlp`."""
    if keys is not None and not any(
        ".block_sparse_moe." in k or k.startswith("block_sparse_moe.") for k in keys
    ):
        return "mlp.", ("w1", "w3", "w2")
    return "block_sparse_moe.", ("w1", "w3", "w2")


CONFIG = Decoder(
    windowed=True,
    moe=Moe(experts=8, top_k=2, hidden_key="intermediate_size", hidden=14336, normalize_key=None),
    moe_names=_moe_names,
)


def _export(arch: Arch[MoeFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "mixtral", "MixtralForCausalLM", dtype),
        "sliding_window": arch.facts.window or None,
        "num_local_experts": arch.facts.experts,
        "num_experts_per_tok": arch.facts.top_k,
        "router_jitter_noise": 0.0,
        "output_router_logits": False,
    }


FAMILY = Family(
    name="mixtral",
    hf_class="MixtralForCausalLM",
    rank=11,
    facts=MoeFacts,
    claims=lambda arch: arch.facts.mlp == "MoE",
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
    defaults=Defaults(kv_heads=8, rms_eps=1e-5, rope_theta=1e6),  # MixtralConfig's
)
