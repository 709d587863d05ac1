"""The axdsl command line: exit codes, drift check, atomic writes, and no jax on the build path."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from axdsl import build
from axdsl.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=ROOT, env_drop=()):
    env = {k: v for k, v in dict(os.environ, PYTHONPATH=str(ROOT)).items() if k not in env_drop}
    return subprocess.run([sys.executable, "-m", "axdsl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_build_never_imports_jax(tmp_path):
    code = ("import sys; from axdsl.cli import main; "
            f"rc = main(['build', 'specs/llama3_8b.axl', '--target', 'cpu', '--out', '{tmp_path / 'g'}']); "
            "assert 'jax' not in sys.modules, 'build imported jax'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "g" / "llama3_8b" / "cpu" / "model.py").exists()
    assert (tmp_path / "g" / "runtime.py").exists()  # --out ROOT: the runtime goes to ROOT/


def test_version_and_help():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("axdsl ")
    r = run_cli("--help")
    assert r.returncode == 0 and "build" in r.stdout and "dump" in r.stdout


def test_build_check_is_clean_on_committed_tree():
    r = run_cli("build", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in sync" in r.stdout


def test_build_check_reports_spec_and_runtime_drift_with_a_unified_diff(tmp_path):
    """A spec changed since its output was built, and an edited generated/runtime.py: one
    `build --check` reports both, runtime.py once (not once per output)."""
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    shutil.copytree(ROOT / "generated", tmp_path / "generated")
    spec = tmp_path / "specs" / "tiny_llama.axl"
    spec.write_text(spec.read_text().replace("ffn = 128", "ffn = 192"))
    runtime = tmp_path / "generated" / "runtime.py"
    runtime.write_text(runtime.read_text().replace("def split(", "def split_tokens("))
    r = run_cli("build", "--check", cwd=tmp_path)
    assert r.returncode == 1
    assert "--- generated/tiny_llama/cpu/model.py (committed)" in r.stdout
    assert "+    ffn: int = 192" in r.stdout
    assert "generated/tiny_llama/cpu: out of date" in r.stderr
    assert "--- generated/runtime.py (committed)" in r.stdout and "+def split(" in r.stdout
    assert r.stdout.count("generated/runtime.py (committed)") == 1
    assert "generated/runtime.py: out of date" in r.stderr


def test_failed_build_leaves_existing_output_untouched(tmp_path, in_root):
    root = tmp_path / "gen"  # --out names the root: gen/<spec>/<target>/ and gen/runtime.py
    assert main(["build", "specs/tiny_llama.axl", "--target", "cpu", "--out", str(root)]) == 0
    out = root / "tiny_llama" / "cpu"
    before = (out / "model.py").read_bytes()
    bad = tmp_path / "bad" / "tiny_llama.axl"  # the same stem, so the same output directory
    bad.parent.mkdir()
    bad.write_text('import "std/transformer.axl"\nmodel m = DecoderLM { vocab = 256 dim = 64 layers = 2 heads = 3 }\n')
    assert main(["build", str(bad), "--target", "cpu", "--out", str(root)]) == 1
    assert (out / "model.py").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "gen"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["__init__.py", "cpu"]  # no temp dirs left
    assert sorted(p.name for p in root.iterdir()) == ["__init__.py", "runtime.py", "tiny_llama"]


def test_out_names_the_root_and_the_package(tmp_path, in_root):
    root = tmp_path / "mine"
    assert main(["build", "specs/tiny_llama.axl", "--target", "cpu", "--out", str(root)]) == 0
    train = (root / "tiny_llama" / "cpu" / "train.py").read_text()
    assert "python -m mine.tiny_llama.cpu.train" in train
    assert "-m mine.tiny_llama.cpu.train" in (root / "tiny_llama" / "cpu" / "slurm.sh").read_text()
    assert main(["build", "--check", "specs/tiny_llama.axl", "--target", "cpu", "--out", str(root)]) == 0
    assert main(["build", "specs/tiny_llama.axl", "--target", "cpu", "--out", str(tmp_path / "my-out")]) == 1


def _edit(path: Path) -> str:
    text = path.read_text().replace("def main(argv=None) -> None:\n", "def main(argv=None) -> None:\n    # mine\n")
    assert "# mine" in text
    path.write_text(text)
    return text


def _project(tmp_path: Path) -> Path:
    """A copy of specs/ in tmp_path, with tiny_llama built into tmp_path/generated/."""
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpu", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "generated" / "tiny_llama" / "cpu"


def test_build_keeps_an_edited_train_py_unless_forced(tmp_path):
    out = _project(tmp_path)
    assert build.edited_files(out) == []
    assert "DO NOT EDIT" not in (out / "train.py").read_text() and "DO NOT EDIT" in (out / "model.py").read_text()
    mine = _edit(out / "train.py")
    spec = tmp_path / "specs" / "tiny_llama.axl"
    spec.write_text(spec.read_text().replace("ffn = 128", "ffn = 192"))
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpu", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "train.py").read_text() == mine  # kept
    assert "ffn: int = 192" in (out / "model.py").read_text()  # the rest was rebuilt
    assert "train.py (yours, kept)" in r.stdout and "-    # mine" in r.stdout  # the diff to a fresh one
    assert "kept your edited" in r.stderr and "--force" in r.stderr
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpu", cwd=tmp_path)  # still recognised
    assert r.returncode == 0 and (out / "train.py").read_text() == mine and "kept your edited" in r.stderr
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpu", "--force", cwd=tmp_path)
    assert r.returncode == 0 and "# mine" not in (out / "train.py").read_text()
    assert build.edited_files(out) == []  # replaced by the fresh build, recorded in manifest.json
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpu", cwd=tmp_path)
    assert "kept" not in r.stderr and r.stdout.startswith("built ")


def test_a_damaged_manifest_is_read_as_none(tmp_path):
    """A merge conflict in a committed manifest.json (or any damage) made every build of that
    output an internal error; it now counts as no manifest: files are told apart by their
    header (model.py is axdsl's, train.py has none and is kept as an edit until --force)."""
    out = tmp_path / "cpu"
    shutil.copytree(ROOT / "generated" / "tiny_llama" / "cpu", out)
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text.replace('  "sha256"', '<<<<<<< HEAD\n  "sha256"', 1))
    assert build.recorded_hashes(out) == {}
    assert build.edited_files(out) == ["train.py"]
    (out / "manifest.json").write_text('["not", "a", "manifest"]')
    assert build.recorded_hashes(out) == {} and build.edited_files(out) == ["train.py"]


