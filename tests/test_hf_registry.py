"""The Hugging Face family registry (axdsl/hf/families/): one module per family, asked, not named.

Fast checks of the registry's contract: every family module registers, each family's config.json
rows state real facts of transformers' defaults (and, where transformers is installed, a missing
key reads as the family's own config class default), detection asks the families in rank order,
and the family-neutral modules hold no family's name.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from axdsl.hf import families
from axdsl.hf.arch import load_spec
from axdsl.hf.config import family_of_arch, family_of_config, hf_config, mismatches
from axdsl.hf.facts import FIELDS, Arch, Facts
from axdsl.hf.fields import Row
from axdsl.hf.values import hf_values

HF = Path(families.__file__).resolve().parent.parent


def test_every_family_module_registers_one_family_named_as_its_module():
    modules = sorted(p.stem for p in (HF / "families").glob("*.py") if p.stem != "__init__")
    assert sorted(families.REGISTRY) == modules
    for name, family in families.REGISTRY.items():
        assert family.name == name and family.hf_class.endswith(
            ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForImageClassification", "Generation")
        )
    ranks = [f.rank for f in families.REGISTRY.values()]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


@pytest.mark.parametrize("name", sorted(families.REGISTRY))
def test_a_family_is_found_from_its_config_json_and_its_rows_state_facts(name):
    family = families.get(name)
    assert family_of_config({"model_type": name}) == name
    assert family_of_config({"architectures": [family.hf_class]}) == name
    values, src, unsupported = hf_values(family, {})  # transformers' defaults
    assert values and set(values) <= set(FIELDS) and set(src) == set(values)
    # the defaults are what axdsl expresses, T5Config's (T5 v1.0: relu, a tied scaled head) too:
    # T5(tied = true, mlp = MLP(act = "relu"))
    assert unsupported == [], unsupported


def test_a_row_must_name_a_fact():
    with pytest.raises(AssertionError, match="no fact"):
        Row("hidden_sise", "intermediate_size", lambda c: 0)
    with pytest.raises(AttributeError):
        Facts().hidden_sise = 3  # type: ignore[attr-defined]


# family -> a std spec of it (a zoo spec, or one at test size where the zoo has none) and its model
SPECS = {
    "bert": ("bert_tiny", "bert_tiny"),
    "vit": ("vit_tiny", "vit_tiny"),
    "t5": ("t5_tiny", "t5_tiny"),
    "mamba2": ("mamba2_2_7b", "mamba2_tiny"),
    "deepseek_v3": ("deepseek_v3", "deepseek_v3_tiny"),
    "phi": ("phi2", "phi2_tiny"),
    "gpt_neox": ("pythia_1_4b", "pythia_tiny"),
    "gemma3_text": ("gemma3_1b", "gemma3_tiny"),
    "gemma2": ("gemma2_2b", "gemma2_tiny"),
    "gpt2": ("gpt2_small", "gpt2_tiny"),
    "qwen3_moe": ("qwen3_30b_a3b", "qwen3_30b_a3b_tiny"),
    "mixtral": ("mixtral_8x7b", "mixtral_8x7b_tiny"),
    "qwen3": (
        """import "std/transformer.axl"
        model m = DecoderLM {
          vocab = 96  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
          norm = RMSNorm(eps = 1e-6)  tied = true
          block = Block(attn = Attention(head_dim = 32, qk_norm = true))
        }""",
        "m",
    ),
    "qwen2": ("qwen2_5_7b", "qwen2_5_tiny"),
    "mistral": ("mistral_7b", "mistral_7b_tiny"),
    "llama": ("llama3_2_1b", "llama3_2_tiny"),
}


def test_every_family_module_declares_its_facts_type_beside_its_entry():
    """A family's facts type is a `Facts` of its own kind (not the bare one), named in its module
    (declared there, or imported from the shared module of its relatives), and it has every fact
    the family's rows state."""
    assert sorted(SPECS) == sorted(families.REGISTRY)
    for name, family in families.REGISTRY.items():
        module = sys.modules[f"{families.__name__}.{name}"]
        assert issubclass(family.facts, Facts) and family.facts is not Facts, name
        assert getattr(module, family.facts.__name__, None) is family.facts, name
        own = {f.name for f in dataclasses.fields(family.facts)}
        assert {row.field for row in family.rows} <= own, name


