"""The Hugging Face family registry (axdsl/hf/families/): one module per family, asked, not named.

Fast checks of the registry's contract, without transformers: every family module registers, each
family's config.json rows state real facts of transformers' defaults, detection asks the families
in rank order, and the family-neutral modules hold no family's name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from axdsl.hf import families
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
    # the defaults are what axdsl expresses, but T5Config's: T5 v1.0 (relu, scaled tied head)
    assert len(unsupported) == (2 if name == "t5" else 0), unsupported


def test_a_row_must_name_a_fact():
    with pytest.raises(AssertionError, match="no fact"):
        Row("hidden_sise", "intermediate_size", lambda c: 0)
    with pytest.raises(AttributeError):
        Facts().hidden_sise = 3  # type: ignore[attr-defined]


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
