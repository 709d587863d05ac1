"""Optimizers and learning-rate schedules: what a train block's `optimizer = ...` and
`schedule = ...` may name, each with one registry entry.

    optimizer = adamw(lr = 3e-4, b1 = 0.9, b2 = 0.95, weight_decay = 0.1, mu_dtype = bf16)
    schedule = wsd(warmup = 100, decay = 0.2, final = 0.0)

An entry holds what the other stages ask of it: its arguments and their defaults (the spec may
set any subset; configure_train checks them), for an optimizer the state the memory model counts
(analysis/memory.py, aot/suggest.py) and for both the lines train.py spells it with
(codegen/emit_train.py) and their docstring. Nothing else compares optimizer or schedule names:
an optimizer or schedule is added here, with its kind in `ir.OptimizerKind` / `ir.ScheduleKind`.
"""

from __future__ import annotations

from dataclasses import dataclass

from axdsl.ir import nodes as ir

_CLIP = "optax.clip_by_global_norm(tc.clip) if tc.clip else optax.identity(),"
# `{mu}` in an optimizer's body: the first moment's dtype when the spec sets mu_dtype; nothing
# otherwise, so specs that leave it out generate what they always did.
MU_DTYPE_ARG = ", mu_dtype=tc.mu_dtype or None"


@dataclass(frozen=True)
class Optimizer:
    """One optimizer: its arguments, its state per parameter, and its optax spelling."""

    kind: ir.OptimizerKind
    arguments: tuple[tuple[str, float | bool], ...]  # and their defaults
    # Moments per parameter element in the parameter dtype (the memory model); a factored one
    # keeps float32 row and column statistics of a matrix instead (Adafactor).
    moments: int
    body: tuple[str, ...]  # train.py's base_optimizer, `{mu}` where MU_DTYPE_ARG goes
    doc: str  # base_optimizer's docstring
    factored: bool = False
    # Arguments that name a dtype, each optional: left out, it is not in the resolved call and
    # train.py passes nothing (optax keeps the state in the parameter dtype). `mu_dtype` is
    # optax's: the dtype of the first moment (adamw's mu, lion's momentum), e.g. bf16 to halve it.
    dtypes: tuple[str, ...] = ()

    @property
    def defaults(self) -> dict[str, float | bool]:
        return dict(self.arguments)

    @property
    def has_mu_dtype(self) -> bool:
        """Whether its first moment can take its own dtype (optax's mu_dtype)."""
        return "mu_dtype" in self.dtypes

    def lines(self, call: ir.NamedCall) -> list[str]:
        """base_optimizer's lines for the resolved `call` (`{mu}` filled in)."""
        mu = MU_DTYPE_ARG if call.arg("mu_dtype", None) is not None else ""
        return [line.replace("{mu}", mu) for line in self.body]


@dataclass(frozen=True)
class Schedule:
    """One learning-rate schedule: its arguments and its optax spelling."""

    kind: ir.ScheduleKind
    arguments: tuple[tuple[str, float | None], ...]  # a warmup left out (None): a tenth of the run
    body: tuple[str, ...]  # train.py's lr_schedule
    doc: str
    # It decays over the last `decay` fraction of the steps (in (0, 1]), after the warmup (wsd).
    decay_phase: bool = False

    @property
    def defaults(self) -> dict[str, float | None]:
        return dict(self.arguments)


_MASKED = "lr, mask = lr_schedule(tc), decay_mask()"
OPTIMIZERS: dict[ir.OptimizerKind, Optimizer] = {
    o.kind: o
    for o in (
        Optimizer(
            ir.OptimizerKind.ADAMW,
            (("lr", 3e-4), ("b1", 0.9), ("b2", 0.95), ("eps", 1e-8), ("weight_decay", 0.1)),
            moments=2,
            body=(
                _MASKED,
                "return optax.chain(",
                f"    {_CLIP}",
                "    optax.adamw(lr, b1=tc.b1, b2=tc.b2, eps=tc.eps, weight_decay=tc.weight_decay, "
                "mask=mask{mu}),",
                ")",
            ),
            doc="Clip by global norm, then AdamW with decoupled weight decay on matrices only.",
            dtypes=("mu_dtype",),
        ),
        Optimizer(
            ir.OptimizerKind.LION,
            (("lr", 1e-4), ("b1", 0.9), ("b2", 0.99), ("weight_decay", 0.1)),
            moments=1,
            body=(
                _MASKED,
                "return optax.chain(",
                f"    {_CLIP}",
                "    optax.lion(lr, b1=tc.b1, b2=tc.b2, weight_decay=tc.weight_decay, "
                "mask=mask{mu}),",
                ")",
            ),
            doc="Clip by global norm, then Lion (sign momentum) with weight decay on matrices "
            "only.",
            dtypes=("mu_dtype",),
        ),
        Optimizer(
            ir.OptimizerKind.ADAFACTOR,
            (("lr", 1e-2), ("weight_decay", 0.0)),
            moments=0,
            factored=True,
            body=(
                _MASKED,
                "return optax.chain(",
                f"    {_CLIP}",
                "    optax.adafactor(lr, weight_decay_rate=tc.weight_decay or None, "
                "weight_decay_mask=mask),",
                ")",
            ),
            doc="Clip by global norm, then Adafactor (factored second moments) with decay on "
            "matrices.",
        ),
        Optimizer(
            ir.OptimizerKind.SGD,
            (("lr", 1e-2), ("momentum", 0.9), ("nesterov", False), ("weight_decay", 0.0)),
            moments=1,
            body=(
                "return optax.chain(",
                f"    {_CLIP}",
                "    optax.add_decayed_weights(tc.weight_decay, mask=decay_mask()),",
                "    optax.sgd(lr_schedule(tc), momentum=tc.momentum or None, "
                "nesterov=tc.nesterov),",
                ")",
            ),
            doc="Clip by global norm, weight decay on matrices, then SGD with (Nesterov) momentum.",
        ),
    )
}

