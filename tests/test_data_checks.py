"""Data is checked before the first step: a generated train.py stops with one `error:` line (exit 1,
no traceback) on data it cannot train on, instead of 'training' on NaNs or crashing after training.

Each case builds a tiny spec whose train block names its data, then runs train.py's `main` in
this process; the checks run before any compilation, so each case takes well under a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from axdsl.cli import main
from test_training import build_package

ROOT = Path(__file__).resolve().parent.parent

MODEL = """import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 100  dim = 16  layers = 1  heads = 2  ffn = 32  max_seq = 32  dtype = f32
}
"""

BYTES_MODEL = MODEL.replace("vocab = 100", "vocab = 256")  # text is bytes


def _train(tmp_path, data: str, extra: str = "", argv: tuple[str, ...] = ()) -> tuple[str, str]:
    """Run the spec's train.py main with `data` in its train block; return (SystemExit message, stderr)."""
    model = MODEL if data.startswith("tokens") else BYTES_MODEL
    tm = build_package(tmp_path, "lm", model + f"train {{\n  batch = 8  seq = 16  steps = 3\n  data = {data}\n{extra}}}\n")
    with pytest.raises(SystemExit) as stop:
        tm.main(["--no-progress", "--out", str(tmp_path / "run"), *argv])
    return str(stop.value.code), ""


def test_ids_beyond_the_vocab_are_counted_before_training(tmp_path):
    ids = np.arange(2000, dtype=np.uint16) % 100
    ids[[5, 77, 1500]] = [100, 250, 101]
    (tmp_path / "train.bin").write_bytes(ids.tobytes())
    message, _ = _train(tmp_path, 'tokens("train.bin", dtype = "u16")')
    assert message.startswith("error: 3 of 2000 token ids are >= the model's vocab 100 (the largest is 250)")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before any step


