"""What the last passes decide for codegen, recorded in the IR so that codegen only prints it.

    shard_activations  -> Instance.carry_sharding: ActivationSharding (a scanned layer's carry)
    split_head         -> Model.head: HeadSplit (axdsl/ir/head.py), the fused loss's cut
    plan_decode        -> Model.decode: DecodePlan, the KV-cache decode path
    select_config      -> Module.config: ConfigFields, what the generated Config keeps

Each is printed by `axdsl dump` (axdsl/ir/printer.py) and shown by tests/ir/<pass>.test.
"""

from __future__ import annotations

from dataclasses import dataclass

from axdsl.ir.nodes import Dim, HValue


@dataclass(frozen=True)
class ActivationSharding:
    """Where an activation lives on the mesh: each dim's logical axis (None: no rule reads it)
    and the mesh axes the target's rules give it, each mesh axis used once per tensor."""

    logical: tuple[str | None, ...]
    mesh: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class CacheEntry:
    """One array of the KV cache: an attention call's keys (`k`, `k2`, ...) or values (`v`, ...).

    Its shape is [*stack, batch, length, *dims[2:]]: one slice per stacked layer around it, then
    the attention operand's dims past its [B, S]."""

    path: str  # in the cache tree, which mirrors the parameter tree: "blocks/attn/k"
    stack: tuple[HValue, ...]  # the repeat counts of the stacked layers around the attention
    dims: tuple[Dim, ...]  # the attention operand's dims, [B, S, kv_heads, head_dim]
    sharding: ActivationSharding | None  # None on a target without a mesh (no schedule)


@dataclass(frozen=True)
class DecodePlan:
    """How a next-token LM decodes over a KV cache (plan_decode), or why it cannot.

    `cached` are the layers whose decode variant takes and returns a part of the cache (those
    holding an attention call, and their ancestors); the other layers run as in the forward."""

    problem: str | None  # why this model cannot decode over a KV cache; None when it can
    cached: tuple[str, ...] = ()  # instance paths, leaves first
    cache: tuple[CacheEntry, ...] = ()


@dataclass(frozen=True)
class ConfigFields:
    """The root hyperparameters of the generated `Config` (select_config), in declaration order,
    and those fixed when the file was built (the code reads none of them)."""

    fields: tuple[str, ...]
    fixed: tuple[str, ...]
