"""Bad input never gives a Python traceback: numbers out of range, huge lines, internal bugs.

Each test runs the real command line (in-process through `axdsl.cli.main`, or as a subprocess
where the process exit matters) and asserts the outcome: a located error and exit 1, or for a
genuine bug one line, a traceback file and exit 70.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from axdsl import cli

HEAD = 'import "std/transformer.axl"\nmodel m = DecoderLM { vocab = 256 dim = 64 layers = 2 heads = 4 kv_heads = 2 ffn = 128 max_seq = 64 '


def _spec(tmp_path: Path, tail: str, name: str = "m.axl") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + tail + " }\n")
    return path


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize("command", ["check", "stats", "aot"])
def test_an_int_past_64_bits_is_a_located_error(tmp_path, capsys, command):
    spec = _spec(tmp_path, "rope_theta = 1.0").read_text().replace("dim = 64", "dim = " + "9" * 400)
    (tmp_path / "m.axl").write_text(spec)
    argv = [command, str(tmp_path / "m.axl")] + (["--target", "cpu"] if command == "aot" else [])
    rc, err = _run(capsys, *argv)
    assert rc == 1 and "m.axl:2:41: error: number 999" in err and "does not fit in 64 bits" in err
    assert len(err) < 1000  # the 400 digits are shortened in the message


def test_an_infinite_float_and_an_overflowing_product_are_located_errors(tmp_path, capsys):
    rc, err = _run(capsys, "check", str(_spec(tmp_path, "rope_theta = 1e999")))
    assert rc == 1 and "number 1e999 is too large for a float" in err
    rc, err = _run(capsys, "stats", str(_spec(tmp_path, "ffn = 4294967296 * 4294967296", "p.axl")))
    assert rc == 1 and "4294967296 * 4294967296 does not fit in 64 bits" in err and "p.axl:2:" in err


def test_a_5_mb_line_is_shown_clipped_around_the_caret(tmp_path, capsys):
    spec = _spec(tmp_path, "zzz = 1" + " " * 5_000_000 + "qqq = 2")
    rc, err = _run(capsys, "check", str(spec))
    assert rc == 1 and "no hyperparameter `zzz`" in err and "no hyperparameter `qqq`" in err
    assert len(err) < 2000
    lines = err.splitlines()
    shown = lines[lines.index(next(x for x in lines if "`qqq`" in x)) + 1]
    caret = lines[lines.index(shown) + 1]
    assert shown.startswith("  ...") and shown[caret.index("^"):].startswith("qqq")


@pytest.mark.parametrize("form", ["unary", "parens", "layers"])
def test_nesting_past_the_limit_is_a_located_error_not_a_recursion_error(tmp_path, capsys, form):
    """3,000 nested minus signs, parenthesized products or layer arguments: one located error."""
    n = 3000
    value = {"unary": "-" * n + "1", "parens": "(1 * " * n + "64" + ")" * n,
             "layers": "Block(mlp = " * n + "MLP()" + ")" * n}[form]
    setting = "block = " + value if form == "layers" else "rope_theta = " + value
    rc, err = _run(capsys, "check", str(_spec(tmp_path, setting)))
    assert rc == 1 and "m.axl:2:" in err and "error: nested too deeply: more than 200 levels" in err, err
    assert len(err) < 1000


def test_nesting_just_under_the_limit_still_compiles(tmp_path, capsys):
    spec = _spec(tmp_path, "")
    spec.write_text(spec.read_text().replace("dim = 64", "dim = " + "(1 * " * 190 + "64" + ")" * 190))
    rc, err = _run(capsys, "stats", str(spec))
    assert rc == 0, err


@pytest.mark.parametrize("where", ["layer", "hyperparameter", "import", "data path"])
def test_a_5_mb_word_is_shortened_in_the_message(tmp_path, capsys, where):
    """A 5 MB name, import path or data path on one line: the message and the line both stay short."""
    word = "a" * 5_000_000
    if where == "layer":
        spec = tmp_path / "m.axl"
        spec.write_text(f"model m = {word} {{ }}\n")
    elif where == "import":
        spec = tmp_path / "m.axl"
        spec.write_text(f'import "{word}"\n')
    elif where == "data path":
        spec = _spec(tmp_path, "")
        spec.write_text(spec.read_text() + f'train {{ data = tokens("{word}") }}\n')
    else:
        spec = _spec(tmp_path, f"{word} = 3")
    rc, err = _run(capsys, "check", str(spec))
    assert rc == 1 and "m.axl:" in err and "error: " in err and len(err) < 1500, err[:300]
    assert "(a word of 5000" in err and "characters, shortened)" in err


def test_a_long_path_on_the_command_line_is_shortened(tmp_path, capsys):
    rc, err = _run(capsys, "plot", str(tmp_path / ("b" * 100_000)))
    assert rc == 1 and err.startswith("axdsl: error: ") and len(err) < 500 and "shortened" in err


def test_an_internal_bug_prints_one_line_writes_the_traceback_and_exits_70(tmp_path, capsys, monkeypatch):
    def broken(args):
        raise ZeroDivisionError("an axdsl bug")

    monkeypatch.setattr(cli, "_cmd_stats", broken)
    rc, err = _run(capsys, "stats", str(_spec(tmp_path, "")))
    assert rc == 70
    first, second = err.strip().splitlines()
    assert "internal error (a bug in axdsl" in first and "ZeroDivisionError: an axdsl bug" in first
    report = Path(second.split("the traceback is in ")[1])
    assert "Traceback" in report.read_text() and "broken" in report.read_text()
    report.unlink()


def test_no_command_prints_help_and_a_missing_argument_exits_2():
    run = subprocess.run([sys.executable, "-m", "axdsl", "stats"], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "usage:" in run.stderr
    run = subprocess.run([sys.executable, "-m", "axdsl"], capture_output=True, text=True)
    assert run.returncode == 2 and "usage: axdsl" in run.stderr and "build" in run.stderr


# ---------------------------------------------------------------------------- outputs
SPEC = Path(__file__).resolve().parent.parent / "specs" / "tiny_llama.axl"


def test_build_refuses_a_directory_it_did_not_write_and_loses_nothing(tmp_path, capsys):
    out = tmp_path / "gen" / "tiny_llama" / "cpu"  # where `--out gen` writes this spec
    (out / "src").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "src" / "a.py").write_text("x = 1")
    rc, err = _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(tmp_path / "gen"))
    assert rc == 1 and "holds files axdsl did not write (notes.txt, src)" in err and "--force" in err
    assert (out / "notes.txt").read_text() == "mine" and (out / "src" / "a.py").read_text() == "x = 1"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "src"]
    assert not list(out.parent.glob(".*"))  # no half-written or renamed-away directories left behind


def test_build_replaces_its_own_output_and_force_replaces_a_foreign_one(tmp_path, capsys):
    root, out = tmp_path / "gen", tmp_path / "gen" / "tiny_llama" / "cpu"
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))[0] == 0
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))[0] == 0  # its own
    (out / "notes.txt").write_text("mine")
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))[0] == 1
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root), "--force")[0] == 0
    assert not (out / "notes.txt").exists()


@pytest.mark.parametrize("linked", ["output", "root"])
def test_a_symlinked_output_stays_a_link_and_its_target_is_rebuilt(tmp_path, capsys, linked):
    """`--out` (or its <spec>/<target> directory) as a symlink: the link is kept, the directory it
    points to is rebuilt in place, nothing is renamed away; a foreign file there is still refused."""
    elsewhere = tmp_path / "elsewhere"
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(elsewhere))[0] == 0
    root = tmp_path / "gen"
    if linked == "output":
        (root / "tiny_llama").mkdir(parents=True)
        (root / "tiny_llama" / "cpu").symlink_to(elsewhere / "tiny_llama" / "cpu")
    else:
        root.symlink_to(elsewhere)
    (elsewhere / "tiny_llama" / "cpu" / "model.py").write_text("# stale\n")
    rc, err = _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))
    link = root / "tiny_llama" / "cpu" if linked == "output" else root
    assert rc == 0, err
    assert link.is_symlink() and (root / "tiny_llama" / "cpu" / "model.py").read_text().startswith("# Generated")
    assert (elsewhere / "tiny_llama" / "cpu" / "model.py").read_text().startswith("# Generated")
    assert not list((root / "tiny_llama").glob(".*")) and not list((elsewhere / "tiny_llama").glob(".*"))
    assert (root / "runtime.py").exists()
    (elsewhere / "tiny_llama" / "cpu" / "notes.txt").write_text("mine")
    rc, err = _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))
    assert rc == 1 and "holds files axdsl did not write (notes.txt)" in err
    assert (elsewhere / "tiny_llama" / "cpu" / "notes.txt").read_text() == "mine" and link.is_symlink()


def test_build_output_has_normal_permissions(tmp_path, capsys):
    import os
    import stat

    out = tmp_path / "gen" / "tiny_llama" / "cpu"
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(tmp_path / "gen"))[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "model.py").stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("case", ["file", "cwd", "mount", "unwritable"])
def test_build_into_a_file_the_cwd_a_mount_point_or_an_unwritable_place_is_a_clean_error(
        tmp_path, capsys, monkeypatch, case):
    root = tmp_path / "gen"
    if case == "file":
        target = root / "tiny_llama" / "cpu"
        target.parent.mkdir(parents=True)
        target.write_text("keep me")
        want = "is a file, not a directory"
    elif case == "cwd":
        (root / "tiny_llama" / "cpu").mkdir(parents=True)
        monkeypatch.chdir(root / "tiny_llama" / "cpu")
        (root / "tiny_llama" / "cpu" / "keep.txt").write_text("keep me")
        want = "it is the current directory"
    elif case == "mount":
        import os

        real, out = os.path.ismount, (root / "tiny_llama" / "cpu").resolve()
        monkeypatch.setattr("os.path.ismount", lambda p: Path(p) == out or real(p))  # a mounted volume
        want = "mount point"
    else:
        root, want = Path("/proc/axdsl_test"), "cannot write /proc/axdsl_test/tiny_llama/cpu"
    rc, err = _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))
    assert rc == 1 and want in err, err
    if case == "file":
        assert target.read_text() == "keep me" and not list(target.parent.glob(".cpu*"))
    if case == "cwd":
        assert (root / "tiny_llama" / "cpu" / "keep.txt").read_text() == "keep me"


def test_build_never_overwrites_a_runtime_py_it_did_not_write(tmp_path, capsys):
    (tmp_path / "runtime.py").write_text("# my own runtime\n")
    rc, err = _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(tmp_path))
    assert rc == 1 and "runtime.py exists and was not written by axdsl" in err
    assert (tmp_path / "runtime.py").read_text() == "# my own runtime\n"


# ---------------------------------------------------------------------------- edited train.py
def test_a_train_py_and_runtime_of_different_apis_stop_with_a_message(tmp_path, capsys):
    root = tmp_path / "gen"
    assert _run(capsys, "build", str(SPEC), "--target", "cpu", "--out", str(root))[0] == 0
    runtime = root / "runtime.py"
    api = int(re.search(r"^API = (\d+)$", runtime.read_text(), re.M).group(1))
    runtime.write_text(runtime.read_text().replace(f"\nAPI = {api}\n", f"\nAPI = {api + 1}\n"))
    run = subprocess.run([sys.executable, "-m", "gen.tiny_llama.cpu.train", "--steps", "1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"train.py was written for runtime API {api}" in run.stderr and f"API {api + 1}" in run.stderr


def test_aot_says_when_it_is_not_reporting_your_edited_train_py(tmp_path, monkeypatch):
    import shutil

    from axdsl.aot import analyze
    from axdsl.aot.render import render

    monkeypatch.chdir(tmp_path)
    shutil.copy(SPEC, tmp_path / "tiny_llama.axl")
    shutil.copy(SPEC.parent / "llama3_8b.axl", tmp_path / "llama3_8b.axl")
    assert cli.main(["build", "tiny_llama.axl", "--target", "cpu"]) == 0
    report = analyze(Path("tiny_llama.axl"), "cpu", lower=False)
    assert not report.notes
    train = tmp_path / "generated" / "tiny_llama" / "cpu" / "train.py"
    train.write_text(train.read_text() + "\n# mine\n")
    report = analyze(Path("tiny_llama.axl"), "cpu", lower=False)
    assert "you edited generated/tiny_llama/cpu/train.py" in render(report)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_import_hf_names_a_damaged_safetensors_file(tmp_path, damage):
    """An empty, truncated or random model.safetensors is one error line naming the file (exit 1)."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    import numpy as np

    from axdsl import hf as axhf
    from axdsl.hf.errors import HFError

    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file({"model.embed_tokens.weight": np.ones((256, 64), np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) - 1000],
                      "garbage": bytes(range(256)) * 4}[damage])
    with pytest.raises(HFError) as info:
        axhf.safetensors_io.check_file(path)
    assert str(path) in str(info.value)
    assert {"empty": "is not a safetensors file", "truncated": "is truncated: its tensors need",
            "garbage": "is not a safetensors file"}[damage] in str(info.value)


