"""select_kernels: choose the attention kernel for each `attention(...)` on this target.

The profile lists kernels in order of preference (gpu: cudnn, xla; tpu: splash, xla; cpu: xla).
Each kernel states its constraints below; the first whose constraints hold for *every* model of
the spec wins (they share one generated function), and the reasons the others were rejected are
kept on the primitive so codegen writes them as a comment. `kernels(attention = K)` in a target
block forces K, and a forced kernel whose constraints fail is an error, not a silent fallback.
Generated code holds only the chosen call; nothing branches on the backend at run time.

Constraints, from the installed jax (0.10.2) sources:

    cudnn   jax/_src/nn/functions.py dot_product_attention(implementation="cudnn") and
            jax/_src/cudnn/fused_attention_stablehlo.py (check_layout, check_is_flash_attention,
            _check_qkv_bias_mask_spec):
            - q, k, v in bf16 or f16 (f32 raises NotImplementedError; fp8 is a separate API)
            - head_dim a multiple of 8, at most 128 (A100), 256 on Hopper and later (H100+)
            - GQA is native (kv heads may be fewer); causal and a left sliding window run in
              the kernel (local_window_size=(window - 1, 0) becomes sliding_window_length)
            - an explicit mask is added as a dense bias, which must span [S_q, S_kv]
            - sharded only over batch and heads: no sequence (`seq`) or head_dim sharding, and
              q, k, v sharded alike (the `heads` and `kv_heads` rules agree)
    splash  jax/experimental/pallas/ops/tpu/splash_attention/ (BlockSizes, make_splash_mha):
            - bf16 or f32; sequence tiles of 128 (NUM_LANES), so max_seq % 128 == 0 (the helper
              raises ValueError for another runtime length); head_dim a multiple of 128 (the
              lane width; the kernel slices smaller head dims, but we keep to the shapes it is
              tuned and tested for on TPU)
            - causal, sliding-window or full masks (CausalMask, LocalMask, FullMask); an
              explicit mask array would need a per-batch dynamic mask, so it is not used
            - GQA is native (kv head = query head // group); any sharding: the helper runs in
              jax.shard_map over batch and heads and gathers what else is split
"""

from __future__ import annotations

from dataclasses import replace

from axdsl.errors import Diagnostics
from axdsl.ir import nodes as ir
from axdsl.ir.rewrite import map_forward, prims_of
from axdsl.passes.annotate_sharding import kept_axes
from axdsl.targets import profiles

SPLASH_BLOCK = 128  # TPU lane width: splash tiles head_dim and the sequence by 128


def select_kernels(module: ir.Module) -> ir.Module:
    sched = module.schedule
    choice = dict(sched.kernels)["attention"]
    preference = profiles()[sched.profile].attention
    diags = Diagnostics()
    decisions: dict[str, ir.KernelChoice] = {}
    for inst in module.models[0].root.walk():
        if not _attention_prims(inst):
            continue
        per_model = [_find(m.root, inst.path) for m in module.models]
        candidates = preference if choice.value == "auto" else (choice.value,)
        notes = []
        for kernel in candidates:
            reasons = [r for m, i in zip(module.models, per_model) for r in _violations(kernel, m, i, sched)]
            if not reasons:
                break
            notes.append(f"{kernel} not used: {reasons[0]}")
            if choice.value != "auto":
                diags.error(choice.span, f"{inst.path}: the `{kernel}` attention kernel cannot run this "
                                         f"attention: {reasons[0]}", "use kernels(attention = auto) to fall back")
        else:
            kernel = "xla"
        decisions[inst.path] = ir.KernelChoice(kernel, tuple(notes), choice.origin)
    diags.raise_if_any()
    models = tuple(replace(m, root=_apply(m.root, decisions)) for m in module.models)
    return replace(module, models=models)


def _find(root: ir.Instance, path: str) -> ir.Instance:
    return next(i for i in root.walk() if i.path == path)


def _attention_prims(inst: ir.Instance) -> list[ir.Prim]:
    return list(prims_of(inst, "attention"))


