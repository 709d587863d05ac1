"""What XLA does differently per platform, as facts the memory model reads (measured, not guessed).

The memory model (memory.py, activations.py) counts the buffers a step needs; how many of them
XLA keeps at once depends on its compiler for the platform. XLA:CPU fuses little and runs one op
at a time; XLA:TPU fuses elementwise chains into the matmuls and reductions around them and
writes many results in place. Each fact below is one such difference, with the measurement that
justifies it (buffer assignments: `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`, then the
step's `*memory-usage-report.txt`; TPU figures from deviceless tpu-v5e-1 compiles with libtpu,
checked against a real v5e chip in /work/tpu_results, benchmarks/memory_table.py).

GPU facts come from deviceless compiles by XLA's GPU compiler (jax's CUDA plugin, aot/gpu.py).
Trainium targets use the CPU facts until they are measured: those are the conservative ones (more
buffers live), so their analytic verdicts err towards "does not fit".
"""

from __future__ import annotations

from dataclasses import dataclass

from axdsl.ir import nodes as ir


@dataclass(frozen=True)
class PlatformFacts:
    """How many buffers of each transient XLA keeps at once on one platform."""

    # The fused cross-entropy's working set, per chunk of positions: float32 [B, chunk, vocab]
    # buffers (logits, softmax, gradient) and ones in the head matmul's dtype (logits, gradient).
    loss_f32: int
    loss_low: int
    # The chunk scan's head-parameter gradient: carried from chunk to chunk beside the one
    # returned (2), or accumulated in place (1).
    loss_head_grads: int
    # A rematerialized layer's backward: the fraction of (its recomputed residuals + the
    # largest cotangent) live at once. XLA:TPU recomputes elementwise residuals (casts, the
    # activations' and norms' products) inside the fusions that consume them, so fewer exist.
    layer_recompute: float
    # Lanes of a tensor's minor dimension: XLA:TPU lays arrays out in tiles of 128 lanes, so a
    # minor dimension of 64 (a head_dim) takes 128 (0: no padding).
    lanes: int
    # 32-bit copies of a dropless MoE's dispatched tokens [B, S, top_k, dim] in the backward
    # (XLA:TPU sorts, gathers and scatters bf16 rows as u32).
    moe_dispatch_u32: int
    # Of splash's fused backward's dq copies (one per key tile, summed after the kernel), the
    # fraction XLA:TPU's total grows by: 32k tokens, remat full, 4 GiB of copies, +1.94 GiB.
    splash_dq_live: float
    # Whether XLA recomputes the SSD's cheap values (its masks, decays, C.B and float32 copies)
    # inside the fusions that read them, keeping only the scores, the discretized x and the
    # states: a deviceless v5e compile of chained SSDs (1 x 2048, 80 heads of 64) keeps 186 MiB
    # per call, where jax's saved_residuals list 634 MiB (benchmarks/RESULTS.md).
    ssd_fused: bool
    # Memory a program may use per chip, as a fraction of the HBM: what the analytic verdict
    # holds the total to (XLA keeps the rest for itself).
    usable_fraction: float
    # The largest analytic overestimate measured on steps XLA fits, as a fraction: the analytic
    # verdict says "fits (borderline)" up to usable x (1 + this), so that it never refuses a step
    # the compiler would fit (the price: a step in that band may not fit; the report says so).
    overestimate: float = 0.0
    # Of the SSD's internals (primitives/ssd.py's list), what XLA keeps beyond the fused set
    # (ssd.py `FUSED_KEEPS`, XLA:TPU's) when `ssd_fused`: names from that list.
    ssd_extra_keeps: frozenset[str] = frozenset()
    # Whether a remat policy lowers what an unrolled block (unroll_repeats) keeps. XLA:CPU keeps
    # every residual of an unrolled block whatever its policy: its figure is remat none's.
    unrolled_remat: bool = True
    # Whether XLA's figure is a peak over the step's phases (XLA:TPU's peak_memory_in_bytes,
    # what a chip needs) rather than a sum of its buffers (XLA:CPU's temp_size): then the
    # layers' gradients do not yet exist at the loss, and the activations are gone at the update.
    phased: bool = False
    # The generated step's update, skipped on a non-finite loss with jax.lax.cond: the fraction
    # of (trained parameters + optimizer moments) it materializes beside the gradients before
    # they are copied into the donated state (0: written in place, as XLA:CPU and XLA:TPU do).
    cond_update: float = 0.0
    # Under FSDP, buffers of the whole output head (all its parameters, gathered over the batch
    # axes, in the compute dtype) live in the fused cross-entropy's loop: the gathered weights
    # and their full-size gradient before it is reduce-scattered (0: XLA keeps the head sharded
    # or counts it elsewhere).
    loss_gathered_head: int = 0
    # Buffers [experts, tokens x top_k, d] in a dropless MoE layer's backward, as (how many with
    # d the model dim, how many with d the expert hidden): XLA:GPU expands each grouped matmul
    # (ragged_dot) into a masked dot per expert ((0, 0): XLA computes it grouped).
    moe_ragged_dense: tuple[int, int] = (0, 0)
    # The same on more than one chip, where the step runs under other XLA flags (train.py's
    # multi-GPU ones: pipelined collectives, double-buffered loops); None: as on one chip.
    moe_ragged_dense_sharded: tuple[int, int] | None = None
    # A copy of the stacked layers' parameters (this fraction of their bytes on a chip) that XLA
    # transposes once before the layer loops and keeps through the backward: on one chip when
    # the matmuls are fp8 (cuBLASLt's fp8 gemms take one operand layout only), and under FSDP
    # (0: no such copy).
    transposed_layers_fp8: float = 0.0
    transposed_layers_fsdp: float = 0.0
    # The form of the generated step's skip-if-not-finite update that keeps the least memory here
    # (choose_update_skip records it; codegen writes it): jax.lax.cond, written in place by
    # XLA:CPU and XLA:TPU, or an elementwise select of every leaf.
    update_skip: ir.UpdateSkip = ir.UpdateSkip.COND
    # With the select form, the fraction of (trained parameters + optimizer moments) the update
    # materializes before the select: measured on XLA:CPU, 0.53-0.58 over three model shapes (the
    # select overlaps with the next leaf's update).
    select_update: float = 0.57


