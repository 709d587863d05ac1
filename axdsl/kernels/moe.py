"""The mixture-of-SwiGLU-experts layer, in the pieces a generated model calls one after another:
a router with its auxiliary loss (`moe_route`, softmax top-k; or `moe_route_deepseek`,
DeepSeek-V3's choice), a dispatch path (`moe_with_capacity`, `moe_dropless`, or
`moe_dispatch` when the Config picks one at run time) and DeepSeek-V3's bias balancing
(`moe_balance`). primitives/moe.py emits the calls a spec uses, so the generated kernels.py holds
only those pieces.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import math

import jax
import jax.numpy as jnp


def moe_route(
    logits: jax.Array,
    top_k: int,
    normalize: bool,
    aux_weight: float,
    z_weight: float,
    aux=None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Softmax router: each token's `top_k` experts by router probability, weighted by those
    probabilities (renormalized over the chosen k when `normalize`, as Mixtral and Qwen3 do).

    logits [B, S, experts] -> (weights [B, S, top_k], chosen experts [B, S, top_k], auxiliary
    loss [], see _moe_aux_loss; or, with aux=moe_aux_stats, its statistics)."""
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)  # [B, S, experts]
    weights, chosen = jax.lax.top_k(probs, top_k)  # [B, S, top_k]
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    aux = _moe_aux_loss if aux is None else aux
    return weights, chosen, aux(logits, probs, chosen, aux_weight, z_weight)


def moe_route_deepseek(
    logits: jax.Array,
    top_k: int,
    normalize: bool,
    aux_weight: float,
    z_weight: float,
    score: str,
    groups: int,
    top_groups: int,
    scale: float,
    bias: jax.Array | None = None,
    aux=None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """DeepSeek-V3's router: with `score` "sigmoid" the scores are independent sigmoids (else a
    softmax); `bias` (if given) shifts them for the choice of experts only; with `groups` > 1 a
    token chooses among the experts of its `top_groups` best groups; the weights are the chosen
    scores without the bias, renormalized when `normalize`, times `scale`.

    logits [B, S, experts] -> (weights [B, S, top_k], chosen experts [B, S, top_k], auxiliary
    loss [], see _moe_aux_loss; or, with aux=moe_aux_stats, its statistics)."""
    logits = logits.astype(jnp.float32)
    if score == "sigmoid":
        probs = jax.nn.sigmoid(logits)  # [B, S, experts]
    else:
        probs = jax.nn.softmax(logits, axis=-1)
    chosen = _moe_choose(probs, bias, top_k, groups, top_groups)  # [B, S, top_k]
    weights = jnp.take_along_axis(probs, chosen, axis=-1)  # the scores, without the bias
    if normalize:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    weights = scale * weights
    aux = _moe_aux_loss if aux is None else aux
    return weights, chosen, aux(logits, probs, chosen, aux_weight, z_weight)


def _moe_choose(probs, bias, top_k, groups, top_groups):
    """Each token's top_k experts by score (+ bias), among the experts of its top_groups best
    groups."""
    choice = probs if bias is None else probs + bias.astype(jnp.float32)  # [B, S, experts]
    if groups > 1:
        grouped = choice.reshape(*choice.shape[:-1], groups, -1)  # [B, S, groups, experts / groups]
        group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # its two best experts
        best = jax.lax.top_k(group_scores, top_groups)[1]  # [B, S, top_groups]
        kept = jnp.sum(jax.nn.one_hot(best, groups), axis=-2) > 0  # [B, S, groups]
        choice = jnp.where(kept[..., None], grouped, -jnp.inf).reshape(choice.shape)
    return jax.lax.top_k(choice, top_k)[1]


def _moe_aux_loss(logits, probs, chosen, aux_weight, z_weight):
    """The router's auxiliary loss [] from its float32 logits and scores [B, S, experts] and
    choices [B, S, top_k]: aux_weight x the Switch load-balancing loss (experts x the sum over
    experts of its share of the routed tokens times its mean router probability) plus z_weight x
    the router z-loss (ST-MoE: the mean squared logsumexp of the logits)."""
    load, importance = _moe_load(probs, chosen)
    aux = aux_weight * probs.shape[-1] * jnp.sum(load * importance)
    return aux + z_weight * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)


