"""The suggestion search: concrete changes that make a step that does not fit fit.

Each try re-runs the analytic estimate (`estimate_memory`) with one thing changed, in order:
more FSDP (on the same chips, then on more), a stronger remat policy, more micro-batches, the
Adafactor optimizer (factored second moments), LoRA adapters (when fine-tuning), and, when
nothing alone fits, remat(full) together with more chips.

When XLA decided that the step does not fit (a TPU compile, tpu.py), the tries are still
analytic (compiling each would take minutes), but each is held to XLA's bound, and shown, scaled
by `ratio`: XLA's figure over the analytic total of the configuration it compiled.

Not searched, because the language has no such setting or the memory model does not estimate
it: optimizer moments in bf16 (the moments take the parameter dtype), and quantize(int8) (the
memory model does not count quantized matmuls' operands; v5e quantizes blocks/* already).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from axdsl.analysis.memory import MemoryEstimate, estimate_memory
from axdsl.aot.report import gib
from axdsl.ir import nodes as ir
from axdsl.lora import LoraSettings
from axdsl.lora import resolve as resolve_lora
from axdsl.objectives import objective_name

_REMAT_ORDER = ["none", "save", "offload", "save_dots", "full"]


@dataclass
class _Search:
    """One step that does not fit, and how to estimate variants of it."""

    module: ir.Module
    model: str
    est: MemoryEstimate
    usable: int
    target: str
    update_select: bool
    ratio: float = 1.0  # XLA's figure / the analytic total, when XLA decided

    def ok(self, total: int) -> bool:
        """Whether an analytic total fits, scaled by XLA's ratio when XLA decided."""
        return total * self.ratio <= self.usable

    def shown(self, total: int) -> str:
        """An analytic total as a suggestion prints it: scaled by XLA's ratio when XLA decided."""
        if self.ratio == 1.0:
            return gib(total)
        return f"{gib(total * self.ratio)} (analytic {gib(total)} x XLA's ratio {self.ratio:.2f})"

    @property
    def pattern(self) -> str:
        return f'target "{self.target}"'

    @property
    def base(self) -> dict[str, int]:
        """The mesh with the data axis folded into fsdp, when it has both."""
        base = dict(self.est.mesh)
        if base.get("data", 1) > 1 and "fsdp" in self.est.mesh:
            base["fsdp"] = base.get("fsdp", 1) * base["data"]
            base["data"] = 1
        return base

    def total(self, **kw) -> int:
        kw.setdefault("batch", self.est.batch)
        kw.setdefault("microbatches", self.est.microbatches)
        return estimate_memory(
            self.module, self.model, seq=self.est.seq, update_select=self.update_select, **kw
        ).total

    def shards(self, mesh: dict[str, int]) -> int:
        """Ways the batch is split on `mesh`."""
        batch_rule = dict((k, c.value) for k, c in self.module.schedule.rules).get("batch", ())
        return math.prod(mesh.get(a, 1) for a in batch_rule)

    def grown_batch(self, mesh: dict[str, int]) -> int:
        """Same sequences per chip: the global batch grows with the chips when it must."""
        return max(
            self.est.batch, self.est.batch * self.shards(mesh) // max(self.shards(self.est.mesh), 1)
        )

    def others(self) -> int:
        return math.prod(v for k, v in self.base.items() if k != "fsdp")


def _fsdp_same_chips(s: _Search) -> list[str]:
    mesh = s.est.mesh
    if not (mesh.get("data", 1) > 1 and "fsdp" in mesh):
        return []
    t = s.total(mesh=s.base)
    if not s.ok(t):
        return []
    return [
        f"more FSDP on the same {s.est.chips} chips: put the data axis on fsdp, "
        f"`{s.pattern} {{ mesh(fsdp = -1) }}` -> {s.shown(t)} per chip"
    ]


def _more_fsdp(s: _Search) -> list[str]:
    base, sched = s.base, s.module.schedule
    for k in range(1, 13):
        fsdp = base.get("fsdp", 1) * 2**k
        mesh = {**base, "fsdp": fsdp}
        batch = s.grown_batch(mesh)
        t = s.total(batch=batch, mesh=mesh)
        if s.ok(t):
            n = fsdp * s.others()
            grown = f", global batch {batch}" if batch != s.est.batch else ""
            return [
                f"more FSDP: fsdp = {fsdp} over {n} chips{grown} -> {s.shown(t)} per chip; "
                f"check it with `axdsl aot {s.module.spec} --target {sched.profile}-{n}"
                + (f" --batch {batch}`" if grown else "`")
            ]
    return []


