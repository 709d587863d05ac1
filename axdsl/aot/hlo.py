"""What a compiled program runs, read off its HLO text (`compiled.as_text()`): no jax here.

`axdsl aot` lists it for GPU targets, and tests hold a target's choices to it: a target that
selected cuDNN attention must compile to cuDNN's fused attention calls, and one that selected fp8
matmuls to gemms whose operands are 8-bit floats. The quantize-dequantize pattern that fp8 is
written as (kernels.py's fp8_einsum) could otherwise compile to a bf16 matmul with casts around
it, and only the HLO shows which.

- **gemms**: every `dot` and every cuBLAS custom call, by the element types of its two operands.
  XLA:GPU writes a matmul as a dot inside a gemm fusion (Triton) or as a cuBLAS call; its HLO
  text names a dot's operands without their types, so each computation's instructions are read
  first to type them.
- **cudnn**: cuDNN custom calls by target (`__cudnn$fmhaSoftmax` forward, `...Backward`).
- **collectives**: all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute, as
  they appear in the program (an async pair counted once; an op inside a loop body once, however
  many times the loop runs).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["COLLECTIVES", "FP8_TYPES", "fp8_gemms", "inventory", "missing", "summary"]

FP8_TYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz", "f8e3m4", "f8e4m3b11fnuz")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# `%name = TYPE op(operands), attributes`; TYPE is `f32[2,4]{1,0}` or a tuple `(TYPE, ...)`.
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*")
_OP = re.compile(r"\s*(?P<op>[\w\-]+)\(")
_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%[\w.\-]+\s*\(.*\)\s*->\s*.*\{\s*$")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')


def _element(type_text: str) -> str:
    """`f8e4m3fn[512,64]{1,0}` -> `f8e4m3fn` (a tuple's first element's)."""
    m = re.match(r"\(?\s*([a-z]+[0-9a-z]*)", type_text)
    return m.group(1) if m else type_text


@dataclass(frozen=True)
class _Instruction:
    name: str
    type: str  # the element type of its result (a tuple's first element's)
    op: str
    operands: tuple[str, ...]
    rest: str  # the attributes after the operands


def _instruction(line: str) -> _Instruction | None:
    """One line of HLO text as an instruction, or None (a header, a brace, a comment)."""
    m = _NAME.match(line)
    if m is None:
        return None
    i = m.end()
    if line.startswith("(", i):  # a tuple type: up to its matching parenthesis
        depth = 0
        for j in range(i, len(line)):
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            if depth == 0:
                break
        type_end = j + 1
    else:
        type_end = line.find(" ", i)
    op = _OP.match(line, type_end) if type_end > 0 else None
    if op is None:
        return None
    close = _close(line, op.end())
    return _Instruction(
        m.group("name"),
        _element(line[i:type_end]),
        op.group("op"),
        tuple(re.findall(r"%([\w.\-]+)", line[op.end() : close])),
        line[close:],
    )


def _close(line: str, start: int) -> int:
    """The index of the parenthesis closing the one opened just before `start`."""
    depth = 1
    for j in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[j], 0)
        if depth == 0:
            return j
    return len(line)


def _computations(text: str) -> list[list[_Instruction]]:
    """The instructions of each computation, in order."""
    out: list[list[_Instruction]] = []
    for line in text.splitlines():
        if _HEADER.match(line):
            out.append([])
            continue
        ins = _instruction(line)
        if ins is not None and out:
            out[-1].append(ins)
    return out


def inventory(text: str) -> dict:
    """The program's gemms by operand types ("f8e4m3fn x f8e4m3fn": count), its cuDNN calls by
    target and its collectives by kind."""
    gemms: Counter[str] = Counter()
    cudnn: Counter[str] = Counter()
    collectives: Counter[str] = Counter()
    for instructions in _computations(text):
        types = {ins.name: ins.type for ins in instructions}
        for ins in instructions:
            op = ins.op
            target = _TARGET.search(ins.rest)
            kind = op.removesuffix("-start")
            if kind in COLLECTIVES and not op.endswith("-done"):
                collectives[kind] += 1
            if op == "custom-call" and target and target.group("target").startswith("__cudnn$"):
                cudnn[target.group("target")] += 1
            is_blas = op == "custom-call" and target and "cublas" in target.group("target")
            if op == "dot" or is_blas:
                a, b = (list(ins.operands) + ["?", "?"])[:2]
                gemms[f"{types.get(a, '?')} x {types.get(b, '?')}"] += 1
    return {
        "gemms": dict(sorted(gemms.items())),
        "cudnn": dict(sorted(cudnn.items())),
        "collectives": dict(sorted(collectives.items())),
    }


def fp8_gemms(inv: dict) -> int:
    """Gemms whose two operands are 8-bit floats."""
    return sum(n for k, n in inv.get("gemms", {}).items() if _both_fp8(k))


def _both_fp8(pair: str) -> bool:
    a, _, b = pair.partition(" x ")
    return a in FP8_TYPES and b in FP8_TYPES


def summary(inv: dict) -> list[str]:
    """The inventory as report lines."""
    gemms = inv.get("gemms", {})
    fp8 = fp8_gemms(inv)
    rest = ", ".join(f"{n} {k}" for k, n in gemms.items() if not _both_fp8(k))
    lines = [f"gemms: {sum(gemms.values())} ({fp8} fp8 x fp8" + (f"; {rest}" if rest else "") + ")"]
    cudnn = inv.get("cudnn", {})
    lines.append(
        "cuDNN fused attention: "
        + (", ".join(f"{n} {k}" for k, n in cudnn.items()) if cudnn else "none")
    )
    coll = inv.get("collectives", {})
    lines.append(
        "collectives: "
        + (", ".join(f"{n} {k}" for k, n in coll.items()) if coll else "none")
        + " (in the program text: an op in a loop body once)"
    )
    return lines


def missing(inv: dict, cudnn: bool, fp8: bool) -> list[str]:
    """What the target selected that the compiled program does not run: cuDNN attention with no
    cuDNN call in the program, fp8 matmuls with no gemm of two 8-bit floats (the casts around a
    matmul in a higher precision). Empty when the program runs what was chosen."""
    out = []
    if cudnn and not inv.get("cudnn"):
        out.append(
            "the target selected cuDNN attention, but the compiled step has no cuDNN call "
            "(XLA computes attention itself)"
        )
    if fp8 and not fp8_gemms(inv):
        out.append(
            "the target selected fp8 matmuls, but the compiled step has no gemm of two fp8 "
            "operands (the quantize-dequantize pattern became a matmul in a higher precision)"
        )
    return out