@pytest.mark.parametrize("setting, says", [
    ("block = Block(mlp = SwiGLU(hiden = 96))", "layer `SwiGLU` has no hyperparameter `hiden`"),
    ("dim = -64", "a dimension must be a positive int, got -64"),
    ("layers = 0", "`repeat` count must be a positive int, got 0"),
    ("heads = 0", "division by zero"),
])
def test_a_mistake_that_fails_in_std_is_an_error_in_the_users_file(tmp_path, capsys, setting, says):
    """Each was reported only inside std/ (15 errors for dim = -64): every error now stands in
    the user's file, at the line that set the value where one can be blamed (else at the model),
    with a note for the library line."""
    spec = tmp_path / "m.axl"
    spec.write_text('import "std/transformer.axl"\nmodel m = DecoderLM {\n'
                    "  vocab = 256  dim = 64  layers = 2  heads = 4  max_seq = 128\n"
                    f"  {setting}\n}}\n")
    rc, err = _run(capsys, "check", str(spec))
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert rc == 1 and errors and all(line.startswith(str(spec)) for line in errors), err
    assert f"{spec}:4:" in err and says in err and "note: raised here" in err


@pytest.mark.parametrize("encode", [
    lambda t: b"\xef\xbb\xbf" + t.encode(),  # a UTF-8 byte-order mark (was "unexpected character")
    lambda t: t.replace("\n", "\r").encode(),  # CR-only lines (was "this spec defines no model")
    lambda t: t.replace("\n", "\r\n").encode(),
])
def test_a_byte_order_mark_and_other_line_ends_read_as_plain_lines(tmp_path, capsys, encode):
    text = ('# a comment\nimport "std/transformer.axl"\n'
            "model lm = DecoderLM { vocab = 256  dim = 64  layers = 2  heads = 4  max_seq = 128 }\n")
    spec = tmp_path / "m.axl"
    spec.write_bytes(encode(text))
    rc, out = _run(capsys, "check", str(spec))
    assert rc == 0, out


