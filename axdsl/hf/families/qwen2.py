"""qwen2: Qwen2ForCausalLM, Llama with Attention(bias = true, out_bias = false)."""

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

CONFIG = Decoder(qkv_bias_only=True)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "qwen2", "Qwen2ForCausalLM", dtype),
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": arch.facts.layers,
    }


FAMILY = Family(
    name="qwen2",
    hf_class="Qwen2ForCausalLM",
    rank=13,
    facts=DecoderFacts,
    claims=lambda arch: bool(arch.facts.attn_bias) and not arch.facts.out_bias,
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
    defaults=Defaults(vocab=151936, kv_heads=32, hidden=22016),  # Qwen2Config's
)
