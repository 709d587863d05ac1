"""A wheel built from the repo and installed outside it finds its grammar, templates and std library."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_installed_wheel_builds_a_spec_outside_the_repo(tmp_path):
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-w", str(dist), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next(dist.glob("axdsl-*.whl"))
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    work = tmp_path / "work"
    (work / "specs").mkdir(parents=True)
    (work / "specs" / "small.axl").write_text(
        'import "std/transformer.axl"\n'
        "model small = DecoderLM { vocab = 64 dim = 32 layers = 1 heads = 2 ffn = 64 dtype = f32 }\n"
    )
    code = (
        "import axdsl.resources as r, sys; from axdsl.cli import main; "
        "assert '_data' in str(r.grammar_path()) and '_data' in str(r.templates_dir()), r.grammar_path(); "
        f"assert str(r.std_dir()).startswith({str(site)!r}); "
        "sys.exit(main(['build', 'specs/small.axl', '--target', 'cpu']))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    model = (work / "generated" / "small" / "cpu" / "model.py").read_text()
    assert "from specs/small.axl for target cpu" in model and "def decoder_lm(" in model
