"""Pipeline parallelism as plain JAX (plan_pipeline, the target directive `pipeline(...)`).

`pipeline` runs a repeat's stacked layers as `stages` stages over the `stage` mesh axis, in the
SPMD form of MaxText's pipeline: one stage's layers vmapped over the stages, one jax.lax.scan
over the iterations, and each stage's output rolled to the next stage (GSPMD turns a roll along a
stage-sharded dim into a collective-permute). The batch is cut into `microbatches` pieces: at
iteration t stage s works on piece t - s. With `repeats` R > 1 the schedule is circular: stage s
holds the layers of blocks s, stages + s, 2 * stages + s, ..., and a piece passes through the
stages R times, coming back to stage 0 from the output buffer.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions the helper's `Source` names); the copies import only what the helper's
`imports` list.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def pipeline(
    step: Callable,
    x: jax.Array,
    layer_params,
    *,
    stages: int,
    microbatches: int,
    repeats: int = 1,
    carry_spec: P | None = None,
    specs=None,
    unroll: bool = False,
    mesh_axis: str = "stage",
    sides: tuple[jax.Array, ...] = (),
    aux: bool = False,
):
    """The repeat's layers on x [B, ...] as a pipeline; the same result as
    `jax.lax.scan(step, x, layer_params)[0]` up to float rounding.

    step(h, one_layer_params, *sides) -> (h, _): the repeat's scan step (remat and the weights'
    cast included); `sides` are the layers' other inputs, each [B, ...] like x (a packed row's
    segment ids), cut into the same micro-batches: a stage reads those of the piece it works
    on. layer_params: the stacked weights, [layers, ...] each, layer
    (r * stages + s) * per_stage + j running on stage s in repeat r. carry_spec: where one
    micro-batch lives inside a stage (the carry's PartitionSpec without `mesh_axis`); specs: the
    stacked weights' PartitionSpecs (their `layers` dim on `mesh_axis`), or None. The loop runs
    microbatches * repeats + stages - 1 iterations, stages - 1 of them the bubble. Without a
    mesh that has `mesh_axis` (set by jax.set_mesh) it is that scan.

    With `aux`, the layers add an auxiliary loss: step returns (h, statistics), a tuple of
    (a, b, c) means over the micro-batch's tokens whose loss is sum(a * b) + c (moe_aux_stats).
    Each layer's statistics are averaged over the micro-batches it ran (the bubble's iterations
    count for nothing), which gives the whole batch's, and pipeline returns (y, the loss summed
    over the layers): the same as the scan's, which sees the whole batch at once.
    """
    if not _mesh_has(mesh_axis):  # one device (sampling, tests): a pipeline is only overhead
        y, stats = jax.lax.scan(lambda h, w: step(h, w, *sides), x, layer_params, unroll=unroll)
        return (y, _aux_loss(stats)) if aux else y
    carry_spec = P() if carry_spec is None else carry_spec
    pieces = x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    io = _constrain(pieces, P(None, *carry_spec))  # stage 0's inputs, then the outputs
    side_pieces = [s.reshape(microbatches, -1, *s.shape[1:]) for s in sides]  # [M, B / M, ...]
    weights = jax.tree.map(lambda w: w.reshape(repeats, stages, -1, *w.shape[1:]), layer_params)
    if specs is not None:
        weights = jax.tree.map(
            lambda w, spec: _constrain(w, P(None, mesh_axis, None, *spec[1:])),
            weights,
            specs,
        )

    on_stages = P(mesh_axis, *carry_spec)  # [stages, B / microbatches, ...]: one per stage

    def run_stage(h, stage_sides, stage_params):  # one stage: its layers in turn
        return jax.lax.scan(lambda h, w: step(h, w, *stage_sides), h, stage_params, unroll=unroll)

    run_stages = jax.vmap(run_stage, spmd_axis_name=mesh_axis)  # every stage at once, one per shard

    def iteration(carry, t):
        state, io = carry  # state [stages, B / microbatches, ...]: each stage's input
        # stage 0 takes piece t: a new micro-batch, or its output of the last repeat
        state = _constrain(state.at[0].set(io[t % microbatches]), on_stages)
        # each stage's repeat: stage s works on piece t - s
        repeat = jnp.clip((t - jnp.arange(stages)) // microbatches, 0, repeats - 1)
        current = jax.tree.map(lambda w: _stage_weights(w, repeat), weights)
        piece = (t - jnp.arange(stages)) % microbatches  # the piece each stage works on
        stage_sides = [
            _constrain(p[piece], P(mesh_axis, *carry_spec[: p.ndim - 1])) for p in side_pieces
        ]
        out, stats = run_stages(state, stage_sides, current)  # stats [stages, per_stage, ...]
        out = _constrain(out, on_stages)
        done = t - (stages - 1)  # the piece the last stage finished (none yet while negative)
        slot = done % microbatches
        io = io.at[slot].set(jnp.where(done >= 0, out[-1], io[slot]))
        # stage s's output is stage s + 1's next input: a roll along the stage-sharded dim,
        # which GSPMD runs as a collective-permute between neighbouring stages
        state = _constrain(jnp.roll(out, 1, axis=0), on_stages)
        return (state, io), (stats if aux else None)

    state = jnp.zeros((stages, *pieces.shape[1:]), x.dtype)
    steps = jnp.arange(microbatches * repeats + stages - 1)
    (_, io), stats = jax.lax.scan(iteration, (state, io), steps)
    y = io.reshape(x.shape)
    if not aux:
        return y
    return y, _aux_loss(jax.tree.map(lambda a: _per_layer(a, microbatches, repeats), stats))


def _per_layer(stats: jax.Array, microbatches: int, repeats: int) -> jax.Array:
    """One statistic of every iteration, [iterations, stages, per_stage, ...] -> [layers, ...]:
    each layer's mean over the micro-batches. At iteration t stage s ran piece t - s in repeat
    (t - s) // microbatches, or idled in the bubble (t - s outside [0, microbatches * repeats)),
    whose statistics of garbage are left out."""
    iterations, stages = stats.shape[:2]
    piece = jnp.arange(iterations)[:, None] - jnp.arange(stages)[None, :]  # [iterations, stages]
    piece = piece.reshape(piece.shape + (1,) * (stats.ndim - 2))
    per_repeat = [  # [stages, per_stage, ...] each: the sum over the micro-batches of repeat r
        jnp.sum(
            jnp.where((piece >= r * microbatches) & (piece < (r + 1) * microbatches), stats, 0),
            axis=0,
        )
        for r in range(repeats)
    ]
    # layer (r * stages + s) * per_stage + j is repeat r's stage s's j-th
    return (jnp.stack(per_repeat) / microbatches).reshape(-1, *stats.shape[3:])


def _aux_loss(stats) -> jax.Array:
    """The auxiliary loss [] from the layers' statistics, a tuple of (a, b, c) triples of
    [layers, ...] means: the sum of sum(a * b) + c over the triples and the layers."""
    return sum((jnp.sum(a * b) + jnp.sum(c) for a, b, c in stats), jnp.zeros((), jnp.float32))


def _stage_weights(w: jax.Array, repeat: jax.Array) -> jax.Array:
    """w [repeats, stages, per_stage, ...] -> [stages, per_stage, ...]: each stage's block of
    layers for its current repeat (stage s reads w[repeat[s], s])."""
    if w.shape[0] == 1:
        return w[0]
    return jax.vmap(lambda ws, r: ws[r], in_axes=(1, 0))(w, repeat)


def _mesh_has(axis: str) -> bool:
    """Whether the mesh set by jax.set_mesh has `axis` (no mesh: a one-device run)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and axis in mesh.axis_names


def _constrain(x: jax.Array, spec: P) -> jax.Array:
    """x pinned to `spec` on the mesh set by jax.set_mesh."""
    return jax.lax.with_sharding_constraint(x, spec)