CPU = PlatformFacts(
    loss_f32=3,
    loss_low=2,
    loss_head_grads=2,
    layer_recompute=1.0,
    lanes=0,
    splash_dq_live=1.0,
    ssd_fused=False,
    moe_dispatch_u32=0,
    usable_fraction=0.9,
    unrolled_remat=False,
)
# CPU, unrolled blocks (the cpu profile's unroll(16)), cpu-8, benchmarks/memory_table.py: a small
# f32 llama (4 layers, 8 x 256) with remat(full) is 109.49 MiB in XLA, remat(none)'s figure
# (analytic none 109.05, -0.4%; full 82.29, -24.8%); a small Mamba-2 (2 layers, 8 x 512) with
# remat(full) 166.54 MiB (analytic none 174.44, +4.7%; full 120.09, -27.9%).
# tpu-v5e-1, llama 3.2 1B at 4 layers, 4 x 2048, vocab 128256, loss chunk 512: the loss's only
# large buffers are one f32[4, 512, 128256] (1002 MiB) and one bf16 (501 MiB), and the six
# bf16[128256, 2048] gradient values of the tied head share one 501 MiB buffer (was modelled as
# 3 x f32 + 2 x bf16 and two gradients: +2.5 GiB). XLA gives a program 15.75 of v5e's 16 GiB
# (its RESOURCE_EXHAUSTED message, tpu.py hbm_available): 0.984.
# XLA's TPU figure is its peak_memory_in_bytes: on a v5e chip, a filler array bisected beside
# the step (benchmarks/tpu_bench.py --fill) left room for 10.69 GiB where the peak said 10.58
# (llama 1B, remat full), 12.44 for 12.24 (save = [q, k, v]) and 11.14 for 10.87 (32k tokens),
# while arguments + temp_size said 12.53, 15.65 and 12.94: temp_size sums buffers never live
# together. The peak is phased: the layers' gradients do not exist yet at the loss.
# Remat full/save, layer backward: the peak less the state, weight copies, what is saved and the
# layers' gradients, over the modelled recompute + cotangent, on nine configs of
# benchmarks/memory_table.py (llama 1B with splash and with XLA attention, 32k tokens, gemma 2,
# two MoE cuts, Mamba-2, gpt2-medium): 0.31-1.14, and 0.42 keeps every total within 8%.
# Lanes: llama 1B at 4 layers with remat(save = [query_proj, ...]) stacks its saved queries as
# bf16[4, 4, 2048, 32, 64] in a 256 MiB buffer, twice their 128 MiB.
# MoE: a 2-layer, 1024-wide model with 32 experts, top-8, 4 x 2048, keeps u32[65536, 1024]
# buffers of 256 MiB (four, two live at once beside the bf16 ones) that the model missed: 2.38 ->
# 2.88 GiB against XLA's 2.88.
# Overestimate: benchmarks/memory_table.py, steps XLA fits: at most +4.4% (gemma 2, remat full).
TPU = PlatformFacts(
    loss_f32=1,
    loss_low=1,
    loss_head_grads=1,
    layer_recompute=0.42,
    lanes=128,
    splash_dq_live=0.5,
    ssd_fused=True,
    moe_dispatch_u32=2,
    usable_fraction=15.75 / 16,
    overestimate=0.05,
    phased=True,
)

