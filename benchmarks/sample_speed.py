"""Sampling speed of `axdsl sample`'s generation loop: tokens/s for 200 new tokens of tiny_llama,
over the generated KV-cache decode path (`prefill`, then one `decode_step` per token) and, for
comparison, one full forward per token (the path before the cache, and the fallback for models
without a decode path).

    python benchmarks/sample_speed.py                  # tiny_llama, 200 tokens, greedy
    python benchmarks/sample_speed.py --tokens 100 --prompt "ROMEO:"
    python benchmarks/sample_speed.py --spec llama_50m --dtype bf16 --cache-only   # f32 weights, bf16 compute

Nothing is trained: the committed generated/tiny_llama/cpu/model.py is imported and its
`init_params` gives the weights (speed does not depend on their values). The tokens come from
`axdsl.sampling.generate_tokens`, the very loop `axdsl sample` streams from, so this measures what a
user waits for. The first run (compilation included) is reported apart from a second, timed run.
Both paths must give the same greedy tokens while the window holds them; the script checks it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(spec: str, tokens: int, prompt: str, cache: bool, dtype: str = "") -> tuple[dict, list[int]]:
    """Seconds and tokens/s of a cold (compiling) and a warm greedy generation of `tokens` tokens.
    `dtype` ("bf16") overrides the compute dtype; the weights stay in the config's param_dtype."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from axdsl import sampling

    model = importlib.import_module(f"generated.{spec}.cpu.model")
    cfg = next(iter(model.CONFIGS.values()))
    if dtype:
        cfg = dataclasses.replace(cfg, dtype={"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype])
    params = model.init_params(cfg, jax.random.key(0))
    ids = list(prompt.encode("utf-8"))
    result = {}
    for label in ("cold", "warm"):
        start = time.perf_counter()
        out = list(sampling.generate_tokens(model, cfg, params, ids, cfg.max_seq, tokens,
                                            sampling.Sampling(temperature=0.0, cache=cache),
                                            np.random.default_rng(0)))
        seconds = time.perf_counter() - start
        assert len(out) == tokens
        result[label] = (seconds, tokens / seconds)
    return result, out


def main() -> None:
    """Print tokens/s of the cold and the warm run."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="tiny_llama", help="a committed generated/<spec>/cpu (default tiny_llama)")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens to generate (default 200)")
    ap.add_argument("--prompt", default="The ", help='prompt text, byte-level (default "The ")')
    ap.add_argument("--dtype", default="", choices=["", "bf16", "f32"], help="compute dtype override (default: the spec's)")
    ap.add_argument("--cache-only", action="store_true", help="time the KV-cache path only (default: both)")
    args = ap.parse_args()
    rates = {}
    outputs = {}
    for cache in (True,) if args.cache_only else (False, True):
        path = "kv cache" if cache else "full forward"
        r, outputs[cache] = measure(args.spec, args.tokens, args.prompt, cache, args.dtype)
        for label, (seconds, rate) in r.items():
            print(f"{args.spec} {path} {label}: {args.tokens} tokens in {seconds:.2f} s = {rate:.1f} tokens/s")
        rates[cache] = r["warm"][1]
    if args.cache_only:
        return
    model = importlib.import_module(f"generated.{args.spec}.cpu.model")
    fits = next(iter(model.CONFIGS.values())).max_seq - len(args.prompt.encode("utf-8"))
    same = outputs[True][:fits] == outputs[False][:fits]
    print(f"speedup (warm): {rates[True] / rates[False]:.1f}x; greedy tokens equal within the window "
          f"({fits} tokens): {same}")


if __name__ == "__main__":
    main()
