"""The suggestion search: concrete changes that make a step that does not fit fit.

Each try re-runs the analytic estimate (`estimate_memory`) with something changed. On more chips:
more FSDP (on the same chips, then on more), or, where the weights' dims stop FSDP, pipeline
stages. On the same chips, each lever alone, each printed
with its per-chip figure whether or not it is enough by itself: a stronger remat policy, more
micro-batches, context parallelism for long sequences, the first moment in bf16
(`adamw(mu_dtype = bf16)`), Adafactor (factored second moments), quantized matmuls in a format
the target runs (int8, fp8: quantize_matmuls re-run on the IR), and LoRA adapters (when
fine-tuning). When no lever alone fits, they are combined, one at a time in that order, until
the step fits on the same chips; when even all of them do not, remat(full) together with more
chips.

When XLA decided that the step does not fit (a TPU compile, tpu.py), the tries are still
analytic (compiling each would take minutes), but each is held to XLA's bound, and shown, scaled
by `ratio`: XLA's figure over the analytic total of the configuration it compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from axdsl import optim
from axdsl.analysis.memory import MemoryEstimate, estimate_memory
from axdsl.aot.report import gib
from axdsl.ir import nodes as ir
from axdsl.lora import LoraSettings
from axdsl.lora import resolve as resolve_lora
from axdsl.objectives import objective_name
from axdsl.passes.quantize_matmuls import quantize_matmuls
from axdsl.targets import profiles

_REMAT_ORDER = ["none", "save", "offload", "save_dots", "full"]
# Context parallelism is suggested from this sequence length on: below it, activations rarely
# dominate and the attention's matmuls get too small per shard to pay for the traffic.
CONTEXT_MIN_SEQ = 8192


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
        batch_rule = dict((k, c.value) for k, c in self.module.target.rules).get("batch", ())
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


def fsdp_cap(module: ir.Module, model: str, mesh: dict[str, int]) -> int:
    """The most ways FSDP can split the parameters: every dim that `fsdp` splits, less the
    other mesh axes on that dim, must divide (annotate_sharding refuses the rest). 0: no
    parameter dim is on fsdp."""
    rules = {k: c.value for k, c in module.target.rules}
    root = next(m.root for m in module.models if m.name == model)
    cap = 0
    for inst in root.walk():
        for p in inst.params:
            for d, logical in zip(p.full_dims, p.full_axes, strict=True):
                axes = rules.get(logical, ()) if logical else ()
                if "fsdp" in axes:
                    others = math.prod(mesh.get(a, 1) for a in axes if a != "fsdp")
                    cap = math.gcd(cap, ir.static_size(d) // others)
    return cap


def _more_fsdp(s: _Search) -> list[str]:
    base, sched = s.base, s.module.target
    cap = fsdp_cap(s.module, s.model, base)
    for k in range(1, 13):
        fsdp = base.get("fsdp", 1) * 2**k
        if cap and cap % fsdp:  # a weight's dim does not split that many ways
            return []
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


def _more_stages(s: _Search) -> list[str]:
    """Pipeline stages on more chips, for weights that do not fit with FSDP alone: FSDP as far
    as the weights' dims let it go (`fsdp_cap`); when the state alone does not fit there, or is
    most of the step, each stage keeps 1 / stages of the main repeat's weights, gradients and
    optimizer state. `microbatches = 2 x stages` keeps the bubble near a third (docs/targets.md
    says how to lower it). The fewest stages that fit; plan_pipeline must accept the model, else
    its reason is the suggestion."""
    sched, base = s.module.target, s.base
    if sched.pipeline.value is not None or sched.context.value is not None:
        return []
    cap, fsdp = fsdp_cap(s.module, s.model, base), base.get("fsdp", 1)
    while fsdp < 2**12 and (not cap or cap % (2 * fsdp) == 0):
        fsdp *= 2
    widest = {**base, "fsdp": fsdp}
    at = estimate_memory(
        s.module,
        s.model,
        seq=s.est.seq,
        batch=s.grown_batch(widest),
        mesh=widest,
        microbatches=s.est.microbatches,
        update_select=s.update_select,
    )
    state = at.params + at.grads + at.opt_state
    if s.ok(state) and state < at.total / 2:
        return []  # activations dominate: stages would not help (micro-batches, remat do)
    refused = ""  # plan_pipeline's first reason to refuse a stage count
    for stages in (2, 4, 8, 16, 32):
        mesh = {**widest, "stage": base.get("stage", 1) * stages}
        micro = 2 * stages
        ways = s.shards({**mesh, "stage": 1}) * micro  # each micro-batch split over data x fsdp
        batch = -(-s.grown_batch(mesh) // ways) * ways  # the same sequences per chip
        staged = _staged(s.module, mesh, micro, batch)
        if isinstance(staged, str):
            refused = refused or staged
            continue
        t = replace(s, module=staged).total(batch=batch, mesh=mesh)
        if s.ok(t):
            n = math.prod(mesh.values())
            bubble = staged.target.pipeline.value.bubble
            grown = f" --batch {batch}" if batch != s.est.batch else ""
            return [
                f"pipeline stages (the weights' dims stop FSDP at {fsdp} ways): `{s.pattern} "
                f"{{ mesh(stage = {stages}, fsdp = {fsdp})  pipeline(microbatches = {micro}) }}` "
                f"over {n} chips -> {s.shown(t)} per chip, bubble {bubble:.1%}; check it with "
                f"`axdsl aot {s.module.spec} --target {sched.profile}-{n}{grown}`"
            ]
    return [f"pipeline stages would split the weights further, but {refused}"] if refused else []


def _staged(
    module: ir.Module, mesh: dict[str, int], microbatches: int, batch: int
) -> ir.Module | str:
    """`module` with pipeline(microbatches) over mesh's `stage` axis for a step of `batch`
    sequences, as plan_pipeline plans it, or the first reason it refuses."""
    from axdsl.errors import CompileError
    from axdsl.passes.plan_pipeline import plan_pipeline

    sched, train = module.target, module.train
    settings = tuple((k, replace(c, value=batch) if k == "batch" else c) for k, c in train.settings)
    module = replace(module, train_settings=replace(train, settings=settings))
    written = tuple((a, n) for a, n in mesh.items() if n > 1 or a == "fsdp")
    sched = replace(
        sched,
        chips=math.prod(mesh.values()),
        mesh=replace(sched.mesh, value=written),
        mesh_sizes=tuple(mesh.items()),
        pipeline=ir.Choice(ir.PipelinePolicy(microbatches), ir.DEFAULT),
    )
    try:
        return plan_pipeline(replace(module, schedule=sched))
    except CompileError as exc:
        return exc.diagnostics[0].message


@dataclass(frozen=True)
class _Lever:
    """One change on the same chips: what it is called, the spec text that makes it, and how it
    changes the estimate (a variant of the module and keyword arguments of `estimate_memory`)."""

    what: str
    how: str
    apply: Callable[[ir.Module, dict], tuple[ir.Module, dict]]

    def total(self, s: _Search, *others: _Lever) -> int:
        """The analytic total with this lever and `others` applied."""
        module, kw = s.module, dict[str, object]()
        for lever in (*others, self):
            module, kw = lever.apply(module, kw)
        return replace(s, module=module).total(**kw)


def _with(**changes) -> Callable[[ir.Module, dict], tuple[ir.Module, dict]]:
    return lambda module, kw: (module, {**kw, **changes})


def _remat(s: _Search) -> _Lever | None:
    """The least recomputation stronger than the current policy that fits alone, else full."""
    now = s.est.remat
    stronger = [
        k
        for k in _REMAT_ORDER[
            _REMAT_ORDER.index(now) + 1 if now in _REMAT_ORDER else len(_REMAT_ORDER) :
        ]
        if k not in ("save", "offload")
    ]
    for kind in stronger:
        keeps = "only each layer input" if kind == "full" else "matmul outputs"
        lever = _Lever(
            f"stronger remat (keeps {keeps})",
            f"{s.pattern} {{ remat({kind}) }}",
            _with(remat=ir.RematPolicy(ir.RematKind(kind))),
        )
        if kind == stronger[-1] or s.ok(lever.total(s)):
            return lever
    return None


def _microbatches(s: _Search) -> _Lever | None:
    """Same global batch, smaller activations: the fewest micro-batches that fit alone, else
    the most the batch allows (each micro-batch still split over the batch's mesh axes)."""
    est, found = s.est, None
    k = est.microbatches * 2
    while est.batch % k == 0 and (est.batch // k) % s.shards(est.mesh) == 0:
        found = _Lever(
            f"smaller micro-batches ({est.batch // k} sequence"
            f"{'s' if est.batch // k > 1 else ''} each)",
            f"train {{ microbatches = {k} }}",
            _with(microbatches=k),
        )
        if s.ok(found.total(s)):
            break
        k *= 2
    return found


def _context(s: _Search) -> _Lever | None:
    """A long sequence split over a `seq` mesh axis taken from fsdp on the same chips, with
    ring attention (context parallelism): the fewest shards that fit alone, else the most the
    mesh allows (up to 16)."""
    if s.module.target.context.value is not None or s.est.seq < CONTEXT_MIN_SEQ:
        return None
    found = None
    for n in _context_shards(s):
        found = _context_lever(s, n)
        if s.ok(found.total(s)):
            break
    return found


def _context_shards(s: _Search) -> list[int]:
    """The seq shard counts context parallelism may take from fsdp: 2, 4, ... up to 16, each
    dividing fsdp and leaving 2 chunks per shard of the sequence (the zig-zag order)."""
    fsdp, out, n = s.est.mesh.get("fsdp", 1), [], 2
    while fsdp % n == 0 and s.est.seq % (2 * n) == 0 and n <= 16:
        out.append(n)
        n *= 2
    return out


def _context_lever(s: _Search, n: int) -> _Lever:
    """n of fsdp's shards moved to `seq` with ring attention; the weights stay sharded over
    both (rules(embed = [fsdp, seq]), MaxText's rule)."""
    mesh = s.est.mesh
    split = {**mesh, "fsdp": mesh.get("fsdp", 1) // n, "seq": mesh.get("seq", 1) * n}
    policy = ir.ContextPolicy(ir.ContextStrategy.RING, True, split["seq"])

    def apply(module: ir.Module, kw: dict) -> tuple[ir.Module, dict]:
        sched = module.target
        rules = tuple(
            (k, ir.Choice(("fsdp", "seq"), ir.DEFAULT) if k == "embed" else c)
            for k, c in sched.rules
        )
        sched = replace(sched, context=ir.Choice(policy, ir.DEFAULT), rules=rules)
        return replace(module, schedule=sched), {**kw, "mesh": split}

    return _Lever(
        f"context parallelism (the sequence over {split['seq']} chips, ring attention, "
        "the weights sharded over them too)",
        f'{s.pattern} {{ mesh(seq = {split["seq"]}, fsdp = -1)  rules(embed = [fsdp, seq])  '
        'context(strategy = "ring") }',
        apply,
    )


def unsplittable(module: ir.Module, est: MemoryEstimate) -> str | None:
    """Why the step's batch does not split over the mesh axes of `batch` (train.py's
    check_settings refuses it), or None."""
    ways = _Search(module, est.model, est, 0, "", False).shards(est.mesh)
    piece, rest = divmod(est.batch, est.microbatches)
    if rest == 0 and piece % ways == 0:
        return None
    return (
        f"batch {est.batch} in {est.microbatches} micro-batch"
        f"{'es' if est.microbatches > 1 else ''} does not split over the {ways} ways the mesh "
        "splits the batch"
    )


def split_suggestions(
    module: ir.Module, model: str, est: MemoryEstimate, usable: int, target: str, select: bool
) -> list[str]:
    """What makes an unsplittable batch run: a batch the mesh splits, or, for a long sequence,
    some of fsdp's shards moved to the sequence (context parallelism), each with its figure."""
    s = _Search(module, model, est, usable, target, select)
    ways = s.shards(est.mesh)
    step = ways * est.microbatches
    batch = -(-est.batch // step) * step
    t = s.total(batch=batch)
    out = [
        f"a global batch the mesh splits: `--batch {batch}` (or train {{ batch = {batch} }}) -> "
        f"{s.shown(t)} per chip{'' if s.ok(t) else ', does not fit'}"
    ]
    if module.target.context.value is not None:
        return out
    for n in _context_shards(s):
        piece = est.batch // est.microbatches
        if piece % (ways // n) == 0:
            lever = _context_lever(s, n)
            t = lever.total(s)
            fits = "" if s.ok(t) else ", does not fit"
            out.append(f"{lever.what}: `{lever.how}` -> {s.shown(t)} per chip{fits}")
            break
    return out


def _mu_bf16(s: _Search) -> _Lever | None:
    """adamw's and lion's first moment in bf16 (optax's mu_dtype), when it is larger now."""
    if not optim.OPTIMIZERS[s.est.optimizer].has_mu_dtype or s.est.mu_dtype in ("bf16", "f16"):
        return None
    lever = _Lever(
        "the first moment in bf16",
        f"train {{ optimizer = {s.est.optimizer}(..., mu_dtype = bf16) }}",
        _with(mu_dtype="bf16"),
    )
    return lever if lever.total(s) < s.est.total else None  # bf16 parameters: nothing to gain


def _adafactor(s: _Search) -> _Lever | None:
    """Adafactor keeps factored second moments (rows and columns) instead of two full moments."""
    adafactor = ir.OptimizerKind.ADAFACTOR
    if s.est.optimizer == adafactor:
        return None
    return _Lever(
        f"Adafactor instead of {s.est.optimizer} (factored second moments, no first moment)",
        f"train {{ optimizer = {adafactor}() }}",
        _with(optimizer=adafactor),
    )


def _quantized(s: _Search) -> list[_Lever]:
    """Matmuls with a parameter operand in each low-precision format the target runs, when the
    step quantizes none (quantize_matmuls re-run on the IR, as `quantize(fmt)` would build it)."""
    sched = s.module.target
    if sched.quantize.value.format is not ir.QuantFormat.NONE:
        return []
    out = []
    for fmt in profiles()[sched.profile].quantize:
        policy = ir.QuantPolicy(ir.QuantFormat(fmt), ("blocks/*",))
        choice = replace(sched.quantize, value=policy)

        def apply(module: ir.Module, kw: dict, choice=choice) -> tuple[ir.Module, dict]:
            quantized = replace(module, schedule=replace(module.target, quantize=choice))
            return quantize_matmuls(quantized), kw

        out.append(
            _Lever(
                f"{fmt} matmuls in the blocks",
                f'{s.pattern} {{ quantize({fmt}, layers = "blocks/*") }}',
                apply,
            )
        )
    return out


def _lora(s: _Search) -> _Lever | None:
    """When fine-tuning: LoRA adapters on the attention's wq and wv (lora(...)'s defaults)
    leave the base weights frozen, with no gradients and no optimizer state."""
    train = s.module.train_settings
    if train is None or any(k in ("lora", "freeze") for k, _ in train.settings):
        return None
    if objective_name(s.module) != "next_token":
        return None  # lora(...) trains next-token models only
    root = next(m.root for m in s.module.models if m.name == s.model)
    targets, problems = resolve_lora(LoraSettings(), root)
    if problems or not targets:  # the default targets are not matrices of this model
        return None
    adapters = ir.Choice(LoraSettings(), ir.DEFAULT)

    def apply(module: ir.Module, kw: dict) -> tuple[ir.Module, dict]:
        t = module.train
        return (
            replace(module, train_settings=replace(t, settings=t.settings + (("lora", adapters),))),
            kw,
        )

    return _Lever(
        "if you fine-tune: LoRA adapters, base weights frozen",
        'train { init_from = "PATH"  lora(rank = 8, targets = "blocks/*/attn/w[qv]") }',
        apply,
    )


def _levers(s: _Search) -> list[_Lever]:
    """What the same chips can do, in the order they are combined: recomputation, smaller
    micro-batches and context parallelism cost time only; then the optimizer's state; then
    precision; LoRA last (it changes what is trained)."""
    found = [
        _remat(s),
        _microbatches(s),
        _context(s),
        _mu_bf16(s),
        _adafactor(s),
        *_quantized(s),
        _lora(s),
    ]
    return [lever for lever in found if lever is not None]


def _on_these_chips(s: _Search) -> tuple[list[str], bool]:
    """Each lever alone with its figure, and, when none fits alone, the levers that lower the
    total combined in order until the step fits (Adafactor replaces a first moment in bf16).
    Also whether anything here fits."""
    levers = _levers(s)
    chips = "this chip" if s.est.chips == 1 else f"these {s.est.chips} chips"
    out, helps, fits_alone = [], [], False
    for lever in levers:
        t = lever.total(s)
        if t >= s.est.total:
            note = "; no smaller than now"
        else:
            helps.append(lever)
            fits_alone = fits_alone or s.ok(t)
            note = "" if s.ok(t) else f"; not enough alone on {chips}"
        out.append(f"{lever.what}: `{lever.how}` -> {s.shown(t)} per chip{note}")
    if not helps or fits_alone:
        return out, fits_alone
    chosen: list[_Lever] = []
    t = s.est.total
    for lever in helps:
        if lever.what.startswith("Adafactor"):
            chosen = [c for c in chosen if not c.what.startswith("the first moment")]
        with_it = lever.total(s, *chosen)
        if with_it >= t:
            continue  # no gain on top of the others
        chosen, t = chosen + [lever], with_it
        if s.ok(t):
            break
    names = " + ".join(f"`{c.how}`" for c in chosen)
    if s.ok(t):
        out.append(f"together on {chips}: {names} -> {s.shown(t)} per chip")
    else:
        out.append(f"even together on {chips} ({names}): {s.shown(t)} per chip, does not fit")
    return out, s.ok(t)


def _together(s: _Search) -> list[str]:
    """remat(full) and more chips at once, when nothing alone fits."""
    base = s.base
    for j in range(0, 13):
        mesh = {**base, "fsdp": base.get("fsdp", 1) * 2**j}
        batch = s.grown_batch(mesh)
        t = s.total(batch=batch, mesh=mesh, remat=ir.RematPolicy(ir.RematKind.FULL))
        if s.ok(t):
            n = mesh["fsdp"] * s.others()
            return [
                f"together: `{s.pattern} {{ remat(full) }}` and fsdp over {n} chips "
                f"(`--target {s.module.target.profile}-{n}`) -> {s.shown(t)} per chip"
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
    (the analytic total, scaled by `ratio`, XLA's over the analytic, when XLA decided): more
    chips, then what the same chips can do, each lever with its figure (`_on_these_chips`)."""
    s = _Search(module, model, est, usable, target, update_select, ratio)
    chips = _fsdp_same_chips(s) + (_more_fsdp(s) or _more_stages(s))
    same, fits_here = _on_these_chips(s)
    return chips + same + ([] if chips or fits_here else _together(s))