def test_a_family_whose_row_states_a_fact_of_another_family_is_refused():
    llama = families.get("llama")
    deepseek = families.get("deepseek_v3")
    with pytest.raises(
        AssertionError, match="row states `attn`, which its facts type DecoderFacts has not"
    ):
        dataclasses.replace(llama, rows=llama.rows + deepseek.rows)
    with pytest.raises(AttributeError, match="T5Facts has no fact `window`"):
        families.get("t5").facts().window = 4  # type: ignore[attr-defined]


def test_a_model_of_a_root_no_family_reads_is_refused_by_name_on_export():
    """No reader types its facts: the bare Facts reads every declared fact as unknown, so export
    writes llama's config.json and the comparison names the root (no AttributeError)."""
    arch = Arch("m", Facts(), {("w",): ((2,), "float32")}, root="MyLM")
    assert family_of_arch(arch) == "llama"
    assert mismatches(arch, "llama", hf_config(arch, "llama")) == [
        "config.json is a LlamaForCausalLM (std's DecoderLM), the spec's model is a MyLM"
    ]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_family_reader_yields_the_family_facts_type(name, tmp_path):
    """The reader of a family's std spec states that family's facts type exactly (a shared reader
    types them as the family it read: a MoE decoder's MoeFacts, a plain one's DecoderFacts), and
    detection finds the family."""
    spec, model = SPECS[name]
    path = HF.parent.parent / "specs" / f"{spec}.axl"
    if "\n" in spec:
        path = tmp_path / "m.axl"
        path.write_text(spec)
    (arch,) = [a for a in load_spec(path) if a.name == model]
    assert not arch.problems and family_of_arch(arch) == name
    assert type(arch.facts) is families.get(name).facts, type(arch.facts).__name__


def test_detection_asks_the_families_in_rank_order_and_llama_claims_the_rest():
    facts = Facts()
    assert family_of_arch(Arch("m", facts, {})) == "llama"
    facts.set(mlp="MoE")
    assert family_of_arch(Arch("m", facts, {})) == "mixtral"
    facts.set(qk_norm=True)  # qwen3_moe ranks before mixtral and qwen3
    assert family_of_arch(Arch("m", facts, {})) == "qwen3_moe"


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3", "gpt2", "mamba2"])
def test_a_config_json_read_as_facts_exports_to_the_same_config(name):
    """hf_values then hf_config is a fixed point: the facts a family's rows read from its export
    are the facts it exported (the export and the rows agree on every key)."""
    family = families.get(name)
    values, _, _ = hf_values(family, {"num_hidden_layers": 4, "n_layer": 4})
    facts = Facts()
    facts.set(**{"max_seq": 128, **values})
    arch = Arch("m", facts, {("embed", "table"): ((8, 4), "float32")})
    exported = hf_config(arch, name)
    assert exported["model_type"] == name and mismatches(arch, name, exported) == []


def test_the_family_neutral_modules_name_no_family():
    names = "|".join(re.escape(n) for n in families.REGISTRY)
    quoted = re.compile(rf"[\"']({names})[\"']")
    neutral = ["arch.py", "config.py", "values.py", "importer.py", "exporter.py", "layout.py"]
    for module in neutral + ["fields.py", "facts.py", "family.py", "decoder_arch.py"]:
        found = quoted.findall((HF / module).read_text())
        assert not found, f"axdsl/hf/{module} names the families {sorted(set(found))}"


