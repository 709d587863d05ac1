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
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
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
    """Every tensor of the *.safetensors files in a directory, read lazily; records what was used."""

    def __init__(self, hf_dir: Path, stack: ExitStack):
        from safetensors import safe_open

        files = weight_files(hf_dir)
        if not files:
            raise HFError(f"no *.safetensors file in {hf_dir}",
                          ["save the model with save_pretrained(..., safe_serialization=True)"])
        self.where: dict[str, Any] = {}
        dupes = []
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="numpy"))
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
            self.cache[key] = self.where[key].get_tensor(key)
        return self.cache[key]


def need_safetensors() -> None:
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise HFError("Hugging Face interop needs the safetensors package",
                      ["pip install safetensors"]) from None

