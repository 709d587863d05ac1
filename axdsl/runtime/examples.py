"""Batches of named fields for the objectives other than next_token: masked_lm rows, packed
seq2seq pairs, images and labels; synthetic stand-ins when no data is given.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import dataclasses
import sys
import zipfile
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding

from axdsl.runtime.data import data_path, load_data
from axdsl.runtime.processes import is_lead

# The objectives other than next_token read batches of named fields (a dict of arrays [batch, ...],
# every field sharded like the batch): masked_lm rows of tokens, seq2seq rows packed from
# (source, target) pairs, classify images and labels. A dataset is a dict of such arrays with one
# row per example; a step's rows are drawn from it as a pure function of (seed, step).


def load_examples(
    cfg,
    tc,
    spec: str,
    objective: str,
    inputs: tuple,
    from_flag: bool,
    scan_ids: bool = True,
    run_dir: Path | None = None,
) -> tuple:
    """The train and eval data of a masked_lm or seq2seq run, checked before the first step.
    masked_lm: a token stream, as next_token reads it (rows are cut from it per step); seq2seq:
    (source, target) pairs packed into rows (see pack_pairs)."""
    if objective == "masked_lm":
        return load_data(cfg, tc, spec, from_flag, scan_ids, run_dir)
    vocab = getattr(cfg, "vocab", None)
    if tc.data == "synthetic_pairs":
        sources, targets = synthetic_pairs(tc)
    else:
        sources, targets = read_pairs(tc, spec, from_flag, vocab if scan_ids else None)
    packed = "segments" in inputs and "dec_segments" in inputs  # else one example per row
    rows = pack_pairs(sources, targets, tc.seq, packed)
    train, held_out = split_rows(rows)
    if tc.eval_every and not len(held_out["tokens"]):
        sys.exit(
            f"error: {len(rows['tokens'])} rows of pairs leave none for the eval split "
            "(the last 2%): add data or set --eval-every 0"
        )
    return train, held_out


def synthetic_pairs(tc) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A learnable seq2seq set made on the machine: tc.synthetic_count strings of 4 to 24 lowercase
    letters, each target the reversed source; both end with tc.eos."""
    rng = np.random.default_rng(tc.synthetic_seed)
    sources, targets = [], []
    for _ in range(tc.synthetic_count):
        letters = rng.integers(ord("a"), ord("z") + 1, int(rng.integers(4, 25)))
        sources.append(np.append(letters, tc.eos).astype(np.int32))
        targets.append(np.append(letters[::-1], tc.eos).astype(np.int32))
    return sources, targets


