"""The query blocks of vjp_attention (attention.py). No jax here: aot's memory model imports this
rule (primitives/attention_kernels.vjp_blocks) and generated code copies it, one home for both.

Copied into generated models by codegen (codegen/helpers.py reads this file as text and cuts out
the definitions a primitive's `Source` names); the copies import only what the helper's
`imports` list, so a definition here uses nothing else."""

VJP_QUERY_BLOCK = 128  # causal and windowed attention: queries per block, at most 8 blocks


def _vjp_attention_blocks(seq, kv_seq, causal, window):
    """(first query, end query, first key, end key) of each block: the keys its queries see."""
    if not (causal or window) or seq != kv_seq:
        return [(0, seq, 0, kv_seq)]
    size = max(VJP_QUERY_BLOCK, -(-seq // 8))
    blocks = []
    for start in range(0, seq, size):
        end = min(seq, start + size)
        first = max(0, start - window + 1) if window else 0
        blocks.append((start, end, first, end if causal else kv_seq))
    return blocks
