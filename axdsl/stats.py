"""`axdsl stats`: parameter counts, model FLOPs and per-chip memory of a spec's models, from the IR.

Nothing is compiled and jax is not imported, so it answers in well under a second:

    axdsl stats specs/mixtral_8x7b.axl --target tpu-v5e-256

Active parameters are those one token uses: every parameter, less the experts a token is not
routed to (an MoE layer with E experts and top-k routing uses k / E of its expert weights).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from axdsl import primitives
from axdsl.analysis.flops import (
    RuleContext,
    bubble_slowdown,
    layer_count,
    model_flops,
    param_count,
)
from axdsl.analysis.memory import estimate_memory
from axdsl.ir import nodes as ir
from axdsl.ir.printer import pipeline_text
from axdsl.ir.rewrite import prims_of
from axdsl.lora import resolve as resolve_lora
from axdsl.pipeline import compile_spec
from axdsl.targets import profiles


@dataclass(frozen=True)
class ModelStats:
    name: str
    total_params: int  # what the optimizer trains (Hugging Face's num_parameters())
    active_params: int
    embedding_params: int
    seq: int
    flops_per_token: int  # training (3 x forward), at `seq`
    flops_per_step: int  # training, one global batch
    balancing_params: int = 0  # MoE selection biases the balancing rule moves (state, not trained)


def active_params(model: ir.Model) -> int:
    """Trained parameters one token uses: the total less what primitives leave idle (routed
    experts) and the balancing biases (state)."""
    unused = 0
    for inst in model.root.walk():
        for e in prims_of(inst):
            rule = primitives.get(e.name).unused_params
            if rule is not None:
                unused += rule(RuleContext(inst), e) * layer_count(model.root, inst)
    return param_count(model).trained - unused


def model_stats(model: ir.Model, seq: int, batch: int) -> ModelStats:
    pc = param_count(model)
    f = model_flops(model, seq)
    return ModelStats(
        model.name,
        pc.trained,
        active_params(model),
        pc.embedding,
        seq,
        f.train_per_token,
        f.per_step(batch),
        pc.balancing,
    )


def _fmt(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _lora_line(settings, model: ir.Model) -> str:
    """What lora(...) trains: the adapters' size against the frozen base (why the memory drops)."""
    targets, _ = resolve_lora(settings, model.root)
    n = sum(t.adapter_elements(settings.rank) for t in targets)
    return (
        f"{n:,} adapter parameters ({_fmt(n)}, rank {settings.rank}) on {len(targets)} weights "
        f"({', '.join(t.path for t in targets)}); "
        "the base is frozen: no gradients, no optimizer state"
    )


def _batch_source(module: ir.Module) -> str:
    """Where the step's batch and seq come from: the train block, or the defaults."""
    t = module.train_settings
    kinds = {t.choice(k).origin.kind for k in ("batch", "seq")} if t is not None else set()
    if kinds == {ir.OriginKind.DEFAULT} or not kinds:
        return "(the defaults: no train block sets them)"
    return (
        "from the train block" if ir.OriginKind.DEFAULT not in kinds else "(train block, defaults)"
    )


def run(spec: Path, target: str = "cpu", model: str | None = None) -> int:
    module = compile_spec(spec, target)
    sched = module.target
    train = module.train
    batch, seq = train.get("batch"), train.get("seq")
    profile = profiles()[sched.profile]
    models = [m for m in module.models if model is None or m.name == model]
    if not models:
        names = ", ".join(m.name for m in module.models)
        print(f"axdsl: error: no model `{model}` in {spec}; models: {names}", file=sys.stderr)
        return 1
    mesh = ", ".join(f"{a}={n}" for a, n in sched.mesh_sizes if n != 1) or "one chip"
    print(
        f"{spec} on {target}: {sched.chips} x {profile.description} ({mesh}); "
        f"batch {batch} x seq {seq} {_batch_source(module)}"
    )
    for m in models:
        s = model_stats(m, seq, batch)
        est = estimate_memory(module, m.name, batch=batch, seq=seq)
        print(f"\n{m.name}")
        print(
            f"  parameters        {s.total_params:,} total ({_fmt(s.total_params)}), "
            f"{s.active_params:,} active per token ({_fmt(s.active_params)}), "
            f"{s.embedding_params:,} in embeddings"
        )
        if s.balancing_params:
            print(
                f"  + state           {s.balancing_params:,} MoE selection biases, "
                "moved by the balancing rule after each step, not trained "
                "(a buffer in Hugging Face's count)"
            )
        print(
            f"  model FLOPs       {_fmt(s.flops_per_token)} per token, "
            f"{_fmt(s.flops_per_step)} per step (training, 3 x forward, MaxText's formula)"
        )
        step_s = s.flops_per_step / (sched.chips * profile.peak_flops("bf16"))
        print(
            f"  at 100% MFU       {step_s * 1e3:.1f} ms per step on {sched.chips} chips (bf16 peak)"
        )
        if sched.pipeline.value is not None:  # plan_pipeline: the layers' share idles this much
            print(f"  pipeline          {pipeline_text(sched.pipeline.value)}")
            slowed = bubble_slowdown(model_flops(m, seq), sched.pipeline.value)
            print(
                f"  with the bubble   {step_s * slowed * 1e3:.1f} ms per step at best: "
                f"MFU at most {1 / slowed:.1%}"
            )
        print(
            f"  memory per chip   parameters {_gib(est.params)}, gradients {_gib(est.grads)}, "
            f"optimizer state {_gib(est.opt_state)}, activations {_gib(est.activations)} "
            f"(remat {est.remat}); total {_gib(est.total)} of {_gib(profile.hbm_bytes)} HBM"
        )
        if "lora" in dict(train.settings):
            print(f"  lora              {_lora_line(train.get('lora'), m)}")
    return 0