def test_axdsl_train_never_rebuilds_over_an_edited_train_py(tmp_path):
    out = _project(tmp_path)
    mine = _edit(out / "train.py")
    model = (out / "model.py").read_text()
    spec = tmp_path / "specs" / "tiny_llama.axl"
    spec.write_text(spec.read_text().replace("ffn = 128", "ffn = 192"))
    r = run_cli("train", "specs/tiny_llama.axl", "--target", "cpu", "--steps", "1", cwd=tmp_path)
    assert r.returncode == 1
    assert "train.py has your edits" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert (out / "train.py").read_text() == mine and (out / "model.py").read_text() == model
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_axdsl_train_runs_an_edited_train_py_as_it_is(tmp_path, monkeypatch, capfd):
    from axdsl import runs

    out = _project(tmp_path)
    mine = _edit(out / "train.py")
    monkeypatch.chdir(tmp_path)
    ran = []

    class Proc:
        def __init__(self, cmd, **kwargs):
            ran.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(runs.subprocess, "Popen", Proc)
    assert runs.train(Path("specs/tiny_llama.axl"), "cpu", None, 1) == 0
    assert ran and ran[0][1:3] == ["-m", "generated.tiny_llama.cpu.train"]
    assert "running your edited" in capfd.readouterr().err and (out / "train.py").read_text() == mine


