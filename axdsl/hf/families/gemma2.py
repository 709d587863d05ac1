"""gemma2: Gemma2ForCausalLM: sandwich norms, GeGLU, soft caps, alternating sliding and full
attention. The pieces Gemma 2 and 3 share are axdsl/hf/gemma.py's."""

from __future__ import annotations

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.family import Family
from axdsl.hf.gemma import GEMMA, GEMMA2_FIELDS, GEMMA2_UNSUPPORTED, gemma2_config, is_gemma
from axdsl.hf.layout import decoder_layout, llama_block

FAMILY = Family(
    name="gemma2",
    hf_class="Gemma2ForCausalLM",
    rank=8,
    facts=DecoderFacts,
    claims=is_gemma,
    root="DecoderLM",
    read=read_decoder,
    rows=GEMMA2_FIELDS,
    unsupported=GEMMA2_UNSUPPORTED,
    export=gemma2_config,
    layout=decoder_layout(lambda r: llama_block(r, sandwich=True)),
    defaults=GEMMA,
)