def test_a_run_directory_that_is_not_a_runs_is_refused_before_any_compute(tmp_path):
    """--out a file, checkpoints a file, metrics.jsonl a directory, a run.json of the user's: each
    was a traceback after training (or the user's run.json replaced); now one line up front."""
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    (tmp_path / "f").write_text("mine")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "checkpoints").write_text("mine")
    (tmp_path / "b" / "metrics.jsonl").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "run.json").write_text('{"mine": 1}')
    for out, says in (("f", "is a file, not a run directory"),
                      ("a", "checkpoints is a file; a run writes a directory there"),
                      ("b", "metrics.jsonl is a directory; a run writes a file there"),
                      ("c", "run.json was not written by axdsl")):
        with pytest.raises(SystemExit) as stop:
            runtime.check_run_dir(tmp_path / out, tm.TRAIN)
        assert says in str(stop.value.code)
    runtime.check_run_dir(tmp_path / "new", tm.TRAIN)  # absent: a new run
    with pytest.raises(SystemExit) as stop:  # sysfs refuses new files, even to root
        runtime.check_run_dir(Path("/sys/axdsl-run"), tm.TRAIN)
    assert "/sys is not writable" in str(stop.value.code)
    assert (tmp_path / "c" / "run.json").read_text() == '{"mine": 1}'
    source = Path(tm.__file__).read_text()  # checked before the data is read and anything compiled
    assert source.index("runtime.check_run_dir(") < source.index("runtime.load_data(")