def test_user_errors_exit_1_without_traceback(tmp_path):
    bad = tmp_path / "bad.axl"
    bad.write_text("layer A(d: int) {\n  param w: [d] axes(embed)\n  forward(x: [B, d]) -> [B, d] { return x @@ w }\n}\n")
    r = run_cli("build", str(bad), "--target", "cpu", "--out", str(tmp_path / "o"))
    assert r.returncode == 1
    assert "error: syntax error" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_unknown_target_lists_known_ones():
    r = run_cli("build", "specs/tiny_llama.axl", "--target", "cpux")
    assert r.returncode == 2  # a usage error, as argparse exits for an invalid choice
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
    assert r.returncode == 2 and "unknown pass" in r.stderr


def test_python_dash_m_and_console_script_agree():
    exe = shutil.which("axdsl")
    if exe is None:
        pytest.skip("axdsl console script not installed")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.stdout == run_cli("--version").stdout


def _subparsers():
    from axdsl.cli import _parser

    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)]
    return parser, sub.choices


def test_every_argument_has_help_that_names_its_default():
    """Each option's help line says its default (or that it has none); each positional has help."""
    _, commands = _subparsers()
    for name, sub in commands.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if action.help is None or action.help == "==SUPPRESS==" or action.dest == "help":
                assert action.help == "==SUPPRESS==" or action.dest == "help", f"{name} {action.dest}: no help"
                continue
            shown = " ".join(sub._get_formatter()._expand_help(action).split())
            assert shown in text, (name, action.dest)
            if action.option_strings or action.nargs == "?":
                assert "default" in shown, f"axdsl {name} {action.option_strings or action.dest}: {shown!r}"


def test_target_is_optional_and_defaults_to_cpu_wherever_it_is_taken():
    _, commands = _subparsers()
    taking = {name for name, sub in commands.items() if any(a.dest == "target" for a in sub._actions)}
    assert taking == {"build", "check", "dump", "diff", "aot", "stats", "train"}
    for name in taking - {"diff"}:  # diff compares two targets: it takes exactly two
        (action,) = [a for a in commands[name]._actions if a.dest == "target"]
        assert action.default == "cpu" and not action.required, name


def test_no_command_prints_help_and_exits_2():
    r = run_cli()
    assert r.returncode == 2 and "COMMAND" in r.stderr and "build" in r.stderr


@pytest.mark.parametrize("argv", [["build"], ["check"], ["dump"], ["diff", "specs/tiny_llama.axl"], ["aot"],
                                  ["stats"], ["import-hf", "specs/tiny_llama.axl"], ["export-hf", "s.axl"],
                                  ["export-lora", "s.axl"], ["train"], ["plot"], ["sample"],
                                  ["export-hf", "specs/tiny_llama.axl", "ckpt"],
                                  ["diff", "specs/tiny_llama.axl", "-t", "cpu"],
                                  ["sample", "runs/x", "a", "--prompt", "b"],
                                  ["export-hf", "specs/tiny_llama.axl", "ckpt", "o1", "--out", "o2"]])
def test_a_missing_or_conflicting_argument_exits_2(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert "error:" in err and "Traceback" not in err


def test_export_hf_takes_out_like_import_hf(tmp_path):
    """import-hf SPEC HF_DIR --out CKPT and export-hf SPEC CKPT --out HF_DIR: the same form, both ways;
    the older third positional still works and gives the same files."""
    from tests.test_hf import _hf_model, _write_spec

    spec = _write_spec(tmp_path, "llama")
    _hf_model("llama").save_pretrained(tmp_path / "hf")
    ckpt = tmp_path / "ckpt"
    assert main(["import-hf", str(spec), str(tmp_path / "hf"), "--out", str(ckpt)]) == 0
    assert main(["export-hf", str(spec), str(ckpt), "--out", str(tmp_path / "back")]) == 0
    assert main(["export-hf", str(spec), str(ckpt), str(tmp_path / "back2")]) == 0
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "back2" / name).read_bytes()


