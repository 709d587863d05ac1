"""qwen3: Qwen3ForCausalLM, Llama with Attention(qk_norm = true)."""

from __future__ import annotations

from axdsl.hf.decoder import (
    Decoder,
    decoder_config,
    decoder_rows,
    decoder_rules,
    decoder_unsupported,
)
from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.facts import Arch
from axdsl.hf.family import Family
from axdsl.hf.fields import Defaults

CONFIG = Decoder(qk_norm=True)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "qwen3", "Qwen3ForCausalLM", dtype),
        "attention_bias": arch.facts.attn_bias,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": arch.facts.layers,
    }


FAMILY = Family(
    name="qwen3",
    hf_class="Qwen3ForCausalLM",
    rank=12,
    facts=DecoderFacts,
    claims=lambda arch: bool(arch.facts.qk_norm),
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
    defaults=Defaults(vocab=151936, kv_heads=32, hidden=22016, head_dim=128),  # Qwen3Config's
)