# family -> transformers config class name, and Arch fact -> how that class states it. A missing
# config.json key must read as the class's default (the class is the reference, no number here).
ONE_PER_LAYER = object()  # a fact that is a tuple of one entry per layer


def _rope_theta(t) -> float:
    return float(t.rope_parameters["rope_theta"])


def _head_dim_of(t) -> int:
    return getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads


_DECODER = {
    "vocab": lambda t: t.vocab_size,
    "dim": lambda t: t.hidden_size,
    "layers": lambda t: t.num_hidden_layers,
    "heads": lambda t: t.num_attention_heads,
    "kv_heads": lambda t: t.num_key_value_heads,
    "head_dim": _head_dim_of,
    "norm_eps": lambda t: t.rms_norm_eps,
    "rope_theta": _rope_theta,
    "tied": lambda t: t.tie_word_embeddings,
    "layer_windows": ONE_PER_LAYER,
}
_SWIGLU = {**_DECODER, "hidden": lambda t: t.intermediate_size}
_MOE = {
    **_DECODER,
    "experts": lambda t: t.num_local_experts,
    "top_k": lambda t: t.num_experts_per_tok,
}
_PARALLEL = {
    **_SWIGLU,
    "norm_eps": lambda t: t.layer_norm_eps,
    "rope_dim": lambda t: int(_head_dim_of(t) * t.rope_parameters["partial_rotary_factor"]),
}

