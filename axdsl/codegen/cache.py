"""A content-addressed cache of build work that depends only on its input text (black, libcst).

Formatting a large generated file with black and checking it with libcst takes about a second;
the same text always gives the same result, so a rebuild of an unchanged spec finds both here.

Where: $AXDSL_CACHE_DIR, else $XDG_CACHE_HOME/axdsl, else ~/.cache/axdsl; AXDSL_CACHE_DIR set to
"" or "off" turns the cache off. An entry is <dir>/<kind>/<key[:2]>/<key>, key = sha256 of the
input and of everything the result depends on (tool versions, Python version, axdsl's own
checker source). Its first line is the sha256 of the rest, so a truncated or corrupt entry is
ignored (and rewritten). Writes go to a temporary file renamed into place, so concurrent builds
never read a partial entry. An unwritable cache directory only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from axdsl.runtime.files import replace_file

CACHE_ENV = "AXDSL_CACHE_DIR"
DISABLED = ("", "off")


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is turned off."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in DISABLED else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "axdsl"


def key(*parts: str) -> str:
    """The sha256 of `parts`, each length-prefixed so that no two lists of parts collide."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()


def _entry(kind: str, name: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / kind / name[:2] / name


def get(kind: str, name: str) -> str | None:
    """The text stored under `kind`/`name`, or None: missing, unreadable, corrupt, or cache off."""
    path = _entry(kind, name)
    if path is None:
        return None
    try:
        checksum, _, text = path.read_bytes().decode("utf-8").partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return text if checksum == hashlib.sha256(text.encode("utf-8")).hexdigest() else None


def put(kind: str, name: str, text: str) -> None:
    """Store `text` under `kind`/`name` atomically; failures (read-only home, full disk) are
    ignored."""
    path = _entry(kind, name)
    if path is None:
        return
    data = f"{hashlib.sha256(text.encode('utf-8')).hexdigest()}\n{text}".encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, data)
    except OSError:
        pass