def _moe_load(probs, chosen):
    """Each expert's share of the routed tokens (load [experts]) and its mean router probability
    (importance [experts]), from the scores [B, S, experts] and choices [B, S, top_k]."""
    experts, top_k = probs.shape[-1], chosen.shape[-1]
    routed = jax.nn.one_hot(chosen, experts, dtype=jnp.float32)  # [B, S, top_k, experts]
    load = jnp.mean(jnp.sum(routed, axis=2), axis=(0, 1)) / top_k
    return load, jnp.mean(probs, axis=(0, 1))


def moe_aux_stats(logits, probs, chosen, aux_weight, z_weight):
    """_moe_aux_loss's statistics, for a layer inside a pipeline, which sees one micro-batch at
    a time: ((aux_weight x experts x load [experts], importance [experts], z_weight x z-loss []),),
    each a mean over the micro-batch's tokens. Their means over equal micro-batches are the whole
    batch's, from which the pipeline computes the loss, sum(load x importance) + z-loss: the
    balancing loss is a product of two means, so a mean of the micro-batches' losses would differ.
    A 1-tuple, so that the statistics of a layer's several routers add up by concatenation."""
    load, importance = _moe_load(probs, chosen)
    experts = probs.shape[-1]
    z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    return ((aux_weight * experts * load, importance, z_weight * z),)


def moe_with_capacity(
    x: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    capacity_factor: float,
) -> jax.Array:
    """The routed tokens x [B, S, dim] through SwiGLU experts, each expert taking at most
    ceil(top_k * S * capacity_factor / experts) tokens of each sequence, first choices first
    (GShard, Switch); tokens over capacity skip that expert and keep their residual. Dispatch to
    [B, experts, capacity] slots with one-hot einsums, run experts, combine: y [B, S, dim]."""
    batch, seq, top_k = chosen.shape
    experts = w_gate.shape[0]
    capacity = max(1, math.ceil(top_k * seq * capacity_factor / experts))
    routed = jax.nn.one_hot(chosen, experts, dtype=jnp.float32)  # [B, S, top_k, experts]
    # Each choice's place in its expert's queue: all first choices, then all second choices, ...
    queue = routed.swapaxes(1, 2).reshape(batch, top_k * seq, experts)  # [B, top_k * S, experts]
    position = ((jnp.cumsum(queue, axis=1) - 1) * queue).astype(jnp.int32)
    kept = queue * (position < capacity)  # choices that found a slot
    slots = jax.nn.one_hot(position, capacity, dtype=x.dtype) * kept[..., None].astype(x.dtype)
    slots = slots.reshape(batch, top_k, seq, experts, capacity)
    dispatch = jnp.sum(slots, axis=1)  # [B, S, experts, capacity], 0 or 1
    combine = jnp.einsum("bksec,bsk->bsec", slots, weights.astype(x.dtype))
    xe = jnp.einsum("bsd,bsec->becd", x, dispatch)  # [B, experts, capacity, dim]
    h = jax.nn.silu(jnp.einsum("becd,edh->bech", xe, w_gate)) * jnp.einsum(
        "becd,edh->bech", xe, w_up
    )
    ye = jnp.einsum("bech,ehd->becd", h, w_down)  # [B, experts, capacity, dim]
    return jnp.einsum("becd,bsec->bsd", ye, combine).astype(x.dtype)


