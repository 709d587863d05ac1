"""A damaged newest checkpoint is reported, set aside (never deleted) and the run resumes from the
newest good one, ending bitwise identical to an uninterrupted run.

Orbax alone does not notice a flipped byte in a tensor file: the runtime writes a sha256 manifest
for every committed step (axdsl_checksums.json) and verifies it before restoring.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.targets_util import xla_flags

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--batch", "8", "--seq", "64", "--checkpoint-every", "10", "--eval-every", "0", "--no-progress"]
ENV = dict(os.environ, XLA_FLAGS=xla_flags(2), JAX_PLATFORMS="cpu")


def train(run: Path, steps: int, cache: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "generated.tiny_llama.cpu.train", "--steps", str(steps), *ARGS,
           "--out", str(run), "--compile-cache", str(cache)]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def tensor_files(step_dir: Path) -> list[Path]:
    return sorted(p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d")


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    cache = tmp_path_factory.mktemp("cache")
    run = tmp_path_factory.mktemp("reference")
    train(run, 30, cache)
    return run, cache


@pytest.mark.parametrize("damage", [flip_a_byte, truncate], ids=["flipped byte", "truncated tensor file"])
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(
        tmp_path, reference, damage):
    from test_resume import assert_bitwise_equal, checkpoint_arrays

    ref, cache = reference
    run = tmp_path / "run"
    train(run, 20, cache)
    victim = max(tensor_files(run / "checkpoints" / "20"), key=lambda p: p.stat().st_size)
    damage(victim)
    proc = train(run, 30, cache)
    assert "checkpoint 20 is damaged" in proc.stderr and victim.name in proc.stderr
    assert "resumed from step 10" in proc.stderr
    assert (run / "checkpoints" / "20.damaged").is_dir()  # set aside, not deleted
    assert_bitwise_equal(checkpoint_arrays(run, 30), checkpoint_arrays(ref, 30))


def empty_data_metadata(step_dir: Path) -> None:
    (step_dir / "data" / "metadata").write_bytes(b"")


def no_state_metadata(step_dir: Path) -> None:
    (step_dir / "state" / "_METADATA").unlink()


def flipped_tensor(step_dir: Path) -> None:
    flip_a_byte(max(tensor_files(step_dir), key=lambda p: p.stat().st_size))


@pytest.mark.parametrize("damage", [flipped_tensor, empty_data_metadata, no_state_metadata],
                         ids=["flipped byte", "empty data/metadata", "missing _METADATA"])
def test_sample_and_export_hf_skip_a_damaged_newest_checkpoint(tmp_path, reference, damage, capsys):
    """Readers never trust a damaged checkpoint and never move it (a training may be running):
    they say which one is damaged and why, and read the newest good one (step 20 here)."""
    import shutil

    from safetensors.numpy import load_file

    from axdsl import hf, runs, sampling

    ref, _ = reference
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    damage(run / "checkpoints" / "30")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())

    assert sampling.sample(run, "def ", max_tokens=4, temperature=0.0) == 0
    err = capsys.readouterr().err
    assert "checkpoint 30" in err and "is damaged" in err and "Traceback" not in err

    spec = ROOT / "specs" / "tiny_llama.axl"
    assert hf.export_hf(spec, run, tmp_path / "hf", None) == 0
    err = capsys.readouterr().err
    assert "checkpoint 30" in err and "is damaged" in err and "Traceback" not in err
    assert hf.export_hf(spec, run / "checkpoints" / "20", tmp_path / "hf20", None) == 0
    exported, step20 = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "hf20" / "model.safetensors")
    assert exported.keys() == step20.keys() and all((exported[k] == step20[k]).all() for k in exported)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing moved or deleted
