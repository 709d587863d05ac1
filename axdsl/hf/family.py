"""What a Hugging Face family is to axdsl: one registry entry (axdsl/hf/families/<name>.py).

A `Family` gathers everything the family-neutral code (arch.py, values.py, config.py, layout.py,
importer.py) asks of a family, so that no module branches on a family's name:

    name, hf_class    config.json's model_type and architectures[0]
    facts             the family's typed facts (a `Facts` type: its reader states one, its
                      export and layout read one, its rows state its fields)
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
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

from axdsl.hf.facts import Arch, Facts
from axdsl.hf.fields import Defaults, Row, Unsupported
from axdsl.hf.layout import Rule

F = TypeVar("F", bound=Facts)
# (arch with its params and bare facts, the root IR instance) -> the arch with the reader's facts;
# the families of one root share its reader, which types the facts as the family they are of
Reader = Callable[[Arch[Facts], Any], Arch[Facts]]
Export = Callable[[Arch[F], str], dict]  # (arch, dtype name) -> config.json
Layout = Callable[[Arch[F], "set[str] | None"], list[Rule]]  # (arch, checkpoint keys) -> rules


@dataclass(frozen=True)
class Family(Generic[F]):
    """One Hugging Face family: its names, its facts type, its config.json rows, its export and
    its layout."""

    name: str  # config.json's model_type
    hf_class: str  # the transformers class (architectures[0])
    rank: int  # the order `claims` is asked in (the first family that claims a model wins)
    facts: type[F]  # the family's facts: what its reader states and its export and layout read
    claims: Callable[[Arch[Facts]], bool]  # whether a spec's model exports as this family
    root: str  # the std root layer the family's spec models have
    read: Reader
    rows: tuple[Row, ...]
    unsupported: tuple[Unsupported, ...]
    export: Export[F]
    layout: Layout[F]
    defaults: Defaults = Defaults()
    # tensors of related checkpoints the family's model has not: skipped on import, with a note
    skipped: re.Pattern[str] | None = None
    skipped_what: str = ""  # what the skipped tensors are, for the note
    # a tied head a checkpoint may store anyway: it must equal the token embedding
    tied_head: str = "lm_head.weight"

    def __post_init__(self) -> None:
        own = {f.name for f in fields(self.facts)}
        for row in self.rows:
            if row.field not in own:
                raise AssertionError(
                    f"family `{self.name}`'s row states `{row.field}`, which its facts type "
                    f"{self.facts.__name__} has not"
                )
