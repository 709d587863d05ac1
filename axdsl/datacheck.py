"""`axdsl check`'s look at the training data a spec names, where the data already exists.

The trainer checks its data before the first step (train.py via runtime.load_data). A split too
short for `seq` is a mistake in the spec, though, and waiting for `axdsl train` to find it costs
the user a build and a JAX start. This module sizes the data from the file system alone (no read
of the tokens, no jax) and reports, located at the `data = ...` line, what would stop training:
an empty source, a token file of a partial id, a binary file in a text source (a NUL byte near its
start), a train or eval split shorter than one sequence.

The split rule is runtime.py's: the last 2% of the tokens are held out; a batch row reads
seq + 1 tokens from a random start, so a split needs seq + 2.
"""

from __future__ import annotations

from pathlib import Path

from axdsl.errors import Diagnostic, Span
from axdsl.ir import nodes as ir

KEPT = 0.98  # runtime.split: the first 98% of the tokens train, the last 2% are the eval split
ID_BYTES = {"u16": 2, "u32": 4}
BINARY_PROBE = 8192  # runtime.BINARY_PROBE: a text file with a NUL byte this near its start is binary


def data_problems(module: ir.Module, spec: Path) -> list[Diagnostic]:
    """Located errors for data that exists and cannot train the spec's `seq` (none otherwise)."""
    settings = module.train_settings
    if settings is None:
        return []
    choice = settings.choice("data")
    source = choice.value
    if source.kind not in (ir.DataKind.TOKENS, ir.DataKind.TEXT) or choice.span is None:
        return []  # the standard library's sources: tens of MiB
    path = Path(source.path)
    if not path.is_absolute():
        path = spec.parent / path  # as the trainer resolves it
    count = _token_count(source, path)
    if isinstance(count, str):
        return [Diagnostic(choice.span, count)]
    if count is None:
        return []  # not there yet: train.py says so if it still is not
    if source.kind == ir.DataKind.TEXT and (binary := _first_binary(path)) is not None:
        which = f"{path}" if binary == path else f"{path}: {binary}"
        return [Diagnostic(choice.span, f"text data {which} is binary (a NUL byte in its first "
                                        f"{BINARY_PROBE // 1024} KiB)",
                           "text() trains on text files: use tokens(...) for token ids")]
    return [Diagnostic(choice.span, m, h) for m, h in _split_problems(count, settings)]


def _first_binary(path: Path) -> Path | None:
    """The first file of a text source with a NUL byte near its start (runtime.binary_files' rule)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        try:
            with file.open("rb") as f:
                if b"\0" in f.read(BINARY_PROBE):
                    return file
        except OSError:
            continue  # unreadable: the trainer names it
    return None


def _token_count(source: ir.DataSource, path: Path) -> int | str | None:
    """How many tokens the source holds (a text byte is a token), a problem, or None if absent."""
    try:
        if not path.exists():
            return None
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            if not files:
                return f"data directory {path} holds no files"
            return sum(p.stat().st_size for p in files) + len(files) - 1  # joined by newlines
        size = path.stat().st_size
    except OSError as exc:
        return f"data {path} cannot be read: {exc.strerror or exc}"
    if size == 0:
        return f"data file {path} is empty"
    if source.kind == ir.DataKind.TOKENS:
        width = ID_BYTES[source.dtype or "u16"]
        if size % width:
            return (f"token file {path} has {size} bytes, not a whole number of {source.dtype} ids: "
                    f"is its dtype right?")
        return size // width
    return size


def _split_problems(count: int, settings: ir.TrainSettings) -> list[tuple[str, str]]:
    """What the trainer would refuse: a split of `count` tokens too short for one sequence."""
    seq, eval_every = settings.get("seq"), settings.get("eval_every")
    cut = int(count * KEPT)  # exactly runtime.split's cut
    train, held_out, need = cut, count - cut, seq + 2
    if train < need:
        return [(f"the data holds {count} tokens: its training split has {train}, one sequence needs "
                 f"{need} (seq {seq})", "add data or lower seq")]
    if eval_every and held_out < need:
        return [(f"the eval split (the last 2% of the data's {count} tokens) has {held_out}, one "
                 f"sequence needs {need} (seq {seq})", "add data, lower seq or set eval_every = 0")]
    return []