DEFAULTS = {
    "llama": ("LlamaConfig", _SWIGLU),
    "mistral": ("MistralConfig", {**_SWIGLU, "window": lambda t: t.sliding_window or 0}),
    "mixtral": ("MixtralConfig", {**_MOE, "hidden": lambda t: t.intermediate_size}),
    "qwen2": ("Qwen2Config", _SWIGLU),
    "qwen3": ("Qwen3Config", _SWIGLU),
    "qwen3_moe": ("Qwen3MoeConfig", {**_MOE, "hidden": lambda t: t.moe_intermediate_size}),
    "phi": ("PhiConfig", _PARALLEL),
    # GPTNeoXConfig has no num_key_value_heads: as many as the query heads
    "gpt_neox": ("GPTNeoXConfig", {**_PARALLEL, "kv_heads": lambda t: t.num_attention_heads}),
    "gemma2": ("Gemma2Config", _SWIGLU),
    # Gemma 3's rope_theta is per layer type (layer_ropes)
    "gemma3_text": ("Gemma3TextConfig", {k: v for k, v in _SWIGLU.items() if k != "rope_theta"}),
    "gpt2": (
        "GPT2Config",
        {
            "vocab": lambda t: t.vocab_size,
            "dim": lambda t: t.n_embd,
            "layers": lambda t: t.n_layer,
            "heads": lambda t: t.n_head,
            "kv_heads": lambda t: t.n_head,
            "head_dim": lambda t: t.n_embd // t.n_head,
            "max_seq": lambda t: t.n_positions,
            "norm_eps": lambda t: t.layer_norm_epsilon,
            "hidden": lambda t: t.n_inner or 4 * t.n_embd,
            "tied": lambda t: t.tie_word_embeddings,
            "layer_windows": ONE_PER_LAYER,
        },
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "vocab": lambda t: t.vocab_size,
            "dim": lambda t: t.hidden_size,
            "layers": lambda t: t.num_hidden_layers - t.first_k_dense_replace,
            "dense_layers": lambda t: t.first_k_dense_replace,
            "heads": lambda t: t.num_attention_heads,
            "kv_heads": lambda t: t.num_key_value_heads,
            "norm_eps": lambda t: t.rms_norm_eps,
            "rope_theta": _rope_theta,
            "hidden": lambda t: t.moe_intermediate_size,
            "dense_hidden": lambda t: t.intermediate_size,
            "experts": lambda t: t.n_routed_experts,
            "top_k": lambda t: t.num_experts_per_tok,
            "kv_rank": lambda t: t.kv_lora_rank,
            "q_rank": lambda t: t.q_lora_rank or 0,
            "nope_dim": lambda t: t.qk_nope_head_dim,
            "rope_dim": lambda t: t.qk_rope_head_dim,
            "v_head_dim": lambda t: t.v_head_dim,
            "shared": lambda t: t.n_shared_experts,
            "tied": lambda t: t.tie_word_embeddings,
        },
    ),
    "bert": (
        "BertConfig",
        {
            "vocab": lambda t: t.vocab_size,
            "dim": lambda t: t.hidden_size,
            "layers": lambda t: t.num_hidden_layers,
            "heads": lambda t: t.num_attention_heads,
            "hidden": lambda t: t.intermediate_size,
            "max_seq": lambda t: t.max_position_embeddings,
            "norm_eps": lambda t: t.layer_norm_eps,
            "tied": lambda t: t.tie_word_embeddings,
        },
    ),
    "vit": (
        "ViTConfig",
        {
            "dim": lambda t: t.hidden_size,
            "layers": lambda t: t.num_hidden_layers,
            "heads": lambda t: t.num_attention_heads,
            "hidden": lambda t: t.intermediate_size,
            "norm_eps": lambda t: t.layer_norm_eps,
        },
    ),
    "t5": (
        "T5Config",
        {
            "vocab": lambda t: t.vocab_size,
            "dim": lambda t: t.d_model,
            "layers": lambda t: t.num_layers,
            "dec_layers": lambda t: t.num_decoder_layers,
            "heads": lambda t: t.num_heads,
            "head_dim": lambda t: t.d_kv,
            "hidden": lambda t: t.d_ff,
            "norm_eps": lambda t: t.layer_norm_epsilon,
        },
    ),
    "mamba2": (
        "Mamba2Config",
        {
            "vocab": lambda t: t.vocab_size,
            "dim": lambda t: t.hidden_size,
            "layers": lambda t: t.num_hidden_layers,
            "heads": lambda t: t.num_heads,
            "ssm_head_dim": lambda t: t.head_dim,
            "ssm_state": lambda t: t.state_size,
            "ssm_groups": lambda t: t.n_groups,
            "norm_eps": lambda t: t.layer_norm_epsilon,
            "tied": lambda t: t.tie_word_embeddings,
        },
    ),
}
# config.json keys a test sets so that the defaults that depend on others show (a family's width
# and heads), each removed in turn
_SET = {
    "gpt2": {"n_embd": 256, "n_head": 4, "n_layer": 3},
    "t5": {"d_model": 256, "num_heads": 4, "num_layers": 3},
    # Mamba2Config checks hidden_size * expand == num_heads * head_dim: no width is removed alone
    "mamba2": {"vocab_size": 1000, "num_hidden_layers": 3},
}


def test_the_defaults_table_covers_every_family():
    assert sorted(DEFAULTS) == sorted(families.REGISTRY)


@pytest.mark.parametrize("name", sorted(families.REGISTRY))
def test_a_missing_config_key_reads_as_the_transformers_config_class_default(name):
    """Every fact a config.json key states, with that key (or every key) missing, is what the
    family's installed transformers config class reads it as."""
    transformers = pytest.importorskip("transformers")
    cls_name, facts = DEFAULTS[name]
    cls = getattr(transformers, cls_name)
    full = _SET.get(name, {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 5})
    configs = [{}, full] + [{k: v for k, v in full.items() if k != key} for key in full]
    for cfg in configs:
        t = cls(**cfg)
        values, _, _ = hf_values(families.get(name), dict(cfg))
        for fact, of in facts.items():
            if of is ONE_PER_LAYER:
                assert len(values[fact]) == values["layers"], (cfg, fact)
            else:
                assert values[fact] == of(t), (cfg, fact, values[fact], of(t))
