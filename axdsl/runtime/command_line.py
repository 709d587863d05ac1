"""train.py's command line (flags and TrainConfig overrides), the checks of settings against the
mesh, the steps each compiled call runs, and the recovery from a non-finite step.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import NoReturn

import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding

from axdsl.runtime.checkpoints import rollback
from axdsl.runtime.processes import is_lead

OVERRIDES = {
    "steps": int,
    "batch": int,
    "seq": int,
    "microbatches": int,
    "lr": float,
    "checkpoint_every": int,
    "eval_every": int,
    "log_every": int,
    "seed": int,
    "steps_per_call": int,
}


def parse_args(
    doc: str, train, configs: dict, argv=None, spec: str = "", target: str = ""
) -> argparse.Namespace:
    """train.py's flags: --model, --out, one per OVERRIDES field, data, processes, compile cache.
    --out defaults to what `axdsl train` uses, so that either resumes the other's run."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--model", default=train.model, choices=sorted(configs))
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory (default runs/<spec>-<target>, and -<model> for another model)",
    )
    for name, kind in OVERRIDES.items():
        if hasattr(train, name):  # a classifier's TrainConfig has no seq
            p.add_argument(
                "--" + name.replace("_", "-"),
                type=kind,
                default=None,
                help=f"default {getattr(train, name)}",
            )
    p.add_argument(
        "--data",
        default=None,
        help='"default", a token file (.bin) or a text file/directory; '
        "seq2seq: SOURCE.bin,TARGET.bin; classify: a .npz of images and labels",
    )
    p.add_argument(
        "--init-from",
        default=None,
        help="start a new run from these parameters: a params checkpoint or a run "
        f"(default {train.init_from!r})",
    )
    p.add_argument(
        "--coordinator", default=None, help="host:port of process 0 (multi-process runs)"
    )
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)
    p.add_argument(
        "--compile-cache",
        default=None,
        help="compiled-program cache (default $JAX_COMPILATION_CACHE_DIR, "
        'else RUN_DIR/compile_cache; "none": off)',
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the check that the state fits this machine's memory and a checkpoint its disk",
    )
    p.add_argument(
        "--force-resume",
        action="store_true",
        help="resume a run although this command differs from what made it (run.json records it)",
    )
    p.add_argument(
        "--no-data-check",
        action="store_true",
        help="skip the scan for token ids >= vocab before training (for very large token files)",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="START:STOP",
        help="write a jax.profiler trace of steps START..STOP-1 to RUN_DIR/profile "
        "(TensorBoard, XProf)",
    )
    args = p.parse_args(argv)
    if args.out is None:
        args.out = default_run_dir(spec, target, args.model if args.model != train.model else None)
    return args


def default_run_dir(spec: str, target: str, model: str | None = None) -> Path:
    """runs/<spec>-<target>, or runs/<spec>-<target>-<model> for a model named with --model
    (axdsl/runs.py names the same directory for `axdsl train`)."""
    return Path("runs") / "-".join([Path(spec).stem, target] + ([model] if model else []))


def train_config(args: argparse.Namespace, train, configs: dict):
    """`train` (a TrainConfig) with command-line overrides applied."""
    tc = dataclasses.replace(train, model=args.model)
    max_seq = getattr(configs[args.model], "max_seq", None)
    if getattr(args, "seq", None) is None and max_seq is not None and tc.seq > max_seq:
        tc = dataclasses.replace(
            tc, seq=max_seq
        )  # another model of the spec, with shorter positions
    for name in OVERRIDES:
        if getattr(args, name, None) is not None:
            tc = dataclasses.replace(tc, **{name: getattr(args, name)})
    if args.init_from is not None:
        tc = dataclasses.replace(tc, init_from=args.init_from)
    if args.data:
        tc = dataclasses.replace(tc, **data_flag(args.data, tc))
    return tc


def data_flag(value: str, tc) -> dict:
    """The TrainConfig fields that --data sets: for a classifier a .npz (or synthetic_images), for
    seq2seq SOURCE.bin,TARGET.bin (or synthetic_pairs), for chat and preference data a .jsonl, else
    "default", a .bin or text."""
    if hasattr(tc, "synthetic_noise"):  # classify
        return (
            {"data": value}
            if value == "synthetic_images"
            else {"data": "arrays", "data_path": value}
        )
    if getattr(tc, "data", "") in ("chat", "preferences"):  # another .jsonl of the same kind
        return {"data": tc.data, "data_path": value}
    if hasattr(tc, "data_target"):  # seq2seq
        if value == "synthetic_pairs":
            return {"data": value}
        source, comma, target = value.partition(",")
        if not comma or not source or not target:
            sys.exit(
                f"error: --data {value!r}: seq2seq reads SOURCE.bin,TARGET.bin "
                "(two token files) or synthetic_pairs"
            )
        return {"data": "pairs", "data_path": source, "data_target": target}
    kind = "default" if value == "default" else "tokens" if value.endswith(".bin") else "text"
    return {"data": kind, "data_path": value}