def test_a_relative_path_is_relative_to_the_spec(tmp_path, monkeypatch):
    """tokens("x.bin") in specs/a.axl is specs/x.bin, whatever the working directory."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    message, _ = _train(tmp_path, 'tokens("missing.bin")')
    assert message == (f"error: data {tmp_path / 'missing.bin'} does not exist ('missing.bin' in "
                       f"{tmp_path / 'lm.axl'}, relative to its directory)")


def test_an_eval_split_shorter_than_a_sequence_stops_before_training(tmp_path):
    (tmp_path / "small.txt").write_bytes(b"a few bytes of text " * 40)  # 800 bytes: eval split 16
    message, _ = _train(tmp_path, 'text("small.txt")', "  eval_every = 2\n")
    assert message.startswith("error: the eval split (the last 2% of the data) has 16 tokens, one sequence needs 18")
    # Without evaluation the same data trains.
    tm = build_package(tmp_path, "lm2", BYTES_MODEL + 'train {\n  batch = 8  seq = 16  steps = 2\n  data = text("small.txt")\n'
                       '  eval_every = 0  checkpoint(every = 0)\n}\n')
    tm.main(["--no-progress", "--out", str(tmp_path / "ok")])
    assert (tmp_path / "ok" / "metrics.jsonl").exists()


@pytest.mark.parametrize("content,expected", [
    (b"", "error: data file {path} is empty"),
    (b"\x01\x00\x02", "error: token file {path} has 3 bytes, not a whole number of u16 ids: is data_dtype right?"),
])
def test_empty_or_truncated_token_files(tmp_path, content, expected):
    path = tmp_path / "t.bin"
    path.write_bytes(content)
    message, _ = _train(tmp_path, 'tokens("t.bin")')
    assert message == expected.format(path=path)


def test_too_little_data_for_one_sequence(tmp_path):
    (tmp_path / "tiny.txt").write_bytes(b"hello")
    message, _ = _train(tmp_path, 'text("tiny.txt")')
    assert message.startswith("error: 5 tokens are too few: the training split has 4, one sequence needs 18")


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_a_binary_text_source_stops_before_training(tmp_path, layout):
    """Random bytes (a NUL among them) read by text(): refused before any step, naming the file."""
    junk = bytes(range(256)) * 40
    if layout == "file":
        (tmp_path / "d.txt").write_bytes(junk)
        data, which = 'text("d.txt")', f"{tmp_path / 'd.txt'}"
    else:
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "a.txt").write_bytes(b"plain text\n" * 400)
        (tmp_path / "docs" / "b.png").write_bytes(junk)
        data, which = 'text("docs")', f"{tmp_path / 'docs'}: {tmp_path / 'docs' / 'b.png'}"
    message, _ = _train(tmp_path, data)
    assert message == (f"error: text data {which} is binary (a NUL byte in its first 8 KiB); text() "
                       "trains on text files: use tokens(...) for token ids")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_non_finite_steps_without_a_checkpoint_exit_non_zero(tmp_path, capsys):
    """Every update non-finite (lr inf) and nothing to roll back to: an error, not exit 0."""
    (tmp_path / "d.txt").write_bytes(bytes(range(1, 101)) * 30)  # no NUL: a binary file is refused
    tm = build_package(tmp_path, "lm", BYTES_MODEL
                       + 'train {\n  batch = 8  seq = 16  steps = 8  max_bad_steps = 2\n  data = text("d.txt")\n'
                       '  eval_every = 0  checkpoint(every = 0)\n}\n')
    with pytest.raises(SystemExit) as stop:
        tm.main(["--no-progress", "--out", str(tmp_path / "run"), "--lr", "1e38"])  # (inf is refused)
    assert str(stop.value.code).startswith("error: 2 non-finite steps in a row up to step ") and "no checkpoint to roll back to" in str(stop.value.code)


def test_steps_inside_the_warmup_warn(tmp_path, capsys):
    (tmp_path / "d.txt").write_bytes(bytes(range(1, 101)) * 30)  # no NUL: a binary file is refused
    tm = build_package(tmp_path, "lm", BYTES_MODEL
                       + 'train {\n  batch = 8  seq = 16  steps = 100  schedule = cosine(warmup = 50)\n'
                       '  data = text("d.txt")  eval_every = 0  checkpoint(every = 0)\n}\n')
    tm.main(["--no-progress", "--out", str(tmp_path / "run"), "--steps", "2"])
    assert "warning: steps 2 end inside the learning-rate warmup (50 steps)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- at `axdsl check` time


def _check(tmp_path, data: str, extra: str = "", capsys=None) -> tuple[int, str]:
    """`axdsl check` on a spec whose train block names `data`; (exit code, stderr)."""
    from axdsl.cli import main

    spec = tmp_path / "lm.axl"
    spec.write_text(BYTES_MODEL + f"train {{\n  batch = 8  seq = 16  steps = 3\n  data = {data}\n{extra}}}\n")
    rc = main(["check", str(spec)])
    return rc, capsys.readouterr().err


def test_check_finds_an_eval_split_shorter_than_a_sequence(tmp_path, capsys):
    """The same data the trainer refuses (test above) is refused by `axdsl check`, at the data line,
    with the trainer's numbers (800 bytes: eval split 16, a sequence needs 18)."""
    (tmp_path / "small.txt").write_bytes(b"a few bytes of text " * 40)
    rc, err = _check(tmp_path, 'text("small.txt")', "  eval_every = 2\n", capsys)
    assert rc == 1
    assert err.startswith(f"{tmp_path / 'lm.axl'}:8:3: error: the eval split (the last 2% of the data's 800 "
                          "tokens) has 16, one sequence needs 18 (seq 16)\n    data = text(\"small.txt\")\n    ^")
    assert "hint: add data, lower seq or set eval_every = 0" in err
    rc, err = _check(tmp_path, 'text("small.txt")', "  eval_every = 0\n", capsys)
    assert (rc, err) == (0, "")  # without evaluation the same data trains


@pytest.mark.parametrize("name,content,expected", [
    ("tiny.txt", b"hello", "the data holds 5 tokens: its training split has 4, one sequence needs 18 (seq 16)"),
    ("t.bin", b"\x01\x00\x02", "token file {path} has 3 bytes, not a whole number of u16 ids: is its dtype right?"),
    ("t.bin", b"", "data file {path} is empty"),
])
def test_check_sizes_the_data_it_finds(tmp_path, capsys, name, content, expected):
    (tmp_path / name).write_bytes(content)
    data = f'text("{name}")' if name.endswith(".txt") else f'tokens("{name}")'
    rc, err = _check(tmp_path, data, "", capsys)
    assert rc == 1 and f"error: {expected.format(path=tmp_path / name)}\n" in err, err


def test_check_refuses_a_binary_text_source_at_the_data_line(tmp_path, capsys):
    (tmp_path / "d.txt").write_bytes(b"text first, then " + bytes(range(256)) * 40)
    rc, err = _check(tmp_path, 'text("d.txt")', "", capsys)
    assert rc == 1 and err.startswith(f"{tmp_path / 'lm.axl'}:8:3: error: text data {tmp_path / 'd.txt'} is "
                                      "binary (a NUL byte in its first 8 KiB)\n"), err
    assert "hint: text() trains on text files: use tokens(...) for token ids" in err


def test_check_leaves_data_that_is_not_there_yet_to_the_trainer(tmp_path, capsys):
    rc, err = _check(tmp_path, 'tokens("later.bin")', "", capsys)
    assert (rc, err) == (0, "")


