"""benchmarks/gpu_check.py --dry-run: the GPU check builds its gpu-h200-1 code, runs `axdsl aot` on
it and runs its whole harness on this CPU (attention against a reference, bf16 against fp8 loss
curves, tokens/s and MFU), so the script is ready when a device is lent."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run_passes(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "built gpu-h200-1 code" in out and "GiB per chip" in out
    assert "| bf16 |" in out and "| fp8 |" in out and "dry run passed" in out