def test_a_resume_that_would_mix_runs_is_refused_before_any_compute(tmp_path):
    """A rerun into a run's directory resumed whatever changed: the spec (rope_theta), the target,
    --data, --init-from, or --steps, which stretched the cosine schedule mid-run. run.json now
    records the run's identity, and a resume that is not the run a fresh start would be is
    refused, each difference named; a longer run whose steps taken keep their lr resumes."""
    import dataclasses
    import json

    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(200)) * 10)
    tc = dataclasses.replace(tm.TRAIN, steps=60, data="tokens", data_path=str(data))
    identity = runtime.run_identity(tc, tm.SPEC, tm.TARGET, tm.__file__, True)
    run = tmp_path / "run"
    runtime.start_run(run, tc, "generated.tiny_llama.cpu", tm.__file__, tm.SPEC, tm.TARGET, identity)
    runtime.check_resume(run, dataclasses.replace(tc, lr=1.0), identity, tm.lr_schedule)  # no checkpoint: new
    (run / "checkpoints" / "40").mkdir(parents=True)

    def refused(tc, identity=identity) -> str:
        with pytest.raises(SystemExit) as stop:
            runtime.check_resume(run, tc, identity, tm.lr_schedule)
        return str(stop.value.code)

    runtime.check_resume(run, tc, identity, tm.lr_schedule)  # the same run
    runtime.check_resume(run, dataclasses.replace(tc, steps=90, log_every=1), identity, tm.lr_schedule)
    assert "lr was 0.0003, now 0.001" in refused(dataclasses.replace(tc, lr=1e-3))
    assert "init_from was '', now 'hf'" in refused(dataclasses.replace(tc, init_from="hf"))
    assert "its target is cpu, this one is tpu-v5e" in refused(tc, {**identity, "target": "tpu-v5e"})
    code = {**identity["code"], "model.py": "0" * 64}
    assert "its generated model.py differs" in refused(tc, {**identity, "code": code})
    data.write_bytes(data.read_bytes() + b"more")  # appended to
    moved = runtime.run_identity(tc, tm.SPEC, tm.TARGET, tm.__file__, True)
    message = refused(tc, moved)
    assert "the data of data_path differs" in message and "--init-from" in message

    info = json.loads((run / "run.json").read_text())  # a run whose cosine decay had begun
    (run / "run.json").write_text(json.dumps({**info, "train": {**info["train"], "warmup": 10}}))
    short = dataclasses.replace(tc, warmup=10)
    runtime.check_resume(run, short, identity, tm.lr_schedule)
    assert "steps was 60, now 90: that changes the learning rate of steps it already took (step 11:" in (
        refused(dataclasses.replace(short, steps=90)))
    forced = runtime.check_resume(run, dataclasses.replace(short, lr=1e-3), identity, tm.lr_schedule, force=True)
    assert forced == {"step": 40, "changes": ["lr was 0.0003, now 0.001"]}
    for record in (forced, None):  # the forced resume, then a plain one: each trainer has exited
        (run / "lock").unlink()
        runtime.start_run(run, short, "generated.tiny_llama.cpu", tm.__file__, tm.SPEC, tm.TARGET, identity, record)
    assert json.loads((run / "run.json").read_text())["forced_resumes"] == [forced]  # kept on record
    source = Path(tm.__file__).read_text()
    assert source.index("runtime.check_resume(") < source.index("runtime.load_data(")