def test_check_reports_models_of_different_structure_at_their_line(tmp_path, capsys):
    """Models of one spec share generated code: `check` says so as `build` does, with the line."""
    from axdsl.cli import main

    spec = tmp_path / "two.axl"
    spec.write_text(MODEL + "model other extends lm { block = ParallelBlock() }\n")
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{spec}:6:7: error: model `other` has a different structure from `lm`\n"
                          "  model other extends lm { block = ParallelBlock() }\n        ^^^^^\n"), err


IMAGES_SPEC = """layer Pix(h: int = 4, w: int = 4, c: int = 3, classes: int = 3) {
  param k: [h, w, c, classes] axes(norm, seq, embed, vocab) init normal(0.05)
  forward(images: [B, h, w, c]) -> [B, classes] {
    return einsum("B h w c, h w c classes -> B classes", images, k)
  }
}
model pix = Pix {}
train {
  objective = classify()
  data = arrays("x.npz")
}
"""


@pytest.mark.parametrize("arrays, expected", [
    (None, "is not a readable .npz file"),
    ({"images": (10, 4, 4, 3)}, "holds ['images']; the model reads images [N, 4, 4, 3] and labels [N]"),
    ({"images": (10, 4, 5, 3), "labels": (10,)}, "images are [10, 4, 5, 3] and labels [10]"),
    ({"images": (10, 4, 4, 3), "labels": (9,)}, "images are [10, 4, 4, 3] and labels [9]"),
    ({"images": (10, 4, 4, 3), "labels": (10, "f")}, "labels are float32, not integers"),
    ({"images": (1, 4, 4, 3), "labels": (1,)}, "none is left to hold out for evaluation"),
])
def test_check_reads_an_arrays_file_from_its_headers(tmp_path, capsys, arrays, expected):
    """classify's arrays("x.npz") is checked at the data line against the model's image shape."""
    import numpy as np

    if arrays is None:
        (tmp_path / "x.npz").write_bytes(b"not a zip file")
    else:
        np.savez(tmp_path / "x.npz", **{k: np.zeros(v[:-1] if v[-1] == "f" else v,
                                                     np.float32 if k == "images" or v[-1] == "f" else np.int32)
                                        for k, v in arrays.items()})
    spec = tmp_path / "pix.axl"
    spec.write_text(IMAGES_SPEC)
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "pix.axl:10:3: error: arrays data" in err and expected in err, err


def test_arrays_takes_a_directory_of_npy_files_and_refuses_one_npy(tmp_path, capsys):
    """arrays("x") reads x/images.npy and x/labels.npy; arrays("x.npy"), one array without names,
    is refused at the data line by `check` and in one line by train.py's loader, no traceback."""
    import numpy as np

    from generated import runtime

    (tmp_path / "x").mkdir()
    np.save(tmp_path / "x" / "images.npy", np.zeros((10, 4, 4, 3), np.float32))
    np.save(tmp_path / "x" / "labels.npy", np.zeros(10, np.int32))
    spec = tmp_path / "pix.axl"
    spec.write_text(IMAGES_SPEC.replace('arrays("x.npz")', 'arrays("x")'))
    assert main(["check", str(spec)]) == 0, capsys.readouterr().err
    assert sorted(runtime.read_arrays(tmp_path / "x", ("images", "labels"))) == ["images", "labels"]
    np.save(tmp_path / "y.npy", np.zeros((10, 4, 4, 3), np.float32))
    spec.write_text(IMAGES_SPEC.replace('arrays("x.npz")', 'arrays("y.npy")'))
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "pix.axl:10:3: error: arrays data" in err and "one .npy array" in err, err
    with pytest.raises(SystemExit, match="is one .npy array; arrays"):
        runtime.read_arrays(tmp_path / "y.npy", ("images", "labels"))


def test_check_accepts_a_good_arrays_file_and_sizes_pairs(tmp_path, capsys):
    import numpy as np

    np.savez(tmp_path / "x.npz", images=np.zeros((10, 4, 4, 3), np.float32), labels=np.zeros(10, np.int64))
    spec = tmp_path / "pix.axl"
    spec.write_text(IMAGES_SPEC)
    assert main(["check", str(spec)]) == 0, capsys.readouterr().err
    (tmp_path / "src.bin").write_bytes(b"\x01\x00\x02")  # a u16 file of 1.5 ids
    (tmp_path / "tgt.bin").write_bytes(b"\x01\x00")
    t5 = tmp_path / "t5.axl"
    t5.write_text((ROOT / "specs" / "t5_tiny.axl").read_text().replace(
        'import "t5_base.axl"', f'import "{ROOT / "specs" / "t5_base.axl"}"').split("train {")[0]
        + 'train {\n  objective = seq2seq(start_token = 0)\n  data = pairs("src.bin", "tgt.bin", eos = 1)\n}\n')
    assert main(["check", str(t5)]) == 1
    err = capsys.readouterr().err
    assert "token file" in err and "src.bin has 3 bytes, not a whole number of u16 ids" in err, err
