"""Where the attention helpers copied into generated models live (see attention.py), all in
axdsl/kernels/: einsum_attention (attention written out, for what jax.nn.dot_product_attention
cannot express), vjp_attention (the same einsums with a backward written out: the `vjp` kernel),
cached_attention (the decode path's attention over a KV cache) and splash_attention (the TPU
Pallas kernel and its sharding)."""

from __future__ import annotations

from axdsl.kernels.vjp_blocks import _vjp_attention_blocks
from axdsl.primitives.base import Helper, Source

EINSUM_ATTENTION = Source("attention", ("einsum_attention",))

# The vjp helper's block rule is one home: generated code copies it, aot's memory model imports it
# (axdsl/kernels/vjp_blocks.py imports no jax).
VJP_ATTENTION = (
    Source("vjp_blocks", ("VJP_QUERY_BLOCK", "_vjp_attention_blocks")),
    Source("attention", ("vjp_attention", "_vjp_attention_fwd", "_vjp_attention_bwd")),
)
VJP_IMPORTS = ("import functools", "import jax", "import jax.numpy as jnp")

CACHED_ATTENTION = Source("attention", ("cached_attention",))

# dividing_axes is copied by both splash and context parallelism, which never run together
# (under context(...) splash runs as splash_context_attention, which does not copy it).
DIVIDING_AXES = Source("mesh", ("dividing_axes",))
SPLASH_ATTENTION = (
    DIVIDING_AXES,
    Source(
        "splash",
        (
            "PALLAS_INTERPRET",
            "SPLASH_BATCH_AXES",
            "SPLASH_HEAD_AXES",
            "SPLASH_FUSED_DQ_BYTES",
            "splash_attention",
            "_splash_per_device",
            "splash_block_sizes",
        ),
    ),
)
# Splash under context(strategy = "all_gather"): its own shard_map (context_layout, from
# CONTEXT_PARALLEL, which every context-parallel call copies) around the kernel built over the
# whole sequence; never copied with SPLASH_ATTENTION (a context-parallel model's calls all run
# per shard).
SPLASH_CONTEXT_ATTENTION = Source(
    "splash",
    (
        "PALLAS_INTERPRET",
        "SPLASH_FUSED_DQ_BYTES",
        "splash_context_attention",
        "_spec_axes",
        "_splash_context_mask",
        "splash_block_sizes",
    ),
)
SPLASH_IMPORTS = (
    "import functools",
    "import math",
    "import jax",
    "import jax.numpy as jnp",
    "from jax.sharding import PartitionSpec as P",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel",
    "from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask",
)

# Context parallelism (kernels/context.py): context_parallel lays q, k, v out on the mesh and runs
# one of the two attentions in jax.shard_map (with the mask of original positions both use).
CONTEXT_PARALLEL = (
    DIVIDING_AXES,
    Source(
        "context",
        (
            "CONTEXT_BATCH_AXES",
            "CONTEXT_HEAD_AXES",
            "CONTEXT_MASKED",
            "context_parallel",
            "context_layout",
            "_context_args",
            "local_positions",
            "_context_keep",
        ),
    ),
)
CONTEXT_IMPORTS = (
    "import math",
    "from collections.abc import Callable",
    "import jax",
    "import jax.numpy as jnp",
    "import numpy as np",
    "from jax.sharding import Mesh",
    "from jax.sharding import PartitionSpec as P",
)
CONTEXT_ALL_GATHER = Source("context", ("context_attention_all_gather",))
CONTEXT_RING = Source(
    "context",
    (
        "RING_KEY_BLOCK",
        "context_attention_ring",
        "_ring_attention",
        "_ring_tiles",
        "_ring_key_block",
        "_blocks",
        "_unblocks",
        "_tied",
        "_ring_attention_fwd",
        "_ring_attention_bwd",
    ),
)
# The order a balanced context-parallel model runs the sequence in: the root reorders by it, rope
# and attention read it (the one helper that more than attention's calls need).
CONTEXT_ORDER_HELPER = Helper(
    "context_order",
    Source("context", ("zigzag_order", "context_order")),
    ("import jax", "import numpy as np"),
)


def vjp_blocks(
    seq: int, kv_seq: int, causal: bool, window: int | None
) -> list[tuple[int, int, int, int]]:
    """The query blocks the generated vjp helper runs: (first query, end query, first key, end
    key)."""
    return _vjp_attention_blocks(seq, kv_seq, causal, window)


def vjp_kept_keys(seq: int, causal: bool, window: int | None) -> int:
    """Keys per query whose probabilities the vjp kernel keeps, averaged over the queries (its
    blocks skip the keys no query of theirs sees): seq without causal or window."""
    kept = sum(
        (end - start) * (last - first)
        for start, end, first, last in vjp_blocks(seq, seq, causal, window)
    )
    return -(-kept // seq)
