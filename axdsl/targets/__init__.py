"""Hardware targets: profiles shipped as data (`profiles.toml`), looked up by name.

A target name is a profile name with an optional chip count: `cpu`, `gpu-h100` (one host's worth of
chips), `gpu-h100-8`, `tpu-v5e-256`. Profiles are plain data so adding a chip is a table, not code.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar
from functools import lru_cache
from pathlib import Path

from axdsl.errors import did_you_mean
from axdsl.ir.settings import ChipKind, Kernel, QuantFormat, RematKind

# Mesh axes, least to most communication per step (AXLearn's order): `model` is innermost, so
# tensor-parallel peers sit on the fastest links. `stage` is outermost (MaxText's order): pipeline
# stages exchange one micro-batch's activations per step, the least traffic of all; no default
# rule maps a parameter's axis to it, and outside a pipeline it acts as data parallelism (the batch
# rule lists it first). Its default size is 1.
MESH_AXES = ("stage", "data", "expert", "fsdp", "seq", "model")
REMAT_KINDS = tuple(str(k) for k in RematKind)
QUANT_FORMATS = tuple(str(f) for f in QuantFormat)


# Memory an analytic verdict lets a step use where no platform measured its own
# (analysis/platforms.py): XLA and the runtime keep some for themselves (buffers of the
# collectives, fragmentation), and the analytic figures are good to about 10%.
USABLE_FRACTION = 0.9


class UnknownTarget(ValueError):
    pass


class ProfileError(ValueError):
    """A mistake in profiles.toml (package data, not user input): file:line, what, the fix."""


@dataclass(frozen=True)
class Profile:
    """One chip's facts and its default schedule."""

    name: str
    kind: ChipKind  # cpu, gpu, tpu, trn: parsed when the profiles load
    description: str
    hbm_gib: float
    peak_tflops: dict[str, float]
    chips_per_host: int
    default_chips: int
    mesh: dict[str, int]
    rules: dict[str, tuple[str, ...]]
    kernels: dict[str, tuple[Kernel, ...]]  # primitive -> its kernels in order of preference
    quantize: tuple[QuantFormat, ...]
    default_quantize: QuantFormat
    remat: RematKind
    loss_chunk: int  # positions per chunk of the fused cross-entropy
    unroll: int = 0  # repeats of at most this many layers run unrolled (jax.lax.scan(unroll=True))
    steps_per_call: int = 1  # train steps one jitted call runs (a loop on the device)
    cudnn_head_dim_max: int = 128  # the largest head_dim cuDNN flash attention takes (GPUs only)
    peak_nominal: bool = (
        False  # the peak is a placeholder, not a chip's (cpu): MFU is labelled nominal
    )
    # The fraction of the HBM the generated train.py gives XLA's allocator
    # (XLA_PYTHON_CLIENT_MEM_FRACTION; GPUs only, None elsewhere): what a step may use there.
    mem_fraction: float | None = None

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * 2**30)

    def usable_fraction(self, measured: float) -> float:
        """The fraction of the HBM a step may use: the memory pool the generated code asks for
        where it sets one (GPUs), else `measured`, the platform's (analysis/platforms.py)."""
        return self.mem_fraction if self.mem_fraction is not None else measured

    def peak_flops(self, fmt: str = "bf16") -> float:
        """Dense peak FLOP/s per chip for a number format (bf16 when the format has no entry)."""
        return self.peak_tflops.get(fmt, self.peak_tflops["bf16"]) * 1e12


@dataclass(frozen=True)
class Target:
    """A parsed target name: its profile and chip count."""

    name: str
    profile: Profile
    chips: int

    @property
    def canonical(self) -> str:
        return f"{self.profile.name}-{self.chips}"


PROFILES = Path(__file__).parent / "profiles.toml"