# XLA:GPU, measured 2026-12-07 on deviceless compiles for H100 / H200 (jax's CUDA plugin,
# axdsl/aot/gpu.py; benchmarks/memory_table.py --gpu --dump DIR, which prints what the step's
# `*live-range.txt` says is live at XLA's peak, with shapes from `*buffer-assignment.txt`):
# Phased: XLA:GPU's temp_size is ONE preallocated-temp allocation whose values sit at offsets the
# heap simulator assigned, and values of different phases share offsets (llama 3 8B, FSDP 8: offset
# 0 of the block holds the loss's bf16[4096, 128256] head, fp8 weight copies and the update's
# f32[32, 14336, 512] moments): its size is a peak over the step, like TPU's.
# cond_update: llama 3 8B on 8 H100s at 8 x 128 and 8 x 2048 peaks in the update: the block's
# 14.96 GiB is the f32 gradients (3.74) and the jax.lax.cond's outputs, new parameters and both
# Adam moments (11.22), copied into the donated state after the conditional (41 copies); llama
# 3.2 1B on one H100 likewise (9.21 GiB = 4 x 2.30). Was modelled in place: -32%.
# loss_gathered_head: llama 3.2 1B (tied) on 8 H100s, 8 x 2048, remat full: the peak is in the
# chunked loss's loop and holds bf16[2048, 128256] (the embedding gathered whole) and
# bf16[128256, 2048] (its full-size gradient), 501 MiB each, beside one chunk's bf16[1, 512,
# 128256] logits and their bf16[512, 128256] gradient (loss_low 2; a float32 chunk, loss_f32 1,
# keeps the 1B rows within 6%, none within 15%) and one head gradient (loss_head_grads 1).
# layer_recompute 0.42 and ssd_fused as on TPU: with CPU's 1.0 and unfused SSD, 32k tokens with
# remat full was +44% and Mamba-2 +46% (XLA:GPU fuses the recomputed elementwise values too);
# ssd_extra_keeps: Mamba-2 2.7B at 4 layers, 4 x 2048, one H100, remat none, with train.py's
# flags (benchmarks/memory_table.py --gpu --dump, module jit_step): the forward layer loop's
# stacked outputs (while tuple) that the backward reads hold, per layer, beyond the fused set:
# the f32 `decay` exp(where(causal, cum_l - cum_s, -inf)) (index 34, f32[4, 4, 8, 1, 80, 256,
# 256], 640 MiB a layer: fused_dynamic_update_slice.16 computes the exp; the bf16 scores beside
# it, index 38, are the fused set's "scores"), x in float32 (index 31, f32[4, 4, 2048, 80, 64],
# convert of silu(conv_x)), the read-out product (index 50, the f32 output of the
# `bclgn,cbghpn->bclghp` cuBLAS dot, f32[4, 4, 8, 1, 80, 64, 256]) and C.B per group (index 37,
# f32[4, 4, 1, 1, 8, 256, 256], the `bclgn,bcsgn->bgcls` dot): 968 MiB a layer. Mamba-2 none
# -21.6% -> -0.6% (15.87 -> 20.12 GiB against XLA's 20.25); remat full, where these are in a
# layer's recompute, -8.3% -> -1.5% (7.10 -> 7.63 against 7.74). The block's other stacked
# values (a layer's seven f32 [B, S, 5120] and six bf16 ones, 1.56 GiB, and smaller [B, S,
# dim] and [B, S, state] ones: about 1.8 GiB; the gated norm's, the D skip's, the silus' and
# their casts) are matched in bulk, not one by one, by the residuals the tracer lists outside
# the SSD (1.74 GiB a layer).
# moe_ragged_dense: a 2-layer Qwen3-MoE (32 experts of 768, top-8); with train.py's XLA flags
# (2026-12-07, benchmarks/memory_table.py --gpu --dump): on one H100 at 4 x 2048 the layer
# backward holds two bf16[32, 65536, 2048] and their transpose bf16[65536, 32, 2048] (8 GiB each:
# every expert's masked copy of the 65,536 dispatched rows), no hidden-wide one at the peak: (3,
# 0), -2.2%; on 8 H100s (1 x 2048 each, pipelined collectives, double-buffered loops) three
# bf16[32, 16384, 2048], their transpose and three bf16[32, 16384, 768] (10.25 GiB): (4, 3),
# -5.2% (was -33% with (dim, hidden, dim, dim) everywhere). Not two layers' gathered experts:
# those are one layer's, 3 x 96 MiB and their gradient, as gathered_weights counts.
# transposed_layers: llama 3.2 1B on one H100 with fp8 keeps `wrapped_transpose` copies of every
# stacked layer matrix (bf16[2048, 16, 8192], bf16[8192, 16, 2048] x 2, ...: 1.81 GiB, the
# layers' bytes) through the backward; in bf16 (save_dots) there are none. Under FSDP 8 one of
# each group is transposed: bf16[256, 16, 8192] and bf16[256, 16, 32, 64] for the 1B (80 of 243
# MiB, live at its peak in the loss), f32[512, 32, 14336] and f32[512, 32, 32, 128] for the 8B
# (1.13 of 3.25 GiB): 1/3. Rows: 1B one GPU -15.6% -> -0.9%, 1B bf16 FSDP 8 -12.1% -> -9.5%, 8B
# FSDP 8 -9.9% -> -4.1%; Mamba-2 full (one GPU, fp8) -17.9% -> -10.4% (it transposes 400 of its
# 643 MiB; the rest of its gap was the SSD's f32 values, ssd_extra_keeps above, now -1.5%).
# Overestimate: at most +6.5% on the GPU rows XLA fits (the 1-GPU MoE, default flags).
# update_skip select: the same steps with the skip written as jnp.where(ok, new, old) per leaf
# instead of jax.lax.cond: XLA:GPU fuses each select into the update's elementwise loop and
# writes the donated state in place. Temp block, deviceless, with train.py's XLA flags: llama 3
# 8B on 8 H100s at 8 x 2048, 14.99 -> 10.74 GiB; llama 3.2 1B (f32 weights, 4 micro-batches)
# on one H100 at 4 x 2048, 18.42 -> 12.09 GiB. select_update 0, measured: in the 8B's dump the
# update phase (after the backward loop) holds the f32 gradients and transposed copies of a
# third of them (input_transpose_fusion, 1.13 GiB), 6.12 GiB at most, no new parameters or
# moments, under the backward's 7.36; no GPU row peaks in the update any more.
GPU = PlatformFacts(
    loss_f32=1,
    loss_low=2,
    loss_head_grads=1,
    layer_recompute=0.42,
    lanes=0,
    splash_dq_live=1.0,
    ssd_fused=True,
    ssd_extra_keeps=frozenset(("decay", "x in float32", "read-out product", "C.B per group")),
    moe_dispatch_u32=0,
    usable_fraction=0.9,
    overestimate=0.07,
    phased=True,
    cond_update=1.0,
    loss_gathered_head=2,
    moe_ragged_dense=(3, 0),
    moe_ragged_dense_sharded=(4, 3),
    transposed_layers_fp8=1.0,
    transposed_layers_fsdp=1 / 3,
    update_skip=ir.UpdateSkip.SELECT,
    select_update=0.0,
)

FACTS = {
    ir.ChipKind.CPU: CPU,
    ir.ChipKind.GPU: GPU,
    ir.ChipKind.TRN: CPU,
    ir.ChipKind.TPU: TPU,
}


def facts(kind: ir.ChipKind) -> PlatformFacts:
    """The facts of a target kind (cpu, gpu, tpu, trn)."""
    return FACTS[kind]
