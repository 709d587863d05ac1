"""The Python spelling of a layer's name: plan_functions names the generated functions with it,
codegen names other things (the root's loss helpers) the same way."""

from __future__ import annotations

import re


def snake(name: str) -> str:
    """`DecoderLM` -> `decoder_lm`, `RMSNorm` -> `rms_norm`, `SwiGLU` -> `swiglu`, `MoE` ->
    `moe`."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()
    for word in ("swiglu", "moe"):  # names that are words, not camel-case compounds
        s = re.sub("(^|_)" + "_?".join(word) + "($|_)", r"\g<1>" + word + r"\g<2>", s)
    return s
