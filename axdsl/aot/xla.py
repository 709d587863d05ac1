"""XLA's own memory figures: `memory_analysis()` as a dict, its per-chip total, and the
RESOURCE_EXHAUSTED message of a TPU compile whose temporaries exceed the chip's HBM.

No jax here: the lowering (`lower.py`, `tpu.py`) calls these on what jax returned, and the report
(`report.py`, `render.py`) reads the dicts they made, which also cross a subprocess as JSON.
"""

from __future__ import annotations

import re

# XLA's TPU compiler: "... the total memory required for HLO temporaries (20.31G) exceeds
# available HBM (15.75G)." (G is GiB: v5e's bytes_limit is 15.75 GiB.) Despite the words, the
# first figure counts the arguments too: a donated 20 GiB argument with no temporaries fails with
# "HLO temporaries (20.00G)", and llama3_8b on v5e-8 with 16.43G (analytic state 11.22 GiB +
# temporaries 5.31 GiB).
_TEMPS_RE = re.compile(r"HLO temporaries \((?P<n>[\d.]+)(?P<unit>[KMGT])\)")
_AVAILABLE_RE = re.compile(r"available HBM \((?P<n>[\d.]+)(?P<unit>[KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def memory_stats(ma) -> dict[str, int]:
    """`compiled.memory_analysis()` as plain ints (bytes per device), keyed without the suffix;
    `peak` is `peak_memory_in_bytes` (on TPU it also counts on-chip temporaries)."""
    if ma is None:
        return {}
    keys = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    stats = {k.replace("_size_in_bytes", ""): int(getattr(ma, k, 0) or 0) for k in keys}
    stats["peak"] = int(
        getattr(ma, "peak_memory_in_bytes", 0) or 0
    )  # XLA's own peak of the program
    return stats


def xla_total(xla: dict, tpu: bool = False) -> int:
    """Peak bytes per device by XLA's accounting. On TPU, its `peak_memory_in_bytes`: what the
    chip was measured to need (a filler array bisected beside the step, benchmarks/tpu_bench.py
    --fill) within 2.5%, where arguments + temporaries overstate it by 2 GiB (its temp_size sums
    buffers that are never live together). Elsewhere, or with no peak: arguments + temporaries
    + outputs not donated."""
    if tpu and xla.get("peak"):
        return int(xla["peak"])
    return xla["argument"] + xla["temp"] + max(xla["output"] - xla["alias"], 0)


def is_out_of_memory(message: str) -> bool:
    """Whether a compile failed because the step does not fit (not because the code is wrong)."""
    return "RESOURCE_EXHAUSTED" in message and "HBM" in message


def out_of_memory(message: str) -> dict[str, int | None]:
    """The figures of XLA's RESOURCE_EXHAUSTED message, in bytes (None where it gives none):
    `required` the HBM the program needs per chip (arguments included), `available` what it has."""
    return {
        "required": _bytes(_TEMPS_RE.search(message)),
        "available": _bytes(_AVAILABLE_RE.search(message)),
    }


def _bytes(m: re.Match | None) -> int | None:
    return int(float(m.group("n")) * _UNITS[m.group("unit")]) if m else None


def short(exc: Exception) -> str:
    """An exception's first line, cut to 300 characters: what the report prints of it."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
