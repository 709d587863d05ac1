"""The build cache of black and libcst results (axdsl/codegen/cache.py): a hit gives the same bytes
without running the tools, a corrupt entry is ignored and rewritten, and the cache can be off."""

from __future__ import annotations

from pathlib import Path

import pytest

from axdsl.build import build_files
from axdsl.codegen import cache, format as fmt

SPEC = Path(__file__).resolve().parent.parent / "specs" / "tiny_llama.axl"


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def no_tools(monkeypatch) -> None:
    """Make black and the libcst check fail if they run at all."""
    def fail(*_args):
        raise AssertionError("the build ran a tool although its result was cached")

    monkeypatch.setattr(fmt, "format_code", fail)
    monkeypatch.setattr(fmt, "check_generated", fail)


def test_hit_is_byte_identical_and_runs_no_tool(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    first = build_files(SPEC, "cpu")
    assert entries(tmp_path / "cache/format") and entries(tmp_path / "cache/check")
    no_tools(monkeypatch)
    assert build_files(SPEC, "cpu") == first


def test_corrupt_entries_are_ignored_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    first = build_files(SPEC, "cpu")
    damaged = entries(tmp_path / "cache")
    for i, path in enumerate(damaged):  # truncated, flipped, not UTF-8, empty
        data = path.read_bytes()
        path.write_bytes([data[: len(data) // 2], data[:-1] + bytes([data[-1] ^ 1]), b"\xff\xfe", b""][i % 4])
    assert build_files(SPEC, "cpu") == first
    no_tools(monkeypatch)  # the rebuild rewrote every entry whole
    assert build_files(SPEC, "cpu") == first


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cache_dir() is None
    files = build_files(SPEC, "cpu")
    assert "def main(" in files["train.py"] and not list(tmp_path.rglob("*"))


def test_failed_check_is_never_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    for _ in range(2):
        with pytest.raises(fmt.GeneratedCodeError, match="unused import `os`"):
            fmt.checked("import os\n", "model.py")


def test_default_location_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "axdsl"