def test_train_passes_batch_seq_lr_and_data_to_train_py(tmp_path):
    """The common overrides reach train.py: the run records them. Run as a user does, with no
    JAX_PLATFORMS: with jax's CUDA plugin or libtpu installed (CI installs both extras) and no
    such chip, a cpu train.py still starts jax quietly."""
    import json

    data = tmp_path / "corpus.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    run = tmp_path / "run"
    r = run_cli("train", "specs/tiny_llama.axl", "--out", str(run), "--steps", "2", "--batch", "8", "--seq", "32",
                "--lr", "0.0005", "--data", str(data), env_drop=("JAX_PLATFORMS",))
    assert r.returncode == 0, r.stderr[-3000:]
    for noise in ("Traceback", "plugin configuration error", "TPU worker", "host bounds"):
        assert noise not in r.stderr, r.stderr[-3000:]
    record = json.loads((run / "run.json").read_text())
    assert "--batch 8 --seq 32 --lr 0.0005 --data" in r.stderr
    train = record["train"]
    assert (train["batch"], train["seq"], train["lr"], train["steps"]) == (8, 32, 0.0005, 2)
    assert (train["data"], train["data_path"]) == ("text", str(data))


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--lr", "-1"], "--lr -1.0 must be a finite learning rate above 0"),
        (["--lr", "nan"], "--lr nan must be a finite learning rate above 0"),
        (["--steps", "0"], "--steps 0 must be an integer >= 1"),
        (["--steps", "-5"], "--steps -5 must be an integer >= 1"),
        (["--checkpoint-every", "-3"], "--checkpoint-every -3 must be an integer >= 0"),
        (["--microbatches", "0"], "--microbatches 0 must be an integer >= 1"),
    ],
)
def test_train_py_checks_command_line_values_as_a_train_block_does(flags, says, capsys):
    """--lr -1 trained by gradient ascent and --steps -5 recorded a run of -5 steps, with exit 0
    (issue 38); the values now get the train block's ranges before anything runs."""
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    tc = runtime.train_config(runtime.parse_args(tm.__doc__, tm.TRAIN, tm.CONFIGS, flags), tm.TRAIN, tm.CONFIGS)
    with pytest.raises(SystemExit) as exc:
        runtime.check_values(tc)
    assert says in str(exc.value.code)
    runtime.check_values(tm.TRAIN)  # the spec's own values pass


def test_train_takes_the_models_name_and_gives_it_its_own_run_directory(tmp_path):
    """`axdsl train --model NAME` was "unrecognized arguments" though `stats --model` works; it is
    passed to train.py (which checks the name), and its default run directory names the model."""
    from axdsl import runs

    assert runs.default_run_dir(Path("specs/llama3_2_1b.axl"), "cpu", "llama3_2_tiny") == Path(
        "runs/llama3_2_1b-cpu-llama3_2_tiny")
    assert runs.default_run_dir(Path("specs/llama3_2_1b.axl"), "cpu") == Path("runs/llama3_2_1b-cpu")
    r = run_cli("train", "specs/tiny_llama.axl", "--model", "nope", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "--model nope" in r.stderr, r.stderr[-2000:]
    assert "invalid choice: 'nope'" in r.stderr, r.stderr[-2000:]


def test_a_prompt_that_is_not_utf8_is_a_user_error_not_an_internal_one():
    """`sample --prompt $'\\xff\\xfe'` ended in UnicodeEncodeError, exit 70 (issue 38)."""
    from axdsl.sampling import prompt_problem

    assert prompt_problem(os.fsdecode(b"h\xc3\xa9\xff\xfe")) == (
        "the prompt is not UTF-8 text: byte 0xff at offset 3; give it as UTF-8 (or, for a run on "
        "token ids, as space-separated ids)")
    assert prompt_problem("héllo") is None
