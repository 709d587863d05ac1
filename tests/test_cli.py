"""The axdsl command line: exit codes, drift check, atomic writes, and no jax on the build path."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from axdsl.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "axdsl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_build_never_imports_jax(tmp_path):
    code = ("import sys; from axdsl.cli import main; "
            f"rc = main(['build', 'specs/llama3_8b.axl', '--target', 'cpu', '--out', '{tmp_path / 'o'}']); "
            "assert 'jax' not in sys.modules, 'build imported jax'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "model.py").exists()


def test_version_and_help():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("axdsl ")
    r = run_cli("--help")
    assert r.returncode == 0 and "build" in r.stdout and "dump" in r.stdout


def test_build_check_is_clean_on_committed_tree():
    r = run_cli("build", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in sync" in r.stdout


def test_build_check_reports_drift_with_a_unified_diff(tmp_path):
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    shutil.copytree(ROOT / "generated", tmp_path / "generated")
    spec = tmp_path / "specs" / "tiny_llama.axl"
    spec.write_text(spec.read_text().replace("ffn = 128", "ffn = 192"))
    r = run_cli("build", "--check", cwd=tmp_path)
    assert r.returncode == 1
    assert "--- generated/tiny_llama/cpu/model.py (committed)" in r.stdout
    assert "+    ffn: int = 192" in r.stdout
    assert "out of date" in r.stderr


def test_failed_build_leaves_existing_output_untouched(tmp_path, in_root):
    out = tmp_path / "out"
    assert main(["build", "specs/tiny_llama.axl", "--target", "cpu", "--out", str(out)]) == 0
    before = (out / "model.py").read_bytes()
    bad = tmp_path / "bad.axl"
    bad.write_text('import "std/transformer.axl"\nmodel m = DecoderLM { vocab = 256 dim = 64 layers = 2 heads = 3 }\n')
    assert main(["build", str(bad), "--target", "cpu", "--out", str(out)]) == 1
    assert (out / "model.py").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.axl", "out"]  # no temp dirs left


def test_user_errors_exit_1_without_traceback(tmp_path):
    bad = tmp_path / "bad.axl"
    bad.write_text("layer A(d: int) {\n  param w: [d] axes(embed)\n  forward(x: [B, d]) -> [B, d] { return x @@ w }\n}\n")
    r = run_cli("build", str(bad), "--target", "cpu", "--out", str(tmp_path / "o"))
    assert r.returncode == 1
    assert "error: syntax error" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_unknown_target_lists_known_ones():
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpux")
    assert r.returncode == 1
    assert "unknown target `cpux`" in r.stderr and "cpu" in r.stderr and "Traceback" not in r.stderr


def test_missing_spec_is_a_located_error():
    r = run_cli("check", "specs/nope.axl")
    assert r.returncode == 1 and "cannot read spec" in r.stderr and "Traceback" not in r.stderr


def test_check_and_dump():
    r = run_cli("check", "specs/tiny_llama.axl", "specs/gpt2_small.axl")
    assert r.returncode == 0 and "tiny_llama" in r.stdout
    r = run_cli("dump", "specs/tiny_llama.axl", "--after", "resolve")
    assert r.returncode == 0
    assert "# passes: resolve\n" in r.stdout
    assert "dim: int = 64  # inherited from /" in r.stdout
    r = run_cli("dump", "specs/tiny_llama.axl", "--after", "nopass")
    assert r.returncode == 1 and "unknown pass" in r.stderr


def test_python_dash_m_and_console_script_agree():
    exe = shutil.which("axdsl")
    if exe is None:
        pytest.skip("axdsl console script not installed")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.stdout == run_cli("--version").stdout