def _compute_dtype(model: ir.Model) -> str:
    h = model.root.hparam("dtype")
    return h.value.value.name if h is not None and isinstance(h.value.value, ir.DType) else "f32"


def _violations(kernel: str, model: ir.Model, inst: ir.Instance,
                sched: ir.Schedule | None = None) -> list[str]:
    """Why `kernel` cannot run this instance's attention for `model`; empty when it can."""
    out = []
    dtype = _compute_dtype(model)
    max_seq = model.root.hparam("max_seq")
    for prim in _attention_prims(inst):
        q_dims, k_dims = prim.args[0].type.dims, prim.args[1].type.dims
        head_dim = q_dims[-1].size
        mask = prim.operand("mask")
        if kernel == "cudnn":
            if dtype not in ("bf16", "f16"):
                out.append(f"{model.name} computes in {dtype}; cuDNN flash attention needs bf16 or f16")
            limit = profiles()[sched.profile].cudnn_head_dim_max if sched is not None else 128
            if head_dim is None or head_dim > limit or head_dim % 8:
                chip = f" on {sched.profile}" if sched is not None else ""
                out.append(f"{model.name} has head_dim {head_dim}; cuDNN needs a multiple of 8 "
                           f"up to {limit}{chip}")
            if mask is not None:
                m_dims = mask.type.dims
                if len(m_dims) < 2 or not (m_dims[-2].same(q_dims[1]) and m_dims[-1].same(k_dims[1])):
                    out.append("a mask that is not [..., S, S]; jax's cuDNN path adds the mask as a "
                               "bias, which must span the query and key sequences")
            if sched is not None:
                out.extend(_cudnn_sharding_violations(sched))
        elif kernel == "splash":
            if dtype not in ("bf16", "f32"):
                out.append(f"{model.name} computes in {dtype}; splash attention takes bf16 or f32")
            if head_dim is None or head_dim % SPLASH_BLOCK:
                out.append(f"{model.name} has head_dim {head_dim}; splash needs a multiple of {SPLASH_BLOCK}")
            if max_seq is not None and max_seq.value.value % SPLASH_BLOCK:
                out.append(f"{model.name} has max_seq {max_seq.value.value}; splash needs a multiple of {SPLASH_BLOCK}")
            if mask is not None:
                out.append("an explicit mask; splash runs causal and sliding-window masks only")
    return out


def _cudnn_sharding_violations(sched: ir.Schedule) -> list[str]:
    """jax partitions cuDNN attention over batch and heads only, with q, k, v sharded alike."""
    def split(logical: str) -> tuple[str, ...]:
        return tuple(a for a in kept_axes(sched, logical) if sched.size(a) > 1)

    out = []
    if split("seq"):
        out.append(f"the sequence is sharded over {', '.join(split('seq'))} on {sched.name}; "
                   "jax's cuDNN attention cannot shard the sequence dim")
    if split("head_dim"):
        out.append(f"head_dim is sharded over {', '.join(split('head_dim'))} on {sched.name}; "
                   "jax's cuDNN attention cannot shard head_dim")
    if split("heads") != split("kv_heads"):
        out.append(f"heads ({', '.join(split('heads')) or 'replicated'}) and kv_heads "
                   f"({', '.join(split('kv_heads')) or 'replicated'}) are sharded differently on "
                   f"{sched.name}; jax's cuDNN attention needs q, k, v sharded alike")
    return out


def _apply(inst: ir.Instance, decisions: dict[str, ir.KernelChoice]) -> ir.Instance:
    children = tuple(_apply(c, decisions) for c in inst.children)
    forward = inst.forward
    if inst.path in decisions:
        decision = decisions[inst.path]

        def mark(e: ir.TExpr) -> ir.TExpr:
            if isinstance(e, ir.Prim) and e.name == "attention":
                return replace(e, kernel=decision)
            return e

        forward = map_forward(forward, mark)
    return replace(inst, children=children, forward=forward)
