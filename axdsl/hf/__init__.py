"""Hugging Face interop: `axdsl import-hf` and `axdsl export-hf`.

    axdsl import-hf SPEC HF_DIR [--model NAME] [--out DIR]
        safetensors -> orbax params checkpoint
    axdsl export-hf SPEC CKPT_DIR OUT_DIR [--model NAME]
        orbax checkpoint -> config.json + model.safetensors

Families (detected from config.json's `model_type`, or chosen from the spec's structure on export):

    family       transformers class          axdsl structure (std/transformer.axl)
    gpt2         GPT2LMHeadModel             learned positions, LayerNorm, biased attention,
                                             MLP(act = "gelu")
    llama        LlamaForCausalLM            RoPE, RMSNorm, SwiGLU
    mistral      MistralForCausalLM          llama with Attention(window = W)
    mixtral      MixtralForCausalLM          llama with MoE (normalize = true), optional window
    qwen2        Qwen2ForCausalLM            llama with Attention(bias = true, out_bias = false)
    qwen3        Qwen3ForCausalLM            llama with Attention(qk_norm = true)
    qwen3_moe    Qwen3MoeForCausalLM         qk_norm and MoE (normalize = norm_topk_prob)
    phi          PhiForCausalLM              ParallelBlock(shared_norm = true), LayerNorm, biases,
                                             head_bias, rope_dim
    gpt_neox     GPTNeoXForCausalLM          ParallelBlock(), LayerNorm, biases,
                                             MLP(act = "gelu_exact"), rope_dim
    deepseek_v3  DeepseekV3ForCausalLM       std/deepseek.axl: MLAttention, dense_layers of SwiGLU,
                                             then DeepSeekMoE
    bert         BertForMaskedLM             std/bert.axl's BertMLM: post-norm BertBlocks, token
                                             types, tied MLM head (families/bert.py)
    vit          ViTForImageClassification   std/vit.axl: VisionTransformer (patches, class token;
                                             families/vit.py)
    t5           T5ForConditionalGeneration  std/t5.axl's T5 (v1.1, Flan-T5): relative buckets,
                                             gated GELU, cross-attention; T5 v1.0 with tied =
                                             true and mlp = MLP(act = "relu"); families/t5.py

Llama-family rope scalings map to Attention's rope_* settings: rope_parameters' rope_type
"llama3" (factor, low/high_freq_factor, original_max_position_embeddings), "linear" and "yarn"
(beta_fast/slow, mscale, mscale_all_dim, attention_factor, truncate); partial_rotary_factor (Phi,
GPT-NeoX's rotary_pct) is rope_dim / head_dim.

**The checkpoint** that `import-hf` writes (default `runs/<spec-stem>-hf/params`) is a params-only
orbax checkpoint, written with `ocp.StandardCheckpointer`, whose tree is exactly the tree of the
generated `init_params(cfg, key)` (nested dicts; the repeated blocks' parameters stacked with a
leading `layers` dim), each array in the model's `param_dtype`. Restore it with

    abstract = jax.eval_shape(lambda k: model.init_params(cfg, k), jax.random.key(0))
    params = ocp.StandardCheckpointer().restore(path, abstract)

`export-hf` reads such a params checkpoint, or a `train.py` run: the run directory, its
`checkpoints/` directory (newest step) or one step directory, whose orbax Composite holds a
"state" item with `state["params"]` (only the params are read).

**The layout mapping** (HF nn.Linear weights are [out, in]; axdsl's are [in, ...]):

    embed_tokens / wte                 [vocab, dim]          embed/table
    lm_head                            [vocab, dim]          head [dim, vocab] (absent when tied)
    q_proj                             [heads*hd, dim]       attn/wq [dim, heads, hd]
    k_proj, v_proj                     [kv*hd, dim]          attn/wk, wv [dim, kv_heads, hd]
    o_proj                             [dim, heads*hd]       attn/wo [heads, hd, dim]
    q_norm, k_norm                     [hd]                  attn/q_norm/scale, k_norm/scale
    gate_proj, up_proj / down_proj     [ffn, dim] / [dim, ffn]  mlp/w_gate, w_up [dim, ffn] /
                                                            w_down [ffn, dim]
    router gate                        [experts, dim]        mlp/router [dim, experts]
    experts.E.w1 (gate_proj), w3 (up_proj)  [ffn, dim]       mlp/w_gate, w_up [experts, dim, ffn]
    experts.E.w2 (down_proj)           [dim, ffn]            mlp/w_down [experts, ffn, dim]
    GPT-2 c_attn (Conv1D [in, out])    [dim, 3*dim]          split into wq, wk, wv; c_attn.bias
                                                             into bq, bk, bv
    GPT-2 c_proj, c_fc, mlp.c_proj     [in, out]             wo (reshaped), w_in, w_out as they are
    Phi dense, fc1, fc2 (+ biases)     nn.Linear             wo, mlp/w_in, w_out (bo, b_in, b_out)
    GPT-NeoX query_key_value           [heads*3*hd, dim]     rows grouped per head as (q, k, v):
                                                             wq, wk, wv (and biases)
    GPT-NeoX dense_h_to_4h/_4h_to_h    nn.Linear             mlp/w_in, w_out; embed_in/embed_out
                                                             = embed, head
    lm_head.bias (Phi)                 [vocab]               head_b
    ln_1/ln_2/ln_f weight, bias        [dim]                 attn_norm, mlp_norm, final_norm
                                                             scale, shift
    DeepSeek q_a_proj, q_b_proj        [q_rank, dim], [heads*qk, q_rank]
                                                             attn/wq_a [dim, q_rank],
                                                             wq_b [q_rank, heads, qk]
    DeepSeek kv_a_proj_with_mqa        [kv_rank+rope, dim]   attn/wkv_a [dim, kv_rank+rope]
                                                             (latent, then the shared rotary key)
    DeepSeek kv_b_proj                 [heads*(nope+v), kv_rank]
                                                             attn/wkv_b [kv_rank, heads, nope+v]
    q_a_layernorm, kv_a_layernorm      [q_rank], [kv_rank]   attn/q_norm/scale,
                                                             attn/kv_norm/scale
    mlp.gate.e_score_correction_bias   [experts]             mlp/score_bias; mlp.shared_experts.*
                                                             -> mlp/shared_mlp/*
    DeepSeek layers 0..k-1 / k..       first_k_dense_replace dense_blocks (stacked) /
                                                             blocks (stacked)

Layer i of HF is index i of the stacked `blocks` arrays. Rotary embeddings need no permutation:
HF checkpoints use the half-split (rotate_half) layout, as axdsl's `rope` does. Mixtral and
Qwen3-MoE experts are read from per-expert tensors (the hub layout, also what transformers 5 writes)
or from transformers 5's fused `experts.gate_up_proj` / `experts.down_proj`; export writes the
per-expert layout.

Before any tensor is read, config.json is checked against the spec's model (dims, heads, head_dim,
norm kind and eps, rope theta, window, tied head, feed-forward kind and width, experts, top-k,
...) and every difference is reported. Every axdsl parameter must be filled and every HF tensor
used (a tied `lm_head` equal to the embedding and HF's non-parameter buffers excepted). Needs the
`safetensors` package (numpy only; torch is not needed).

**The package**: one module per family in `families/` (the registry: a family is added by adding
a module that defines `FAMILY`), and the family-neutral modules, one per concern:

    errors.py          HFError, exit codes
    facts.py           Arch (generic in its facts type), Facts and AttentionFacts, FIELDS
    family.py          Family: what a registry entry holds (facts type, rows, export, layout, ...)
    families/          the registry; <model_type>.py per family (bert, vit and t5 with their notes)
    arch.py            arch_of: the spec's model read from its IR by its root's reader
    decoder_arch.py    DecoderFacts, and the reader of std's DecoderLM (every decoder's spec side)
    fields.py          config.json -> Arch fields: the rows' pieces, shared defaults, rope rows
    decoder.py         the Llama-shaped families' MoeFacts, shared rows, export and layout
    parallel.py        Phi's and GPT-NeoX's shared rows and export (typed `Parallel`)
    gemma.py           Gemma 2's and Gemma 3's shared rows and export
    values.py          hf_values: a family's rows walked over a config.json
    config.py          family detection, `mismatches` (import) and `hf_config` (export)
    layout.py          tensor layouts: `Rule`, the DecoderLM frame and its patterns, shared blocks
    safetensors_io.py  the safetensors files of a directory, read lazily
    checkpoint.py      orbax params checkpoints: write, find, read
    importer.py        `import_hf`
    exporter.py        `export_hf`
    lora_merge.py      LoRA adapters: merge into the weights, `export-lora`

**Typed facts**: each family states its facts as a type of its own (`Family.facts`), declared
beside its entry or shared with its relatives; its reader states one, its export and layout read
one (mypy flags a fact the family has not), and its rows state only that type's fields:

    Facts                    sizes, norm, attention and feed-forward basics (every family)
      BertFacts              + token types                                  bert
      T5Facts                + decoder layers, relative buckets             t5
      AttentionFacts         + window, scale, softcap, post_norms (std's Block and Attention)
        VitFacts             + images, patches, classes                     vit
        DecoderFacts         + rotary, per-layer windows, DecoderLM extras  gpt2, llama, mistral,
                                                   qwen2, qwen3, phi, gpt_neox, gemma2, gemma3_text
          MoeFacts           + experts                                      mixtral, qwen3_moe
            DeepSeekFacts    + latent attention, dense blocks, expert groups  deepseek_v3
          Mamba2Facts        + the Mamba2Mixer                              mamba2

DecoderLM's reader types what it read as the smallest DecoderFacts type that has it all. The
family-neutral code (detection, config.json comparison) reads a base `Facts` and the others' facts
by name (`Facts.get`).

"""

from axdsl.hf.arch import FIELDS, Arch, arch_of, load_spec, pick
from axdsl.hf.config import FAMILIES, family_of_arch, family_of_config, hf_config, mismatches
from axdsl.hf.errors import HFError
from axdsl.hf.exporter import export_hf
from axdsl.hf.importer import convert_from_hf, import_hf
from axdsl.hf.families import REGISTRY, rules
from axdsl.hf.layout import Rule

__all__ = [
    "FAMILIES",
    "FIELDS",
    "Arch",
    "HFError",
    "Rule",
    "arch_of",
    "convert_from_hf",
    "export_hf",
    "family_of_arch",
    "family_of_config",
    "hf_config",
    "REGISTRY",
    "import_hf",
    "load_spec",
    "mismatches",
    "pick",
    "rules",
]
