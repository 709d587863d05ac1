"""mistral: MistralForCausalLM, Llama with a sliding window (Attention(window = W))."""

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

CONFIG = Decoder(windowed=True, default_window=4096)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "mistral", "MistralForCausalLM", dtype),
        "sliding_window": arch.facts.window or None,
    }


FAMILY = Family(
    name="mistral",
    hf_class="MistralForCausalLM",
    rank=14,
    facts=DecoderFacts,
    claims=lambda arch: isinstance(arch.facts, DecoderFacts) and bool(arch.facts.window),
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
    defaults=Defaults(kv_heads=8, hidden=14336),  # MistralConfig's
)