def read_pairs(
    tc, spec: str, from_flag: bool, vocab: int | None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """pairs(source, target): two token files whose examples each end with the id tc.eos; the
    i-th source example goes with the i-th target example."""
    found = []
    for name in (tc.data_path, tc.data_target):
        path = data_path(dataclasses.replace(tc, data_path=name), spec, from_flag)
        if not path.is_file():
            sys.exit(f"error: pairs data {path} does not exist or is not a file")
        width = 2 if tc.data_dtype == "u16" else 4
        if path.stat().st_size == 0 or path.stat().st_size % width:
            sys.exit(
                f"error: token file {path} has {path.stat().st_size} bytes, not a whole, non-zero "
                f"number of {tc.data_dtype} ids"
            )
        ids = np.fromfile(path, dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)
        if vocab is not None and (bad := np.count_nonzero(ids >= vocab)):
            sys.exit(
                f"error: {bad} token ids in {path} are >= the model's vocab {vocab} "
                f"(the largest is {ids.max()})"
            )
        ends = np.flatnonzero(ids == tc.eos) + 1
        if not len(ends) or ends[-1] != len(ids):
            sys.exit(
                f"error: {path} does not end with the eos id {tc.eos}: every example ends with it"
            )
        found.append([e.astype(np.int32) for e in np.split(ids, ends[:-1])])
    sources, targets = found
    if len(sources) != len(targets):
        sys.exit(
            f"error: the pairs' files hold {len(sources)} source and {len(targets)} "
            f"target examples (split at eos {tc.eos}): they must pair up one to one"
        )
    return sources, targets


def pack_pairs(sources: list, targets: list, seq: int, packed: bool) -> dict[str, np.ndarray]:
    """Rows of `seq` source and `seq` target positions: tokens, segments (0: padding, k: the k-th
    example of the row), targets and dec_segments (see pack_examples)."""
    cut = sum(len(s) > seq or len(t) > seq for s, t in zip(sources, targets, strict=True))
    if cut and is_lead():
        print(
            f"warning: {cut} of {len(sources)} pairs are longer than seq {seq} and were cut",
            file=sys.stderr,
        )
    sides = [({"tokens": sources}, "segments"), ({"targets": targets}, "dec_segments")]
    return pack_examples(sides, seq, packed)


def pack_examples(sides: list[tuple[dict, str]], seq: int, packed: bool) -> dict[str, np.ndarray]:
    """Examples packed into rows of `seq` positions per side, int32. A side is (its fields, each
    a list of one array per example, all of one example the same length; the name of its segment
    ids: 0 padding, k the row's k-th example). Examples are taken in order, as many to a row as
    fit on every side (one to a row when not `packed`); a longer one is cut to `seq` positions.
    seq2seq packs (source, target) pairs on two sides; chat data a side of tokens and loss mask."""
    count = len(next(iter(sides[0][0].values())))
    sizes = [
        [min(len(next(iter(fields.values()))[i]), seq) for fields, _ in sides] for i in range(count)
    ]
    rows: list[list[int]] = []
    row: list[int] = []
    used = [0] * len(sides)
    for i in range(count):
        if row and (not packed or any(u + n > seq for u, n in zip(used, sizes[i], strict=True))):
            rows.append(row)
            row, used = [], [0] * len(sides)
        row.append(i)
        used = [u + n for u, n in zip(used, sizes[i], strict=True)]
    rows += [row] if row else []
    names = [name for fields, segments in sides for name in (*fields, segments)]
    out = {name: np.zeros((len(rows), seq), np.int32) for name in names}
    for r, row in enumerate(rows):
        for side, (fields, segments) in enumerate(sides):
            at = 0
            for k, i in enumerate(row, start=1):
                n = sizes[i][side]
                for name, arrays in fields.items():
                    out[name][r, at : at + n] = arrays[i][:n]
                out[segments][r, at : at + n] = k
                at += n
    return out


def load_images(tc, spec: str, from_flag: bool, shape: tuple, classes: int) -> tuple[dict, dict]:
    """The train and eval images [N, H, W, C] (float32) and labels [N] of a classify run: made on
    the machine (synthetic_images) or read from arrays(...): a .npz with `images` and `labels`."""
    if tc.data == "synthetic_images":
        rows = synthetic_images(tc, shape, classes)
    else:
        path = data_path(tc, spec, from_flag)
        rows = read_arrays(path, ("images", "labels"))
        if problem := image_problem(rows, shape, classes):
            sys.exit(f"error: arrays data {path}: {problem}")
        rows = {
            "images": rows["images"].astype(np.float32),
            "labels": rows["labels"].astype(np.int32),
        }
    train, held_out = split_rows(rows)
    if not len(train["labels"]) or (tc.eval_every and not len(held_out["labels"])):
        sys.exit(
            f"error: {len(rows['labels'])} images are too few to hold out 2% for evaluation: "
            "add data or set --eval-every 0"
        )
    return train, held_out


def read_arrays(path, names: tuple) -> dict[str, np.ndarray]:
    """The arrays `names` that `path` holds: a .npz (numpy.savez) or a directory of NAME.npy files;
    exits with a message when it is neither, or cannot be read."""
    path = Path(path)
    try:
        if path.is_dir():
            return {k: np.load(path / f"{k}.npy") for k in names if (path / f"{k}.npy").is_file()}
        with open(path, "rb") as f:
            if f.read(6) == b"\x93NUMPY":  # a single .npy array, not a named set
                sys.exit(
                    f"error: arrays data {path} is one .npy array; arrays(...) reads a .npz "
                    f"(numpy.savez(path, {'=..., '.join(names)}=...)) or a directory of "
                    + ", ".join(f"{k}.npy" for k in names)
                )
        with np.load(path) as arrays:
            return {k: np.asarray(arrays[k]) for k in names if k in arrays}
    except (OSError, ValueError, EOFError, TypeError, zipfile.BadZipFile) as exc:
        sys.exit(
            f"error: arrays data {path} is not a readable .npz file or directory of .npy files: "
            f"{str(exc)[:200]}"
        )


def synthetic_images(tc, shape: tuple, classes: int) -> dict[str, np.ndarray]:
    """A learnable image-classification set made on the machine: one random pattern per class,
    each image its class's pattern plus Gaussian noise of std tc.synthetic_noise."""
    rng = np.random.default_rng(tc.synthetic_seed)
    patterns = rng.normal(size=(classes, *shape)).astype(np.float32)
    labels = rng.integers(0, classes, tc.synthetic_count).astype(np.int32)
    noise = rng.normal(size=(tc.synthetic_count, *shape)).astype(np.float32)
    return {"images": patterns[labels] + np.float32(tc.synthetic_noise) * noise, "labels": labels}


def image_problem(rows: dict, shape: tuple, classes: int) -> str | None:
    """What is wrong with arrays read for classify, or None."""
    if set(rows) != {"images", "labels"}:
        dims = ", ".join(map(str, shape))
        return f"it needs arrays `images` [N, {dims}] and `labels` [N]; it has {sorted(rows)}"
    images, labels = rows["images"], rows["labels"]
    if images.shape[1:] != tuple(shape) or labels.shape != images.shape[:1]:
        return (
            f"images are {list(images.shape)} and labels {list(labels.shape)}; the model reads "
            f"images [N, {', '.join(map(str, shape))}] and labels [N]"
        )
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= classes:
        return (
            f"labels must be integers in [0, {classes}), "
            f"got {labels.dtype} from {labels.min()} to {labels.max()}"
        )
    if not np.isfinite(images).all():
        return "images hold non-finite values"
    return None


def split_rows(rows: dict) -> tuple[dict, dict]:
    """The last 2% of the examples (at least one, of two or more) are held out for evaluation."""
    n = len(next(iter(rows.values())))
    cut = min(int(n * 0.98), n - 1) if n > 1 else n
    return {k: v[:cut] for k, v in rows.items()}, {k: v[cut:] for k, v in rows.items()}


def mlm_rows(
    tokens: np.ndarray, tc, step: int, rows: slice, inputs: tuple
) -> dict[str, np.ndarray]:
    """masked_lm rows of `seq` tokens from random starts (a pure function of (seed, step)); token
    types all 0; mask_tokens in model.py masks them. Without a separator (tc.sep -1) a row starts
    anywhere and is one example (segments all 1). With one, a row starts at a document (just after
    a tc.sep) and packs the documents that follow, each ending with tc.sep, as segments 1, 2, ...,
    the last one cut at the row's end: attention stays inside each (segment ids)."""
    rng = np.random.default_rng([tc.seed, step])
    sep = getattr(tc, "sep", -1)
    if sep >= 0:
        pool = document_starts(tokens, sep, tc.seq)
        starts = pool[rng.integers(0, len(pool), size=tc.batch)[rows]]
    else:
        starts = rng.integers(0, len(tokens) - tc.seq, size=tc.batch)[rows]
    batch = {
        "tokens": np.stack([np.asarray(tokens[s : s + tc.seq], dtype=np.int32) for s in starts])
    }
    if "segments" in inputs:
        ends = batch["tokens"] == sep if sep >= 0 else np.zeros_like(batch["tokens"], dtype=bool)
        batch["segments"] = (1 + np.cumsum(ends, axis=1) - ends).astype(
            np.int32
        )  # a sep ends its own
    if "types" in inputs:
        batch["types"] = np.zeros_like(batch["tokens"])
    return batch


_DOCUMENT_STARTS: dict = {}


def document_starts(tokens: np.ndarray, sep: int, seq: int) -> np.ndarray:
    """Where the documents of a token stream start (0 and just after each `sep`) with a whole row
    of `seq` tokens after them; found once per stream. Exits when there is none."""
    key = (id(tokens), len(tokens), sep, seq)
    if key not in _DOCUMENT_STARTS:
        starts = np.concatenate(
            [[0], np.flatnonzero(np.asarray(tokens[: len(tokens) - seq]) == sep) + 1]
        )
        starts = starts[starts <= len(tokens) - seq]
        if not len(starts):
            sys.exit(
                f"error: masked_lm(sep = {sep}): no document of the data starts a whole row of "
                f"{seq} tokens: the data is shorter than a row"
            )
        _DOCUMENT_STARTS[key] = starts
    return _DOCUMENT_STARTS[key]


def get_examples(
    data, tc, inputs: tuple, step: int, sharding: NamedSharding
) -> dict[str, jax.Array]:
    """The global batch for `step`, a dict of arrays [batch, ...]; each process reads its own rows.
    `data` is a token stream (masked_lm) or a dataset of rows (seq2seq, classify)."""
    per = tc.batch // jax.process_count()
    rows = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    if isinstance(data, np.ndarray):
        local = mlm_rows(data, tc, step, rows, inputs)
    else:
        n = len(next(iter(data.values())))
        picks = np.random.default_rng([tc.seed, step]).integers(0, n, size=tc.batch)[rows]
        local = {k: v[picks] for k, v in data.items()}
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (tc.batch, *v.shape[1:]))
        for k, v in local.items()
    }