def test_a_generated_files_digest_ignores_comments_and_docstrings(tmp_path):
    from generated import runtime

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""v1"""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n')
    b.write_text('"""v2: another header"""\ndef f(x):\n    return (x + 1)\n')
    c.write_text('"""v1"""\n\ndef f(x):\n    """Doc."""\n    return x + 2  # one\n')
    assert runtime.code_digest(a) == runtime.code_digest(b) != runtime.code_digest(c)


def test_an_import_of_a_device_or_a_fifo_is_refused_not_read(tmp_path, capsys):
    """`import "/dev/zero"` read until the kernel killed it at 21 GB; a FIFO would block."""
    import os

    fifo = tmp_path / "pipe.axl"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(fifo)):
        spec = tmp_path / "m.axl"
        spec.write_text(f'import "{target}"\n')
        rc, err = _run(capsys, "check", str(spec))
        assert rc == 1 and "not a regular file" in err, err


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """metrics.jsonl had steps 10, 20, 20, 30 after a kill at 20 and a resume from 16 (issue 38):
    the rows after the resumed step are dropped before the run logs them again."""
    from generated import runtime

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10, "loss": 2.0}\n{"step": 20, "loss": 1.5}\n{"step": 3\n{"step": 30}\n')
    with runtime.open_metrics(path, 16) as f:
        f.write('{"step": 20, "loss": 1.5}\n')
    assert path.read_text() == '{"step": 10, "loss": 2.0}\n{"step": 3\n{"step": 20, "loss": 1.5}\n'
    with runtime.open_metrics(path, 0) as f:  # a fresh start keeps everything (and appends)
        pass
    assert path.read_text().count("\n") == 3


def test_train_py_and_axdsl_train_share_the_default_run_directory():
    """`python -m generated...train` wrote runs/<model>, `axdsl train` runs/<spec>-<target>:
    neither resumed the other's run."""
    from axdsl import runs
    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    assert runtime.parse_args(tm.__doc__, tm.TRAIN, tm.CONFIGS, [], tm.SPEC, tm.TARGET).out == (
        runs.default_run_dir(Path(tm.SPEC), tm.TARGET))
    for spec, target, model in (("specs/a.axl", "cpu", None), ("s/b.axl", "tpu-v5e-8", "small")):
        assert runtime.default_run_dir(spec, target, model) == runs.default_run_dir(Path(spec), target, model)


