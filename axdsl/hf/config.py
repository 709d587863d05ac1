"""Hugging Face families and config.json <-> Arch: detect, compare (import) and write (export).

Each family's pieces are its registry entry's (axdsl/hf/families/); this module only asks them.
It serves every family, so it reads an Arch's base `Facts` and names the others' facts by their
rows (`Facts.get`: None for a fact the spec's model has not, as a Mamba-2 model has no window).
"""

from __future__ import annotations

import json
import math
from typing import Any

from axdsl.hf.errors import HFError
from axdsl.hf.facts import FIELDS, Arch, Facts
from axdsl.hf.families import REGISTRY, get, of_arch
from axdsl.hf.fields import ROPE_FIELDS, ROPE_SCALING_FIELDS
from axdsl.hf.values import hf_values

FAMILIES = {f.name: f.hf_class for f in REGISTRY.values()}  # model_type -> class
_ARCH_TO_FAMILY = {v: k for k, v in FAMILIES.items()}


def family_of_config(cfg: dict) -> str:
    """The family of a config.json: its `model_type`, else its `architectures`."""
    mt = cfg.get("model_type")
    if mt in FAMILIES:
        return mt
    for a in cfg.get("architectures") or []:
        if a in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[a]
    raise HFError(
        f"unsupported model_type {mt!r} (architectures {cfg.get('architectures')})",
        [f"supported: {', '.join(f'{k} ({c})' for k, c in FAMILIES.items())}"],
    )


def family_of_arch(arch: Arch[Facts]) -> str:
    """The HF family a spec's model exports to, from its structure (the first that claims it)."""
    return of_arch(arch).name


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _effective(arch: Arch[Facts], fld: str, value: Any) -> Any:
    """The spec's value as the model computes it: an attention `scale` left at 0 is the default
    head_dim ** -0.5 (Gemma 2 states it as query_pre_attn_scalar = head_dim)."""
    if fld == "scale" and not value and arch.facts.head_dim:
        return arch.facts.head_dim**-0.5
    return value


def _skipped(arch: Arch[Facts], vals: dict) -> set[str]:
    """Fields that do not apply when the two sides already differ in a field above them."""
    skip = set()
    v = arch.facts
    if v.mlp != vals.get("mlp"):
        skip |= {
            "hidden",
            "act",
            "mlp_bias",
            "experts",
            "top_k",
            "normalize",
            "shared",
            "groups",
            "top_groups",
            "routed_scale",
            "score",
        }
    if not (v.get("dense_layers") and vals.get("dense_layers")):
        skip.add("dense_hidden")
    if v.get("attn") != vals.get("attn"):
        skip |= {
            "q_rank",
            "kv_rank",
            "nope_dim",
            "v_head_dim",
            "rope_interleaved",
            "latent_norm_eps",
            "scale",
        }
    if v.norm != vals.get("norm"):
        skip.add("norm_bias")
    if v.block != vals.get("block"):
        skip.add("shared_norm")
    if not (v.rope and vals.get("rope")):
        skip |= {"rope_theta", "rope_dim", "rope_scaling", *ROPE_FIELDS}
    elif v.get("rope_scaling") != vals.get("rope_scaling"):
        skip |= set(ROPE_FIELDS)
    else:
        skip |= set(ROPE_FIELDS) - set(ROPE_SCALING_FIELDS.get(v.get("rope_scaling"), ()))
    if not (v.qk_norm and vals.get("qk_norm")):
        skip.add("qk_norm_eps")
    if v.positions != "learned" or vals.get("positions") != "learned":
        skip.add("max_seq")  # only the learned position table depends on it
    return skip


def mismatches(arch: Arch[Facts], family: str, cfg: dict) -> list[str]:
    """Every way config.json and the spec's model disagree (empty: the weights map)."""
    if arch.root and arch.root != get(family).root:  # field by field would only say "null"
        return [
            f"config.json is a {FAMILIES[family]} (std's {get(family).root}), the spec's model "
            f"is a {arch.root}",
            *arch.problems,
        ]
    vals, src, unsupported = hf_values(get(family), cfg)
    out = [f"config.json: {u} is not supported" for u in unsupported] + list(arch.problems)
    skip = _skipped(arch, vals)
    if "layer_ropes" not in vals and len(set(arch.facts.get("layer_ropes") or ())) > 1:
        out.append(
            "the spec's layers differ in their rotary embedding "
            f"({family}'s config.json states one for all layers; Gemma 3 states one per layer type)"
        )
    for fld, value in vals.items():
        ours, theirs = (_effective(arch, fld, v) for v in (arch.facts.get(fld), value))
        if fld in skip or _same(ours, theirs):
            continue
        out.append(
            f"config.json has {src[fld]}, the spec has {FIELDS[fld]} = "
            f"{json.dumps(arch.facts.get(fld))}"
        )
    return out


def hf_config(arch: Arch[Facts], family: str) -> dict:
    """The config.json of `arch` as a `family` model (export)."""
    dtypes = {a[1] for a in arch.params.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    return get(family).export(arch, dtype)