# The least value of each integer flag, as axdsl checks the same key in a train block
# (passes/configure_train.py INT_KEYS; checkpoint(every = 0) saves only at the end).
LEAST = {
    "steps": 1,
    "batch": 1,
    "seq": 2,
    "microbatches": 1,
    "eval_every": 0,
    "log_every": 1,
    "seed": 0,
    "checkpoint_every": 0,
    "steps_per_call": 1,
}


INT32_MAX = 2**31 - 1  # the most a train block's integer may be (axdsl.ir.dtypes.INT32_MAX)


def check_values(tc) -> None:
    """Each command-line value in its range, as the same key in a train block must be: --lr -1
    would train by gradient ascent and --steps -5 record a run of -5 steps, both with exit 0."""
    problems = [
        f"--{name.replace('_', '-')} {getattr(tc, name)} must be an integer "
        + (f">= {least}" if getattr(tc, name) < least else "<= 2**31 - 1")
        for name, least in LEAST.items()
        if hasattr(tc, name) and not least <= getattr(tc, name) <= INT32_MAX
    ]
    lr = getattr(tc, "lr", None)
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        problems.append(f"--lr {lr} must be a finite learning rate above 0")
    if problems:
        sys.exit("error: " + "; ".join(problems))


def check_settings(cfg, tc, mesh, sharding: NamedSharding) -> None:
    """Settings that only the command line can break (the spec's own are checked by axdsl)."""
    check_values(tc)
    axes = sharding.spec[0] or ()
    ways = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
    problems = []
    if tc.batch % tc.microbatches or (tc.batch // tc.microbatches) % ways:
        problems.append(
            f"batch {tc.batch} must split into {tc.microbatches} micro-batches of a multiple "
            f"of {ways} sequences (the batch sharding)"
        )
    if tc.batch % jax.process_count():
        problems.append(f"batch {tc.batch} must split evenly over {jax.process_count()} processes")
    if hasattr(tc, "seq") and tc.seq > getattr(cfg, "max_seq", tc.seq):
        problems.append(f"seq {tc.seq} is longer than the model's max_seq {cfg.max_seq}")
    if (
        tc.data in ("default", "text")
        and not getattr(tc, "tokenizer", "")
        and getattr(cfg, "vocab", 256) < 256
    ):
        problems.append(f"byte-level data needs vocab >= 256, the model has {cfg.vocab}")
    if problems:
        sys.exit("error: " + "; ".join(problems))
    warmup = getattr(tc, "warmup", 0)
    if warmup and tc.steps < warmup and is_lead():
        print(
            f"warning: steps {tc.steps} end inside the learning-rate warmup ({warmup} steps): "
            f"the rate never reaches its peak",
            file=sys.stderr,
        )


def steps_in_call(tc, step: int, bounds: tuple[int, ...] = ()) -> int:
    """How many steps the jitted call from `step` runs: up to tc.steps_per_call, ending at the next
    evaluation, checkpoint, step in `bounds` (a --profile window's START and STOP: `Profile.bounds`)
    or the last step, which happen between calls."""
    n = 1
    while (
        n < tc.steps_per_call
        and step + n < tc.steps
        and not is_event(tc, step + n)
        and step + n not in bounds
    ):
        n += 1
    return n


def is_event(tc, step: int) -> bool:
    """Whether the loop evaluates or checkpoints after step `step`."""
    return any(every and step % every == 0 for every in (tc.eval_every, tc.checkpoint_every))


def recover(
    manager: ocp.CheckpointManager, abstract: dict, log, bad: tuple[int, int], skipped: int
) -> tuple[dict, int, int]:
    """After bad[1] non-finite steps in a row up to step bad[0]: `rollback` to the newest good
    checkpoint before them, logged; (state, step, skipped) to go on from, with the data offset
    moved past the data of the steps up to bad[0]. That is a function of the bad step alone, so
    the same for any steps per call. Exits with an error when there is no checkpoint to go back
    to."""
    restored = rollback(manager, abstract, bad[0] - bad[1])
    if not restored:
        no_rollback(log, *bad)
    state, data = restored
    log.restored(bad[0], bad[1], data["step"])
    return state, data["step"], skipped + bad[0] + 1 - data["step"]


def no_rollback(log, step: int, bad_steps: int) -> NoReturn:
    """Too many non-finite steps and no checkpoint before them: stop with an error rather than
    'train' on with every update skipped."""
    log.close()
    sys.exit(
        f"error: {bad_steps} non-finite steps in a row up to step {step} and no checkpoint to roll "
        f"back to: check the data (ids < vocab), lower the learning rate or turn on clipping"
    )