def moe_dropless(
    x: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    batch_axes: tuple[str, ...] = (),
    staged: bool = False,
) -> jax.Array:
    """The routed tokens x [B, S, dim] through SwiGLU experts with nothing dropped: tokens are
    sorted by expert and run through grouped matmuls, y [B, S, dim].

    One batch shard at a time: under a mesh that splits the batch over `batch_axes`, each device
    sorts and runs only its own tokens (shard_map; the expert weights enter whole, as the grouped
    matmuls need them). One sort over the whole batch would make every device hold and compute
    every device's routed rows. A token's output depends on that token alone, so the split
    changes no output; the weights' gradients are summed per shard and then across shards, as
    every layer's are when the batch is split. `staged`: the call runs inside pipeline()'s vmap
    over the `stage` axis, which holds that axis (not among `batch_axes`): the shard_map is
    manual over the whole mesh, since a partly manual one cannot leave the vmap's axis to XLA."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(a for a in batch_axes if not mesh.empty and mesh.shape.get(a, 1) > 1)
    if not axes or x.shape[0] % math.prod(mesh.shape[a] for a in axes):
        y = _moe_dropless_rows(x, weights, chosen, w_gate, w_up, w_down)
    else:
        # Manual over the batch axes only where other axes split something (experts, model), so
        # the weights keep their layout on those; else over the whole mesh (XLA:CPU 0.10.2
        # aborted compiling a partly manual shard_map whose other axes all had size 1).
        others = any(n > 1 for a, n in mesh.shape.items() if a not in axes)
        rows, whole = jax.sharding.PartitionSpec(axes), jax.sharding.PartitionSpec()
        y = jax.shard_map(
            _moe_dropless_rows,
            in_specs=(rows, rows, rows, whole, whole, whole),
            out_specs=rows,
            axis_names=frozenset(axes) if others and not staged else frozenset(),
        )(x, weights, chosen, w_gate, w_up, w_down)
    return y.astype(x.dtype)


def _moe_dropless_rows(x, weights, chosen, w_gate, w_up, w_down):
    """Sort the (token, choice) pairs by expert and run grouped matmuls: no token is dropped."""
    batch, seq, dim = x.shape
    top_k, experts = chosen.shape[-1], w_gate.shape[0]
    flat = chosen.reshape(-1)  # [B * S * top_k]
    order = jnp.argsort(flat, stable=True)
    tokens = jnp.repeat(x.reshape(-1, dim), top_k, axis=0)[order]  # grouped by expert
    sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)  # tokens per expert
    gate = jax.lax.ragged_dot(tokens, w_gate, sizes)
    h = jax.nn.silu(gate) * jax.lax.ragged_dot(tokens, w_up, sizes)
    out = jax.lax.ragged_dot(h, w_down, sizes)  # [B * S * top_k, dim], sorted
    out = jnp.zeros_like(out).at[order].set(out).reshape(batch, seq, top_k, dim)
    return jnp.einsum("bskd,bsk->bsd", out, weights.astype(x.dtype))


def moe_dispatch(
    x: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    capacity_factor: float,
    batch_axes: tuple[str, ...] = (),
    staged: bool = False,
) -> jax.Array:
    """The capacity path when capacity_factor > 0, else the dropless one (over `batch_axes`,
    `staged` inside a pipeline's stages): for a capacity_factor the Config holds, so that either
    may run."""
    if capacity_factor > 0:
        return moe_with_capacity(x, weights, chosen, w_gate, w_up, w_down, capacity_factor)
    return moe_dropless(x, weights, chosen, w_gate, w_up, w_down, batch_axes, staged)


def moe_balance(y: jax.Array, bias: jax.Array, chosen: jax.Array) -> jax.Array:
    """y, unchanged; in the backward pass the selection bias [experts] gets each expert's load
    surplus, its tokens among `chosen` [B, S, top_k] above the mean (see _moe_balance)."""
    load = jnp.bincount(chosen.reshape(-1), length=bias.shape[0]).astype(jnp.float32)
    return _moe_balance(y, bias, load)


def moe_balance_stats(bias: jax.Array, chosen: jax.Array, microbatches: int):
    """moe_balance for a layer inside a pipeline, as statistics of the auxiliary loss (see
    moe_aux_stats): ((bias - stop_gradient(bias), microbatches x the load surplus of `chosen`
    [B, S, top_k], 0),). Their loss is exactly 0. Its gradient for the bias is the surplus
    averaged over the micro-batches the pipeline ran, the bubble's left out, times
    `microbatches`: the whole batch's surplus, the gradient moe_balance gives unpipelined. A
    custom_vjp's gradient would not depend on the output's, so the bubble's would count."""
    load = jnp.bincount(chosen.reshape(-1), length=bias.shape[0]).astype(jnp.float32)
    surplus = jax.lax.stop_gradient((load - jnp.mean(load)) * microbatches)
    return ((bias - jax.lax.stop_gradient(bias), surplus, jnp.zeros((), jnp.float32)),)


@jax.custom_vjp
def _moe_balance(y, bias, load):
    """y, unchanged. In the backward pass `bias` gets load - mean(load): each expert's tokens in
    this batch above the mean (its true gradient is zero, the choice being discrete). train.py's
    optimizer turns it into DeepSeek-V3's auxiliary-loss-free balancing rule,
    bias -= balance_rate * sign(load - mean load), outside AdamW and clipping."""
    return y


def _moe_balance_fwd(y, bias, load):
    return y, ((load - jnp.mean(load)).astype(bias.dtype), load)


def _moe_balance_bwd(residual, g):
    surplus, load = residual
    return g, surplus, jnp.zeros_like(load)


_moe_balance.defvjp(_moe_balance_fwd, _moe_balance_bwd)