def test_a_state_this_machine_cannot_hold_is_refused_before_the_data(tmp_path):
    """An 8B model on this CPU was killed by the kernel, or trained until its first save hit a full
    disk; the state's shapes alone say so up front (4 TiB of parameters here, real figures of this
    machine's memory and disk)."""
    import jax

    from generated import runtime
    from generated.tiny_llama.cpu import train as tm

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    huge = {"params": {"w": jax.ShapeDtypeStruct((2**20, 2**20), "float32", sharding=one)}}
    with pytest.raises(SystemExit) as stop:
        runtime.preflight(tmp_path / "run", huge)
    message = str(stop.value.code)
    assert "need 8192.00 GiB on this host, more than available host memory" in message
    assert "a checkpoint takes 4505.60 GiB and " in message and "--no-preflight" in message
    runtime.preflight(tmp_path / "run", huge, skip=True)
    cfg, mesh = tm.model_config(tm.TRAIN), tm.make_mesh()
    runtime.preflight(tmp_path / "run", tm.abstract_state(cfg, tm.TRAIN, mesh))  # fits
    source = Path(tm.__file__).read_text()
    assert source.index("runtime.preflight(") < source.index("runtime.load_data(")


def test_axdsl_train_from_hf_never_imports_jax_in_its_own_process(tmp_path):
    """`axdsl train --init-from HF_DIR` imported the weights in-process (jax and its threads),
    then forked the trainer: jax's os.fork() deadlock warning. The import is a child now."""
    code = ("import sys; from pathlib import Path; from axdsl import runs; "
            "code = runs.hf_init_params(Path('specs/tiny_llama.axl'), Path(sys.argv[1]), Path(sys.argv[2])); "
            "print(code, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "no_hf"), str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["1", "False"], out
    assert "config.json not found" in out.stderr and "Traceback" not in out.stderr
