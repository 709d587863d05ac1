"""Reading Hugging Face safetensors: the files transformers would load, and a lazy tensor reader.

Needs the `safetensors` package (numpy only; torch is not needed).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from axdsl.hf.errors import HFError


def weight_files(hf_dir: Path) -> list[Path]:
    """The files transformers would load: the index's shards, model.safetensors, else every one.

    (Some hub repos also hold a differently named copy, e.g. Mistral's consolidated.safetensors.)
    """
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise HFError(f"cannot read {index}: {exc}") from None
        missing = [s for s in shards if not (hf_dir / s).exists()]
        if missing:
            raise HFError(f"{index} names shards that are not there", missing)
        return [hf_dir / s for s in shards]
    if (hf_dir / "model.safetensors").exists():
        return [hf_dir / "model.safetensors"]
    return sorted(hf_dir.glob("*.safetensors"))


class Reader:
    """Every tensor of the *.safetensors files in a directory, read lazily; records what was
    used."""

    def __init__(self, hf_dir: Path, stack: ExitStack):
        from safetensors import safe_open

        files = weight_files(hf_dir)
        if not files:
            raise HFError(
                f"no *.safetensors file in {hf_dir}",
                ["save the model with save_pretrained(..., safe_serialization=True)"],
            )
        self.where: dict[str, Any] = {}
        dupes = []
        for f in files:
            check_file(f)
            try:
                handle = stack.enter_context(safe_open(str(f), framework="numpy"))
            except Exception as exc:  # safetensors raises its own SafetensorError (and OSError)
                raise HFError(f"cannot read {f}: {exc}", ["is the download complete?"]) from None
            for k in handle.keys():
                if k in self.where:
                    dupes.append(f"{k} is in two files")
                self.where[k] = handle
        if dupes:
            raise HFError(f"duplicate tensors in {hf_dir}", dupes)
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.cache: dict[str, np.ndarray] = {}

    def get(self, key: str) -> np.ndarray:
        if key not in self.where:
            self.missing.append(key)
            raise KeyError(key)
        self.used.add(key)
        if key not in self.cache:
            try:
                self.cache[key] = self.where[key].get_tensor(key)
            except Exception as exc:
                raise HFError(f"cannot read tensor {key}: {exc}") from None
        return self.cache[key]


def check_file(path: Path) -> None:
    """A truncated or damaged safetensors file is an error naming it, before any tensor is read:
    the 8-byte header length, the JSON header, and every tensor's bytes inside the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = f.read(n) if 0 <= n <= size - 8 else b""
    except OSError as exc:
        raise HFError(f"cannot read {path}: {exc.strerror or exc}") from None
    if n < 0 or n > size - 8:
        raise HFError(
            f"{path} is not a safetensors file ({size} bytes, a header of " f"{max(n, 0)} bytes)",
            ["the file is empty or truncated: download it again"],
        )
    try:
        entries = json.loads(header)
        ends = [int(v["data_offsets"][1]) for k, v in entries.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise HFError(f"{path} has a damaged header", ["download it again"]) from None
    if ends and max(ends) > size - 8 - n:
        raise HFError(
            f"{path} is truncated: its tensors need {8 + n + max(ends)} bytes, the file has {size}",
            ["download it again"],
        )


def need_safetensors() -> None:
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise HFError(
            "Hugging Face interop needs the safetensors package", ["pip install safetensors"]
        ) from None
