"""Shared test setup. Eight fake CPU devices must be requested before jax is imported."""

import os

from tests.targets_util import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_root(monkeypatch):
    """Run with the repository root as the working directory (paths in messages are relative)."""
    monkeypatch.chdir(ROOT)
    return ROOT
