"""llama: LlamaForCausalLM (RoPE, RMSNorm, SwiGLU), the family a DecoderLM no other claims is."""

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

CONFIG = Decoder()


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    return {
        **decoder_config(arch, "llama", "LlamaForCausalLM", dtype),
        "attention_bias": arch.facts.attn_bias,
        "mlp_bias": False,
    }


FAMILY = Family(
    name="llama",
    hf_class="LlamaForCausalLM",
    rank=15,
    facts=DecoderFacts,
    claims=lambda arch: True,
    root="DecoderLM",
    read=read_decoder,
    rows=decoder_rows(CONFIG),
    unsupported=decoder_unsupported(CONFIG),
    export=_export,
    layout=decoder_rules(CONFIG),
)