@lru_cache(maxsize=1)
def profiles() -> dict[str, Profile]:
    text = PROFILES.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    defaults = data.pop("defaults")
    out = {}
    for name, t in data.items():
        rules = {k: tuple(v) for k, v in defaults["rules"].items()}
        rules.update({k: tuple(v) for k, v in t.get("rules", {}).items()})
        out[name] = Profile(
            name=name,
            kind=ChipKind(t["kind"]),
            description=t["description"],
            hbm_gib=t["hbm_gib"],
            peak_tflops=dict(t["peak_tflops"]),
            chips_per_host=t["chips_per_host"],
            default_chips=t["default_chips"],
            mesh=dict(t.get("mesh", defaults["mesh"])),
            rules=rules,
            kernels={
                op: tuple(_named(Kernel, text, name, "kernels", f"{op} kernel", k) for k in v)
                for op, v in t.get("kernels", {}).items()
            },
            quantize=tuple(
                _named(QuantFormat, text, name, "quantize", "format", f) for f in t["quantize"]
            ),
            default_quantize=_named(
                QuantFormat,
                text,
                name if "default_quantize" in t else "defaults",
                "default_quantize",
                "format",
                t.get("default_quantize", defaults["default_quantize"]),
            ),
            remat=_named(
                RematKind,
                text,
                name if "remat" in t else "defaults",
                "remat",
                "remat policy",
                t.get("remat", defaults["remat"]),
            ),
            cudnn_head_dim_max=t.get("cudnn_head_dim_max", 128),
            peak_nominal=t.get("peak_nominal", False),
            mem_fraction=t.get("mem_fraction"),
            loss_chunk=t.get("loss_chunk", defaults["loss_chunk"]),
            unroll=t.get("unroll", defaults["unroll"]),
            steps_per_call=t.get("steps_per_call", defaults["steps_per_call"]),
        )
    return out


E = TypeVar("E", bound=StrEnum)


def _named(enum: type[E], text: str, table: str, key: str, what: str, value: str) -> E:
    """`value` of `key` in profiles.toml's `[table]` as a member of `enum`; an unknown name is a
    ProfileError at its line: `profiles.toml:81: profile `gpu-a100` lists unknown attention kernel
    `cudn` (did you mean `cudnn`?)`."""
    known = tuple(str(m) for m in enum)
    if value not in known:
        hint = did_you_mean(value, known) or f"known: {', '.join(known)}"
        raise ProfileError(
            f"{PROFILES}:{_line_of(text, table, key)}: profile `{table}` lists "
            f"unknown {what} `{value}` ({hint})"
        )
    return enum(value)


def _line_of(text: str, table: str, key: str) -> int:
    """The 1-based line of `key = ...` in `[table]` of a TOML text (the header's when absent)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"[{table}]"), 0)
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        if stripped.startswith("["):
            break
        if stripped.split("=")[0].strip() == key:
            return i + 1
    return start + 1


def known_targets() -> tuple[str, ...]:
    return tuple(profiles())


KNOWN_TARGETS = known_targets()


MAX_CHIPS = 2**20  # a chip count past any machine is a typo, not a plan


def parse_target(name: str) -> tuple[str, int | None]:
    """`gpu-h100-8` -> ("gpu-h100", 8); `cpu` -> ("cpu", None). Raise UnknownTarget for others."""
    m = re.fullmatch(r"(.+?)(?:-(\d+))?", name)
    base, count = (m.group(1), m.group(2)) if m else (name, None)  # "" matches nothing
    if base not in profiles():
        hint = did_you_mean(base, KNOWN_TARGETS)
        raise UnknownTarget(
            f"unknown target `{name}`; known targets: {', '.join(KNOWN_TARGETS)}"
            + (f" ({hint})" if hint else "")
            + "; a chip count may follow, as in gpu-h100-8"
        )
    if count is not None and int(count) < 1:
        raise UnknownTarget(f"target `{name}` asks for {count} chips; use a positive count")
    if count is not None and int(count) > MAX_CHIPS:
        raise UnknownTarget(
            f"target `{name}` asks for {int(count):,} chips; at most {MAX_CHIPS:,} "
            "(the largest clusters have a few hundred thousand accelerators)"
        )
    return base, int(count) if count else None


def get_target(name: str) -> Target:
    base, count = parse_target(name)
    profile = profiles()[base]
    return Target(name, profile, count or profile.default_chips)


def resolve_mesh(mesh: dict[str, int], chips: int) -> dict[str, int] | str:
    """Sizes for every mesh axis with -1 filled in, or an error message."""
    sizes = {a: int(mesh.get(a, 1)) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        return f"only one mesh axis may be -1, got {', '.join(free)}"
    bad = [a for a, s in sizes.items() if s == 0 or s < -1]
    if bad:
        return f"mesh axis `{bad[0]}` has size {sizes[bad[0]]}; sizes are positive or -1"
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if chips % fixed:
            return f"the fixed mesh axes multiply to {fixed}, which does not divide {chips} chips"
        sizes[free[0]] = chips // fixed
    elif fixed != chips:
        return f"the mesh axes multiply to {fixed}, but the target has {chips} chips"
    return sizes


def target_dir_name(name: str) -> str:
    return name.replace("-", "_")
