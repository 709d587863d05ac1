"""gemma3_text: Gemma3ForCausalLM: Gemma 2's layout plus q/k norms and a rotary embedding per
layer type. The pieces Gemma 2 and 3 share are axdsl/hf/gemma.py's."""

from __future__ import annotations

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.family import Family
from axdsl.hf.gemma import GEMMA, GEMMA3_FIELDS, GEMMA3_UNSUPPORTED, gemma3_config, is_gemma
from axdsl.hf.layout import decoder_layout, llama_block

FAMILY = Family(
    name="gemma3_text",
    hf_class="Gemma3ForCausalLM",
    rank=7,
    facts=DecoderFacts,
    claims=lambda arch: is_gemma(arch) and bool(arch.facts.qk_norm),
    root="DecoderLM",
    read=read_decoder,
    rows=GEMMA3_FIELDS,
    unsupported=GEMMA3_UNSUPPORTED,
    export=gemma3_config,
    layout=decoder_layout(lambda r: llama_block(r, sandwich=True)),
    defaults=GEMMA,
)
