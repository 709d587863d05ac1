"""`hf_values`: walk a family's table of config.json rows (its registry entry) into Arch facts."""

from __future__ import annotations

import json
from typing import Any

from axdsl.hf.errors import HFError
from axdsl.hf.family import Family
from axdsl.hf.fields import Config


def hf_values(family: Family, cfg: dict) -> tuple[dict, dict, list[str]]:
    """config.json -> (field values as an Arch states them, field -> "key=value", unsupported)."""
    c = Config(family.name, cfg, family.defaults)
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    for row in family.rows:
        try:
            value = row.value(c)
            raw = None if row.raw is None else row.raw(c)
            key = row.key(c) if callable(row.key) else row.key
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:  # a wrong type
            raise HFError(
                f"config.json: cannot read the model's {row.field} from it: {exc}",
                ["is a field of the wrong type (a string, a list) or zero?"],
            ) from None
        vals[row.field] = value
        src[row.field] = f"{key}={json.dumps(value if raw is None else raw)}"
    unsupported = [m for check in family.unsupported if (m := check(c)) is not None]
    return vals, src, unsupported
