"""Spec dtype names and the numpy/jax names they mean (a leaf of the IR: expr.py and nodes.py
both use it)."""

from __future__ import annotations

from dataclasses import dataclass

# The largest count or index the generated code can hold: JAX runs with 32-bit integers (x64 off),
# so token ids, positions, gather indices and a scan's step counter are int32.
INT32_MAX = 2**31 - 1

DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "i8": "int8",
    "i32": "int32",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
}


@dataclass(frozen=True)
class DType:
    name: str  # spec name, e.g. "bf16"

    @property
    def jnp(self) -> str:
        return DTYPES[self.name]
