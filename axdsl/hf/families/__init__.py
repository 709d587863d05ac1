"""The Hugging Face family registry: every family axdsl imports and exports, one module each.

    axdsl/hf/families/<model_type>.py   FAMILY = Family("llama", "LlamaForCausalLM", rank=...,
                                                 facts=DecoderFacts, ...)

Every module of this package that defines `FAMILY` is registered, so adding a family is one new
module (plus its tests): arch_of, hf_values, mismatches, hf_config, rules and import-hf look the
family up here and never branch on its name. Each family has a typed facts class (`Family.facts`),
declared beside its entry (bert, vit, t5, mamba2, deepseek_v3) or shared with its relatives
(DecoderFacts in decoder_arch.py, MoeFacts in decoder.py). Pieces several families share stay in
shared modules of axdsl/hf/ (fields.py, decoder.py, parallel.py, gemma.py, layout.py,
decoder_arch.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from axdsl.hf.facts import Arch, Facts
from axdsl.hf.family import Family, Reader
from axdsl.hf.layout import Rule

__all__ = ["REGISTRY", "Family", "get", "of_arch", "roots", "rules"]


def _load() -> dict[str, Family[Any]]:
    found: list[Family[Any]] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if family is not None:
            found.append(family)
    registry: dict[str, Family[Any]] = {}
    for family in sorted(found, key=lambda f: f.rank):
        if family.name in registry:
            raise AssertionError(f"family `{family.name}` is defined twice")
        registry[family.name] = family
    if len({f.rank for f in found}) != len(found):
        raise AssertionError("two families share a rank: the order `claims` is asked in is unclear")
    return registry


REGISTRY: dict[str, Family[Any]] = _load()  # in rank order


def get(name: str) -> Family[Any]:
    return REGISTRY[name]


def of_arch(arch: Arch[Facts]) -> Family[Any]:
    """The first family (in rank order) that claims a spec's model."""
    for family in REGISTRY.values():
        if family.claims(arch):
            return family
    raise AssertionError("no family claims the model (the last one must claim every model)")


def roots() -> dict[str, Reader]:
    """std root layer -> the reader of its IR (the families sharing a root share its reader)."""
    out: dict[str, Reader] = {}
    for family in REGISTRY.values():
        if out.setdefault(family.root, family.read) is not family.read:
            raise AssertionError(f"the families of root {family.root} read it differently")
    return out


def rules(family: str, arch: Arch[Facts], keys: set[str] | None) -> list[Rule]:
    """The mapping of every parameter `arch` has, as `family` lays it out. `keys` (import) picks
    among equivalent layouts."""
    return get(family).layout(arch, keys)
