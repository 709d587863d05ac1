"""`hf_values`: walk a family's table of config.json rows (axdsl/hf/fields.py) into Arch facts."""

from __future__ import annotations

import json
from typing import Any

from axdsl.hf.bert import BERT_FIELDS, BERT_UNSUPPORTED
from axdsl.hf.fields import (
    DECODER_FIELDS,
    DECODER_UNSUPPORTED,
    DEEPSEEK_FIELDS,
    DEEPSEEK_UNSUPPORTED,
    GPT2_FIELDS,
    GPT2_UNSUPPORTED,
    MAMBA2_FIELDS,
    MAMBA2_UNSUPPORTED,
    PARALLEL_FIELDS,
    PARALLEL_UNSUPPORTED,
    Config,
)
from axdsl.hf.gemma import GEMMA2_FIELDS, GEMMA2_UNSUPPORTED, GEMMA3_FIELDS, GEMMA3_UNSUPPORTED
from axdsl.hf.vit import VIT_FIELDS, VIT_UNSUPPORTED


def hf_values(family: str, cfg: dict) -> tuple[dict, dict, list[str]]:
    """config.json -> (field values as an Arch states them, field -> "key=value", unsupported)."""
    if family == "t5":  # an encoder-decoder: its rows live in axdsl/hf/t5.py
        from axdsl.hf.t5 import hf_values as t5_values

        return t5_values(cfg)
    c = Config(family, cfg)
    fields, checks = {
        "gpt2": (GPT2_FIELDS, GPT2_UNSUPPORTED),
        "phi": (PARALLEL_FIELDS, PARALLEL_UNSUPPORTED),
        "gpt_neox": (PARALLEL_FIELDS, PARALLEL_UNSUPPORTED),
        "gemma2": (GEMMA2_FIELDS, GEMMA2_UNSUPPORTED),
        "gemma3_text": (GEMMA3_FIELDS, GEMMA3_UNSUPPORTED),
        "mamba2": (MAMBA2_FIELDS, MAMBA2_UNSUPPORTED),
        "deepseek_v3": (DEEPSEEK_FIELDS, DEEPSEEK_UNSUPPORTED),
        "bert": (BERT_FIELDS, BERT_UNSUPPORTED),
        "vit": (VIT_FIELDS, VIT_UNSUPPORTED),
    }.get(family, (DECODER_FIELDS, DECODER_UNSUPPORTED))
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    for row in fields:
        if row.families is not None and family not in row.families:
            continue
        value = row.value(c)
        raw = None if row.raw is None else row.raw(c)
        key = row.key(c) if callable(row.key) else row.key
        vals[row.field] = value
        src[row.field] = f"{key}={json.dumps(value if raw is None else raw)}"
    unsupported = [
        m
        for families, check in checks
        if (families is None or family in families) and (m := check(c)) is not None
    ]
    return vals, src, unsupported
