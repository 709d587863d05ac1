"""The fixed parts of the mixture-of-experts layer: DeepSeek's group-limited choice, the
bias-balancing gradient, and the capacity and dropless dispatch paths. The router itself,
`moe_swiglu`, is assembled from the parts a spec uses (primitives/moe.py).

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

import math

import jax
import jax.numpy as jnp


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


def _moe_with_capacity(x, weights, routed, w_gate, w_up, w_down, capacity_factor):
    """Dispatch to [B, experts, capacity] slots with one-hot einsums, run experts, combine."""
    batch, seq, top_k, experts = routed.shape
    capacity = max(1, math.ceil(top_k * seq * capacity_factor / experts))
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
    return jnp.einsum("becd,bsec->bsd", ye, combine)


def _moe_dropless(x, weights, chosen, w_gate, w_up, w_down, batch_axes=()):
    """The dropless path, one batch shard at a time: under a mesh that splits the batch over
    `batch_axes`, each device sorts and runs only its own tokens (shard_map; the expert weights
    enter whole, as the grouped matmuls need them). One sort over the whole batch would make
    every device hold and compute every device's routed rows. A token's output depends on that
    token alone, so the split changes no output; the weights' gradients are summed per shard and
    then across shards, as every layer's are when the batch is split."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(a for a in batch_axes if not mesh.empty and mesh.shape.get(a, 1) > 1)
    if not axes or x.shape[0] % math.prod(mesh.shape[a] for a in axes):
        return _moe_dropless_rows(x, weights, chosen, w_gate, w_up, w_down)
    # Manual over the batch axes only where other axes split something (experts, model), so the
    # weights keep their layout on those; else over the whole mesh (XLA:CPU 0.10.2 aborted
    # compiling a partly manual shard_map whose other axes all had size 1).
    others = any(n > 1 for a, n in mesh.shape.items() if a not in axes)
    rows, whole = jax.sharding.PartitionSpec(axes), jax.sharding.PartitionSpec()
    return jax.shard_map(
        _moe_dropless_rows,
        in_specs=(rows, rows, rows, whole, whole, whole),
        out_specs=rows,
        axis_names=frozenset(axes) if others else frozenset(),
    )(x, weights, chosen, w_gate, w_up, w_down)


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
