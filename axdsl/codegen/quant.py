"""Code for quantized matmuls: a call to a small helper that is copied into the generated model."""

from __future__ import annotations

from axdsl.codegen.names import py_str


def emit_quantized(fmt: str, spec: str, left: str, right: str) -> str:
    return f"{fmt}_einsum({py_str(spec)}, {left}, {right})"


HELPERS: dict[str, str] = {}
