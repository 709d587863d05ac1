"""How `axdsl sample` turns a prompt into token ids and generated ids back into text.

A run trained on bytes (the default data, or text without a tokenizer) reads and writes UTF-8
bytes; a run trained through a tokenizer (`text(..., tokenizer = ...)`) kept it as
RUN_DIR/tokenizer.json, and sampling encodes and decodes with that same file; a run on token
files takes and prints token ids. Decoding is incremental, so text streams as it is generated
without splitting a multi-byte character or a multi-token word piece.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CodecError(Exception):
    """A prompt or a run's tokenizer that sampling cannot use (shown as `axdsl: error: ...`)."""


@dataclass
class TextCodec:
    """Encode a prompt, then `feed` generated ids one at a time to get the text they add."""

    kind: str  # "bytes", "tokenizer" or "ids"
    tokenizer: Any = None  # a tokenizers.Tokenizer for kind "tokenizer"
    ids: list[int] = field(default_factory=list)
    shown: int = 0  # characters of decode(ids) already returned by feed
    _utf8: Any = None

    @classmethod
    def for_run(cls, run_dir: Path, data: str, tokenizer: str) -> TextCodec:
        """The codec of a run whose TrainConfig has `data` and (maybe empty) `tokenizer`."""
        if data in ("tokens", "pairs"):  # token files: the prompt and output are ids
            return cls("ids")
        if not tokenizer:
            return cls("bytes", _utf8=codecs.getincrementaldecoder("utf-8")(errors="replace"))
        kept = run_dir / "tokenizer.json"
        if not kept.exists():
            raise CodecError(
                f"{kept} not found: the run trained through a tokenizer, and sampling "
                f"decodes with the copy the run keeps"
            )
        from tokenizers import Tokenizer

        try:
            return cls("tokenizer", Tokenizer.from_file(str(kept)))
        except Exception as exc:  # tokenizers raises plain Exceptions for files it cannot parse
            raise CodecError(f"{kept} is not a tokenizer.json: {str(exc)[:200]}") from None

    @property
    def limit(self) -> int | None:
        """Ids above this are never generated (bytes: 256, the rest of a larger vocab is unused)."""
        if self.kind == "bytes":
            return 256
        return self.tokenizer.get_vocab_size() if self.kind == "tokenizer" else None

    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids; for a run on token files, the prompt is space-separated ids."""
        if self.kind == "bytes":
            return list(prompt.encode("utf-8"))
        if self.kind == "tokenizer":
            return list(self.tokenizer.encode(prompt, add_special_tokens=False).ids)
        try:
            return [int(t) for t in prompt.split()]
        except ValueError:
            raise CodecError(
                'this run trained on a token file: give the prompt as token ids ("1 2 3")'
            ) from None

    def prompt_text(self, prompt: str, ids: list[int]) -> str:
        """What is printed for the prompt before generation starts."""
        if self.kind == "tokenizer":
            self.ids = list(ids)
            self.shown = len(self.tokenizer.decode(self.ids))
        return " ".join(map(str, ids)) if self.kind == "ids" else prompt

    def feed(self, token: int) -> str:
        """The text that generated id `token` adds (possibly "" until a character is complete)."""
        if self.kind == "bytes":
            return self._utf8.decode(bytes([token]))
        if self.kind == "ids":
            return f" {token}"
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a character split over tokens: wait for the rest
            return ""
        new, self.shown = text[self.shown :], len(text)
        return new

    def finish(self) -> str:
        """Whatever is still held back at the end."""
        if self.kind == "bytes":
            return self._utf8.decode(b"", final=True)
        if self.kind == "tokenizer":
            text = self.tokenizer.decode(self.ids)
            return text[self.shown :]
        return ""
