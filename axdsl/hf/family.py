"""What a Hugging Face family is to axdsl: one registry entry (axdsl/hf/families/<name>.py).

A `Family` gathers everything the family-neutral code (arch.py, values.py, config.py, layout.py,
importer.py) asks of a family, so that no module branches on a family's name:

    name, hf_class    config.json's model_type and architectures[0]
    claims, rank      whether a spec's model exports as this family (asked in rank order)
    root, read        the std root layer whose IR the family reads, and its reader (arch_of)
    rows, unsupported config.json -> the facts an Arch states, and the keys axdsl cannot express
    defaults          transformers' config-class defaults the shared rows read
    export            the config.json export writes
    layout            the tensor rules (HF tensors <-> axdsl parameters)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from axdsl.hf.facts import Arch
from axdsl.hf.fields import Defaults, Row, Unsupported
from axdsl.hf.layout import Rule

Reader = Callable[[Arch, Any], Arch]  # (arch with its params, the root IR instance) -> filled arch
Export = Callable[[Arch, str], dict]  # (arch, dtype name) -> config.json
Layout = Callable[[Arch, "set[str] | None"], list[Rule]]  # (arch, checkpoint keys) -> rules


@dataclass(frozen=True)
class Family:
    """One Hugging Face family: its names, its config.json rows, its export and its layout."""

    name: str  # config.json's model_type
    hf_class: str  # the transformers class (architectures[0])
    rank: int  # the order `claims` is asked in (the first family that claims a model wins)
    claims: Callable[[Arch], bool]  # whether a spec's model exports as this family
    root: str  # the std root layer the family's spec models have
    read: Reader
    rows: tuple[Row, ...]
    unsupported: tuple[Unsupported, ...]
    export: Export
    layout: Layout
    defaults: Defaults = Defaults()
    # tensors of related checkpoints the family's model has not: skipped on import, with a note
    skipped: re.Pattern[str] | None = None
    skipped_what: str = ""  # what the skipped tensors are, for the note
    # a tied head a checkpoint may store anyway: it must equal the token embedding
    tied_head: str = "lm_head.weight"