def _stronger_remat(s: _Search) -> list[str]:
    now = s.est.remat
    for kind in _REMAT_ORDER[
        _REMAT_ORDER.index(now) + 1 if now in _REMAT_ORDER else len(_REMAT_ORDER) :
    ]:
        if kind in ("save", "offload"):
            continue
        t = s.total(remat=ir.RematPolicy(kind))
        if s.ok(t):
            keeps = "only each layer input" if kind == "full" else "matmul outputs"
            return [
                f"stronger remat: `{s.pattern} {{ remat({kind}) }}` (keeps {keeps}) "
                f"-> {s.shown(t)} per chip"
            ]
    return []


def _more_microbatches(s: _Search) -> list[str]:
    """Same global batch, smaller activations."""
    est = s.est
    k = est.microbatches * 2
    while est.batch % k == 0 and (est.batch // k) % s.shards(est.mesh) == 0:
        t = s.total(microbatches=k)
        if s.ok(t):
            return [
                f"smaller micro-batches: `train {{ microbatches = {k} }}` "
                f"({est.batch // k} sequences per micro-batch) -> {s.shown(t)} per chip"
            ]
        k *= 2
    return []


def _adafactor(s: _Search) -> list[str]:
    """Adafactor keeps factored second moments (rows and columns) instead of AdamW's two full ones."""
    if s.est.optimizer == "adafactor":
        return []
    t = s.total(optimizer="adafactor")
    if not s.ok(t):
        return []
    return [
        f"Adafactor instead of {s.est.optimizer} (factored second moments, no first moment): "
        f"`train {{ optimizer = adafactor() }}` -> {s.shown(t)} per chip"
    ]


def _lora(s: _Search) -> list[str]:
    """When fine-tuning: LoRA adapters on the attention's wq and wv (lora(...)'s defaults)
    leave the base weights frozen, with no gradients and no optimizer state."""
    train = s.module.train_settings
    if train is None or any(k in ("lora", "freeze") for k, _ in train.settings):
        return []
    if objective_name(s.module) != "next_token":
        return []  # lora(...) trains next-token models only
    root = next(m.root for m in s.module.models if m.name == s.model)
    targets, problems = resolve_lora(LoraSettings(), root)
    if problems or not targets:  # the default targets are not matrices of this model
        return []
    adapters = ir.Choice(LoraSettings(), ir.DEFAULT)
    module = replace(
        s.module, train_settings=replace(train, settings=train.settings + (("lora", adapters),))
    )
    t = replace(s, module=module).total()
    if not s.ok(t):
        return []
    return [
        f'if you fine-tune: LoRA adapters, base weights frozen, `train {{ init_from = "PATH"  '
        f'lora(rank = 8, targets = "blocks/*/attn/w[qv]") }}` -> {s.shown(t)} per chip'
    ]


def _together(s: _Search) -> list[str]:
    """remat(full) and more chips at once, when nothing alone fits."""
    base = s.base
    for j in range(0, 13):
        mesh = {**base, "fsdp": base.get("fsdp", 1) * 2**j}
        batch = s.grown_batch(mesh)
        t = s.total(batch=batch, mesh=mesh, remat=ir.RematPolicy("full"))
        if s.ok(t):
            n = mesh["fsdp"] * s.others()
            return [
                f"together: `{s.pattern} {{ remat(full) }}` and fsdp over {n} chips "
                f"(`--target {s.module.schedule.profile}-{n}`) -> {s.shown(t)} per chip"
            ]
    return [
        "no layout tried fits (FSDP up to 4096x, remat(full), micro-batches): "
        "use a smaller model, shorter sequences or a chip with more memory"
    ]


def suggest(
    module: ir.Module,
    model: str,
    est: MemoryEstimate,
    usable: int,
    target: str,
    update_select: bool = True,
    ratio: float = 1.0,
) -> list[str]:
    """Concrete changes that make the step fit, each with the per-chip total it would give
    (the analytic total, scaled by `ratio`, XLA's over the analytic, when XLA decided)."""
    s = _Search(module, model, est, usable, target, update_select, ratio)
    out = (
        _fsdp_same_chips(s)
        + _more_fsdp(s)
        + _stronger_remat(s)
        + _more_microbatches(s)
        + _adafactor(s)
        + _lora(s)
    )
    return out or _together(s)