SCHEDULES: dict[ir.ScheduleKind, Schedule] = {
    s.kind: s
    for s in (
        Schedule(
            ir.ScheduleKind.COSINE,
            (("warmup", None), ("final", 0.1)),
            body=(
                "return optax.warmup_cosine_decay_schedule(",
                "    0.0, tc.lr, tc.warmup, max(tc.steps, tc.warmup + 1), "
                "end_value=tc.lr * tc.final",
                ")",
            ),
            doc="linear warmup to lr, then cosine decay to lr * final",
        ),
        Schedule(
            ir.ScheduleKind.LINEAR,
            (("warmup", None), ("final", 0.0)),
            body=(
                "return optax.join_schedules(",
                "    [optax.linear_schedule(0.0, tc.lr, tc.warmup),",
                "     optax.linear_schedule(tc.lr, tc.lr * tc.final, "
                "max(tc.steps - tc.warmup, 1))],",
                "    [tc.warmup],",
                ")",
            ),
            doc="linear warmup to lr, then linear decay to lr * final",
        ),
        Schedule(
            ir.ScheduleKind.CONSTANT,
            (("warmup", 0),),
            body=(
                "if not tc.warmup:",
                "    return optax.constant_schedule(tc.lr)",
                "return optax.join_schedules(",
                "    [optax.linear_schedule(0.0, tc.lr, tc.warmup), "
                "optax.constant_schedule(tc.lr)],",
                "    [tc.warmup],",
                ")",
            ),
            doc="linear warmup to lr, then constant",
        ),
        Schedule(
            ir.ScheduleKind.WSD,
            (("warmup", None), ("decay", 0.2), ("final", 0.0)),
            body=(
                "decay_start = max(int(tc.steps * (1 - tc.decay)), tc.warmup)",
                "return optax.join_schedules(",
                "    [optax.linear_schedule(0.0, tc.lr, tc.warmup),",
                "     optax.constant_schedule(tc.lr),",
                "     optax.linear_schedule(tc.lr, tc.lr * tc.final, "
                "max(tc.steps - decay_start, 1))],",
                "    [tc.warmup, decay_start],",
                ")",
            ),
            doc="warmup, stable at lr, then linear decay to lr * final over the last `decay` "
            "fraction",
            decay_phase=True,
        ),
        Schedule(
            ir.ScheduleKind.RSQRT,
            (("warmup", None),),
            body=(
                "warmup = max(tc.warmup, 1)",
                "",
                "def schedule(step):",
                "    step = jnp.asarray(step, jnp.float32)",
                "    decay = tc.lr * jnp.sqrt(warmup / jnp.maximum(step, warmup))",
                "    return jnp.where(step < tc.warmup, tc.lr * step / warmup, decay)",
                "",
                "return schedule",
            ),
            doc="linear warmup to lr, then lr * sqrt(warmup / step)",
        ),
    )
}
DEFAULT_OPTIMIZER = ir.OptimizerKind.ADAMW
DEFAULT_SCHEDULE = ir.ScheduleKind.COSINE


def optimizer(kind: str) -> Optimizer:
    """The entry of an optimizer kind (an `ir.OptimizerKind` or its name)."""
    return OPTIMIZERS[ir.OptimizerKind(kind)]


def schedule(kind: str) -> Schedule:
    """The entry of a schedule kind (an `ir.ScheduleKind` or its name)."""
    return SCHEDULES[ir.ScheduleKind(kind)]
