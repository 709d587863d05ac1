"""Token data for next-token training: the default dataset (the standard library's source),
token files, text as bytes or through a tokenizer, the checks run on it, and each step's batch as
a pure function of (seed, step).

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import dataclasses
import os
import sys
import sysconfig
from pathlib import Path
from typing import NoReturn

import jax
import numpy as np
from jax.sharding import NamedSharding

from axdsl.runtime.tokenizers import load_tokenizer, tokenize


def stdlib_bytes(limit: int = 32 << 20) -> np.ndarray:
    """The default dataset: this Python's standard-library .py files as bytes (no download needed).

    Every .py file under the stdlib directory except the `test` packages and site-packages, in
    path order, joined by newlines (about 13 MB on CPython 3.11), at most `limit` bytes.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in ("site-packages", "dist-packages", "test")]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    chunks, size = [], 0
    for path in sorted(files):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    return np.frombuffer(b"\n".join(chunks)[:limit], dtype=np.uint8)


def load_tokens(tc, run_dir: Path | None = None, vocab: int | None = None) -> np.ndarray:
    """All tokens of the data source as one array: token files, bytes of text (vocab 256), or
    text through tc.tokenizer (see tokenize)."""
    if tc.data == "tokens":  # flat uint16/uint32 token ids, as nanoGPT's prepare.py writes them
        return np.memmap(
            Path(tc.data_path), dtype=np.uint16 if tc.data_dtype == "u16" else np.uint32, mode="r"
        )
    if tc.data == "default":
        data = stdlib_bytes()
    else:
        path = Path(tc.data_path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        try:
            data = np.frombuffer(b"\n".join(p.read_bytes() for p in files), dtype=np.uint8)
        except OSError as exc:
            unreadable(exc)
    if not getattr(tc, "tokenizer", ""):
        return data
    source = None if tc.data == "default" else Path(tc.data_path)
    tokenizer = load_tokenizer(tc, data, run_dir, vocab)
    if vocab is not None and tokenizer.get_vocab_size() > vocab:
        sys.exit(
            f"error: the tokenizer has {tokenizer.get_vocab_size()} tokens, "
            f"more than the model's vocab {vocab}"
        )
    return tokenize(tokenizer, data.tobytes(), source, run_dir)


def data_path(tc, spec: str, from_flag: bool) -> Path:
    """Where the data is: a path written in the spec is relative to the spec's directory; one
    given with --data is relative to the working directory, as command-line paths are."""
    path = Path(tc.data_path)
    if from_flag or path.is_absolute():
        return path
    return Path(spec).parent / path


def load_data(
    cfg, tc, spec: str, from_flag: bool, scan_ids: bool = True, run_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The train and eval tokens, checked before the first step: the file exists and is not
    empty, every id is below the model's vocab (unless `scan_ids` is False: --no-data-check), and
    both splits hold at least one sequence. Text with a tokenizer is tokenized (or read from its
    cache) here; RUN_DIR keeps the tokenizer."""
    if getattr(tc, "tokenizer", "") not in ("", "bpe"):  # a tokenizer.json: relative to the spec
        tc = dataclasses.replace(
            tc,
            tokenizer=str(
                Path(tc.tokenizer)
                if Path(tc.tokenizer).is_absolute()
                else Path(spec).parent / tc.tokenizer
            ),
        )
    if getattr(tc, "tokenizer", "") and tc.data == "tokens":
        sys.exit("error: a tokenizer applies to text data; token files are already token ids")
    if tc.data != "default":
        path = data_path(tc, spec, from_flag)
        where = (
            f"{tc.data_path!r} from --data"
            if from_flag
            else f"{tc.data_path!r} in {spec}, relative to its directory"
        )
        if not path.exists():
            sys.exit(f"error: data {path} does not exist ({where})")
        if not (path.is_file() or path.is_dir()):  # a FIFO blocked the run, deaf to signals
            sys.exit(f"error: data {path} is not a regular file or a directory ({where})")
        tc = dataclasses.replace(tc, data_path=str(path))
        if path.is_file() and path.stat().st_size == 0:
            sys.exit(f"error: data file {path} is empty")
        if tc.data == "text" and (binary := binary_files(path)):
            more = f" (and {len(binary) - 1} more)" if len(binary) > 1 else ""
            which = f"{path}" if binary[0] == path else f"{path}: {binary[0]}{more}"
            sys.exit(
                f"error: text data {which} is binary (a NUL byte in its first "
                f"{BINARY_PROBE // 1024} KiB); text() trains on text files: "
                "use tokens(...) for token ids"
            )
        if tc.data == "tokens" and path.stat().st_size % (2 if tc.data_dtype == "u16" else 4):
            sys.exit(
                f"error: token file {path} has {path.stat().st_size} bytes, not a whole number of "
                f"{tc.data_dtype} ids: is data_dtype right?"
            )
    tokens = load_tokens(tc, run_dir, getattr(cfg, "vocab", None))
    problems = [] if scan_ids is False else token_problems(tokens, getattr(cfg, "vocab", None))
    train, held_out = split(tokens)
    need = tc.seq + 2  # a batch row reads seq + 1 tokens from a random start
    if len(train) < need:
        problems.append(
            f"{len(tokens)} tokens are too few: the training split has {len(train)}, one "
            f"sequence needs {need} (seq {tc.seq}); add data or lower --seq"
        )
    elif tc.eval_every and len(held_out) < need:
        problems.append(
            f"the eval split (the last 2% of the data) has {len(held_out)} tokens, one sequence "
            f"needs {need} (seq {tc.seq}); add data, lower --seq or set --eval-every 0"
        )
    if problems:
        sys.exit("error: " + "; ".join(problems))
    return train, held_out


BINARY_PROBE = 8192  # bytes read from the start of each text file to tell a binary one, as git does


def binary_files(path: Path) -> list[Path]:
    """The files of a text source (a file, or a directory's files) with a NUL byte near their
    start: an image, an archive or a token file, which no text holds."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    found = []
    for file in files:
        try:
            with file.open("rb") as f:
                if b"\0" in f.read(BINARY_PROBE):
                    found.append(file)
        except OSError as exc:
            unreadable(exc)
    return found


def unreadable(exc: OSError) -> NoReturn:
    """Exit with one line naming a data file that cannot be read (an I/O error, no permission),
    not a traceback before the first step."""
    sys.exit(
        f"error: cannot read data {exc.filename or ''}: {exc.strerror or exc}; "
        "fix or remove that file, or give another --data"
    )


def token_problems(tokens: np.ndarray, vocab: int | None, chunk: int = 1 << 26) -> list[str]:
    """Ids the model cannot embed: how many, the largest, and the vocab (read in chunks)."""
    if vocab is None or len(tokens) == 0:
        return [] if len(tokens) else ["the data holds no tokens"]
    bad, top = 0, 0
    for start in range(0, len(tokens), chunk):
        part = np.asarray(tokens[start : start + chunk])
        bad += int(np.count_nonzero(part >= vocab))
        top = max(top, int(part.max()))
    if not bad:
        return []
    return [
        f"{bad} of {len(tokens)} token ids are >= the model's vocab {vocab} "
        f"(the largest is {top}): the data was tokenized for another vocabulary"
    ]


def split(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last 2% of the tokens are held out for evaluation."""
    cut = int(len(tokens) * 0.98)
    return tokens[:cut], tokens[cut:]


def batch_rows(tokens: np.ndarray, tc, step: int, rows: slice) -> np.ndarray:
    """Rows `rows` of the global batch for `step`: a pure function of (seed, step), so resumable."""
    rng = np.random.default_rng([tc.seed, step])
    starts = rng.integers(0, len(tokens) - tc.seq - 1, size=tc.batch)[rows]
    return np.stack([np.asarray(tokens[s : s + tc.seq + 1], dtype=np.int32) for s in starts])


def get_batch(tokens: np.ndarray, tc, step: int, sharding: NamedSharding) -> jax.Array:
    """The global batch [batch, seq + 1] for `step`; each process reads only its own rows."""
    per = tc.batch // jax.process_count()
    rows = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
    local = batch_rows(tokens, tc, step, rows)
    return jax.make_array_from_process_local_data(sharding, local, (tc.batch, tc.seq + 1))
