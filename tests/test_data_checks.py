"""Data is checked before the first step: a generated train.py stops with one `error:` line (exit 1,
no traceback) on data it cannot train on, instead of 'training' on NaNs or crashing after training.

Each case builds a tiny spec whose train block names its data, then runs train.py's `main` in
this process; the checks run before any compilation, so each case takes well under a second.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_training import build_package

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


def test_non_finite_steps_without_a_checkpoint_exit_non_zero(tmp_path, capsys):
    """Every update non-finite (lr inf) and nothing to roll back to: an error, not exit 0."""
    (tmp_path / "d.txt").write_bytes(bytes(range(100)) * 30)
    tm = build_package(tmp_path, "lm", BYTES_MODEL
                       + 'train {\n  batch = 8  seq = 16  steps = 8  max_bad_steps = 2\n  data = text("d.txt")\n'
                       '  eval_every = 0  checkpoint(every = 0)\n}\n')
    with pytest.raises(SystemExit) as stop:
        tm.main(["--no-progress", "--out", str(tmp_path / "run"), "--lr", "inf"])
    assert str(stop.value.code).startswith("error: 2 non-finite steps in a row up to step ") and "no checkpoint to roll back to" in str(stop.value.code)


def test_steps_inside_the_warmup_warn(tmp_path, capsys):
    (tmp_path / "d.txt").write_bytes(bytes(range(100)) * 30)
    tm = build_package(tmp_path, "lm", BYTES_MODEL
                       + 'train {\n  batch = 8  seq = 16  steps = 100  schedule = cosine(warmup = 50)\n'
                       '  data = text("d.txt")  eval_every = 0  checkpoint(every = 0)\n}\n')
    tm.main(["--no-progress", "--out", str(tmp_path / "run"), "--steps", "2"])
    assert "warning: steps 2 end inside the learning-rate warmup (50 steps)" in capsys.readouterr().err
