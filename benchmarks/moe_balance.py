"""Does DeepSeek-V3's bias balancing (`balance_rate`) even out the experts' load? Prints, per run,
the most loaded expert's share over the mean (1.0 is perfectly balanced) after training.

    python benchmarks/moe_balance.py              # 8 experts, top 2, 150 steps, rate 0.01 vs 0

The same tiny DeepSeekMoE LM (tests/test_moe_balance.py's spec) trains on uniform random tokens
with and without balancing (a stream dominated by one token id cannot be balanced: the same token
always meets the same experts, whatever the bias). The load is read from the balanced model's own probe: the selection
bias's gradient is each expert's tokens minus the mean (see _moe_balance in the generated kernels.py),
so load = gradient + mean. Both runs share the forward (balancing never changes it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rate", type=float, default=0.01)
    args = p.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tests.targets_util import import_generated
    from tests.test_moe_balance import _spec

    tmp = Path(tempfile.mkdtemp())
    runs = {"balanced": import_generated(_spec(tmp, args.rate), "cpu", tmp / "on"),
            "unbalanced": import_generated(_spec(tmp, 0.0), "cpu", tmp / "off")}
    probe, _ = runs["balanced"]
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 64, size=200_000)  # uniform ids: an uneven load is the router's doing
    for name, (model, train) in runs.items():
        cfg = model.CONFIGS["bal"]
        tc = train.TRAIN.__class__(**{**train.TRAIN.__dict__, "steps": args.steps})
        mesh = model.make_mesh(jax.devices()[:1])
        with jax.set_mesh(mesh):
            state = train.init_state(cfg, tc, mesh, jax.random.key(0))
            step = train.make_train_step(cfg, tc, mesh)
            for i in range(args.steps):
                starts = rng.integers(0, len(stream) - 17, 8)
                batch = jnp.asarray(np.stack([stream[s:s + 17] for s in starts]), jnp.int32)
                state, metrics = step(state, jax.device_put(batch, train.batch_sharding(mesh)))
        tokens = jnp.asarray(np.stack([stream[s:s + 17] for s in range(0, 64 * 17, 17)]), jnp.int32)
        grads = jax.grad(lambda p: probe.loss_fn(cfg, p, tokens)[0])(state["params"])
        surplus = np.asarray(grads["blocks"]["mlp"]["score_bias"])  # [layers, experts]
        routed = 64 * 16 * 2  # tokens x top_k per layer
        load = surplus + routed / surplus.shape[-1]
        ratio = load.max(-1) / load.mean(-1)
        print(f"{name:11s} after {args.steps} steps: loss {float(metrics['loss']):.3f}, "
              f"max/mean expert load per layer {', '.join(f'{r:.2f}' for r in ratio)}")


if __name__ == "__main__":
    main()
