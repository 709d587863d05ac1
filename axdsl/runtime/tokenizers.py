"""Text through a tokenizer (a tokenizer.json, or a byte-level BPE trained on the data), with the
token ids cached beside the source so that a rerun does not retokenize.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import hashlib
import io
import os
import sys
import threading
from pathlib import Path

import numpy as np

from axdsl.runtime.files import replace_file
from axdsl.runtime.processes import is_lead

# Text with a tokenizer (tc.tokenizer: a tokenizer.json, or "bpe") becomes token ids once; the ids
# are cached beside the source under a hash of text and tokenizer, so a rerun does not retokenize.
# The run keeps RUN_DIR/tokenizer.json, which `axdsl sample` decodes with.


def load_tokenizer(tc, data: np.ndarray, run_dir: Path | None, vocab: int | None):
    """tc.tokenizer as a `tokenizers.Tokenizer`: the file it names, or a byte-level BPE trained on
    `data` (once: a rerun reads the run's copy). Either way the run keeps RUN_DIR/tokenizer.json."""
    kept = run_dir / "tokenizer.json" if run_dir is not None else None
    if tc.tokenizer == "bpe":
        if kept is not None and kept.exists():
            return read_tokenizer(kept, "this run's tokenizer (move it aside to train a new one)")
        tokenizer = train_bpe(data.tobytes(), tc.bpe_vocab or vocab or 4096)
        content = tokenizer.to_str().encode("utf-8")
    else:
        path = Path(tc.tokenizer)
        if not path.exists():
            sys.exit(f"error: tokenizer {path} does not exist")
        tokenizer, content = read_tokenizer(path, "a tokenizers tokenizer.json"), path.read_bytes()
        if kept is not None and kept.exists() and kept.read_bytes() != content:
            sys.exit(
                f"error: {run_dir} was trained with another tokenizer ({kept}); give a new --out"
            )
    if kept is not None and is_lead() and not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        replace_file(kept, content)  # the file as given (or as trained), byte for byte
    return tokenizer


def read_tokenizer(path: Path, what: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exceptions for files it cannot parse
        sys.exit(f"error: {path} is not {what}: {str(exc)[:200]}")


def train_bpe(text: bytes, vocab: int):
    """A byte-level BPE (GPT-2's scheme: any text round-trips) of `vocab` tokens trained on `text`.
    The tokenizers library trains deterministically: the same text gives the same merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    if is_lead():
        print(
            f"training a byte-level BPE of {vocab:,} tokens on {len(text) / 2**20:.1f} MiB of "
            "text (once: the run keeps it)...",
            file=sys.stderr,
            flush=True,
        )
    lines = text.decode("utf-8", errors="replace").splitlines(keepends=True)
    # in a thread, so that the main thread waits in Python and a Ctrl-C is answered at once
    work = threading.Thread(
        target=tokenizer.train_from_iterator, args=(lines, trainer), daemon=True
    )
    work.start()
    while work.is_alive():
        work.join(0.2)
    return tokenizer


def tokenize(tokenizer, text: bytes, source: Path | None, run_dir: Path | None) -> np.ndarray:
    """`text` as token ids, from a cache when one holds them: SOURCE.<hash>.tokens.npy beside the
    source (the run directory when that is not writable, or for the default data). A cache whose
    checksum does not match is set aside as .damaged and the text is tokenized again."""
    key = hashlib.sha256(
        hashlib.sha256(text).digest() + tokenizer.to_str().encode("utf-8")
    ).hexdigest()[:16]
    places = [source.parent / f"{source.name}.{key}.tokens.npy"] if source is not None else []
    places += [run_dir / "data_cache" / f"{key}.tokens.npy"] if run_dir is not None else []
    for cache in places:
        if cache.exists() and (ids := read_cached(cache)) is not None:
            return ids
    lines = text.decode("utf-8", errors="replace").splitlines(keepends=True)
    flat = [i for e in tokenizer.encode_batch(lines, add_special_tokens=False) for i in e.ids]
    ids = np.asarray(flat, dtype=np.uint16 if tokenizer.get_vocab_size() <= 1 << 16 else np.uint32)
    for cache in places:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            replace_file(
                cache.with_name(cache.name + ".sha256"),
                hashlib.sha256(ids.tobytes()).hexdigest().encode(),
            )
            buffer = io.BytesIO()
            np.save(buffer, ids)
            replace_file(cache, buffer.getvalue())
            break
        except OSError:
            continue  # a read-only data directory: try the run directory
    return ids


def read_cached(cache: Path) -> np.ndarray | None:
    """The ids in a tokenization cache, or None (and the cache set aside) if it is damaged."""
    digest = cache.with_name(cache.name + ".sha256")
    try:
        ids = np.load(cache, mmap_mode="r")
        if (
            digest.read_text().strip()
            == hashlib.sha256(np.ascontiguousarray(ids).tobytes()).hexdigest()
        ):
            return ids
    except (OSError, ValueError):
        pass
    print(
        f"warning: tokenization cache {cache} is damaged; set aside as .damaged, tokenizing again",
        file=sys.stderr,
    )
    for path in (cache, digest):
        if path.exists():
            os.replace(path, path.with_name(path.name + ".damaged"))
    return None
