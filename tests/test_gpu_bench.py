"""benchmarks/gpu_bench.py --dry-run on one config: its bf16 and fp8 builds of a tiny cut, prepared
and run on this CPU the way `prepare` and `run` do on the H200 (each build in a process of its own,
tpu_bench's machinery), then the table and the goals, so the script is ready when a GPU is lent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # about 20 s on 2 cores: two builds, each trained 4 steps in its own process
def test_gpu_bench_dry_run_one_config(capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))  # the builds' processes: one cpu, as from a shell
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_bench

    assert gpu_bench.main(["--dry-run", "--only", "llama1b"]) == 0
    out = capsys.readouterr().out
    assert "fp8 matmuls yes" in out and "fp8 matmuls no" in out  # prepare's lines
    assert "| llama1b | bf16 |" in out and "| llama1b | fp8 |" in out and "ERROR" not in out
    assert "loss after 4 steps bf16" in out and "within 2%: met" in out
