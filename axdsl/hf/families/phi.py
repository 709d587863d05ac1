"""phi: PhiForCausalLM (Phi 1, 1.5, 2): ParallelBlock(shared_norm = true), LayerNorm, biases,
head_bias, rope_dim (partial rotary).

Phi's tensors: Llama's q/k/v names with biases, `dense` out, fc1/fc2, one LayerNorm per block.
"""

from __future__ import annotations

from axdsl.hf.decoder_arch import DecoderFacts, read_decoder
from axdsl.hf.facts import Arch
from axdsl.hf.family import Family
from axdsl.hf.fields import Defaults, _when, rope_type_check
from axdsl.hf.layout import _Rules, decoder_layout, layer_norm, linear, out_proj
from axdsl.hf.parallel import Parallel, parallel_config, parallel_rows

CONFIG = Parallel(act="gelu_new", biased=None, shared_norm=True, head_bias=True)


def _export(arch: Arch[DecoderFacts], dtype: str) -> dict:
    return {
        **parallel_config(arch, "phi", "PhiForCausalLM", dtype),
        "num_key_value_heads": arch.facts.kv_heads,
        "qk_layernorm": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    }


def _block(r: _Rules[DecoderFacts]) -> str:
    """Phi: Llama's q/k/v names with biases, `dense` out, fc1/fc2, one LayerNorm per block."""
    _, heads, kv, _ = r.dims
    pre = r.prefix("model.")
    L = pre + "layers.{i}."
    r.same("embed/table", pre + "embed_tokens.weight", False)
    layer_norm(r, "final_norm", pre + "final_layernorm", False)
    layer_norm(r, "blocks/attn_norm", L + "input_layernorm")
    a = L + "self_attn."
    for n, key, count in (("q", "q_proj", heads), ("k", "k_proj", kv), ("v", "v_proj", kv)):
        r.heads_in(f"blocks/attn/w{n}", a + key + ".weight", count)
        r.heads_bias(f"blocks/attn/b{n}", a + key + ".bias", count)
    out_proj(r, a + "dense")
    linear(r, "blocks/mlp/in", L + "mlp.fc1")
    linear(r, "blocks/mlp/out", L + "mlp.fc2")
    return "lm_head"


FAMILY = Family(
    name="phi",
    hf_class="PhiForCausalLM",
    rank=5,
    facts=DecoderFacts,
    claims=lambda arch: isinstance(arch.facts, DecoderFacts)
    and arch.facts.block == "ParallelBlock"
    and bool(arch.facts.shared_norm),
    root="DecoderLM",
    read=read_decoder,
    rows=parallel_rows(CONFIG),
    unsupported=(
        rope_type_check,
        lambda c: _when(
            c.cfg.get("qk_layernorm", False), "qk_layernorm=true (LayerNorm q/k norms)"
        ),
    ),
    export=_export,
    layout=decoder_layout(_block),
    # PhiConfig's
    defaults=Defaults(
        vocab=51200, dim=2048, layers=24, heads=32, hidden=8192, rms_eps=1e-5, partial_rotary=0.5
    ),
)
