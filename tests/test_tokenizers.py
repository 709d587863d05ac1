"""Tokenizers: `text(path, tokenizer = bpe(vocab = N))` trains a byte-level BPE on the text with HF
`tokenizers` and keeps it as RUN_DIR/tokenizer.json; `tokenizer = "tokenizer.json"` uses a given
file. The token ids are cached beside the source under a hash of text and tokenizer, so a rerun does
not retokenize, and a damaged cache is set aside and rebuilt. `axdsl sample` decodes through the
run's tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from axdsl import runs

ROOT = Path(__file__).resolve().parent.parent
SPEC = """import "std/transformer.axl"

model tok_lm = DecoderLM {{
  vocab = 512  dim = 32  layers = 1  heads = 2  kv_heads = 1  ffn = 64  max_seq = 64  dtype = f32
}}

train {{
  batch = 8  seq = 32  steps = {steps}  log_every = 1  eval_every = 4  eval_batches = 1
  optimizer = adamw(lr = 3e-3)  schedule = constant(warmup = 0)
  data = text("corpus.txt", tokenizer = {tokenizer})
  checkpoint(every = 4, async = false)
}}
"""


def _corpus() -> bytes:
    """Some hundred KiB of real text: this repository's docs and compiler sources."""
    files = [ROOT / "README.md", ROOT / "docs" / "language.md", *sorted((ROOT / "axdsl").glob("*.py"))]
    return b"\n".join(p.read_bytes() for p in files)


def _runtime():
    """generated/runtime.py of this checkout, loaded by path."""
    spec = importlib.util.spec_from_file_location("tok_runtime", ROOT / "generated" / "runtime.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bpe_trains_deterministically_and_round_trips(tmp_path):
    runtime = _runtime()
    text = _corpus()[:200_000]
    first, second = runtime.train_bpe(text, 600), runtime.train_bpe(text, 600)
    assert first.to_str() == second.to_str()  # the same text gives the same tokenizer
    assert first.get_vocab_size() == 600
    sample = "def f(x):\n    return x + 1  # ünïcödé\n"
    assert first.decode(first.encode(sample, add_special_tokens=False).ids) == sample
    ids = runtime.tokenize(first, text, None, None)
    assert len(ids) < 0.6 * len(text)  # merges do compress: well under one id per byte
    assert first.decode([int(i) for i in ids]) == text.decode("utf-8")


def test_tokens_are_cached_beside_the_source_and_a_damaged_cache_is_set_aside(tmp_path, capfd):
    runtime = _runtime()
    source = tmp_path / "corpus.txt"
    source.write_bytes(_corpus()[:100_000])
    tokenizer = runtime.train_bpe(source.read_bytes(), 400)
    ids = runtime.tokenize(tokenizer, source.read_bytes(), source, tmp_path / "run")
    (cache,) = tmp_path.glob("corpus.txt.*.tokens.npy")
    assert np.array_equal(np.load(cache), ids)

    class NoEncode:  # a second call must read the cache, never encode
        def __init__(self, inner):
            self.inner = inner

        def to_str(self):
            return self.inner.to_str()

        def encode_batch(self, *args, **kwargs):
            raise AssertionError("retokenized")

    again = runtime.tokenize(NoEncode(tokenizer), source.read_bytes(), source, tmp_path / "run")
    assert np.array_equal(again, ids)

    # another text or another tokenizer: another cache file, the first one kept
    runtime.tokenize(runtime.train_bpe(source.read_bytes(), 300), source.read_bytes(), source, None)
    assert len(list(tmp_path.glob("corpus.txt.*.tokens.npy"))) == 2

    data = bytearray(cache.read_bytes())
    data[-3] ^= 0xFF  # a flipped byte in a cached id
    cache.write_bytes(bytes(data))
    rebuilt = runtime.tokenize(tokenizer, source.read_bytes(), source, None)
    assert np.array_equal(rebuilt, ids)
    assert "damaged" in capfd.readouterr().err
    assert cache.with_name(cache.name + ".damaged").exists()  # set aside, not deleted


def test_unwritable_cache_beside_the_source_falls_back_to_the_run(tmp_path):
    runtime = _runtime()
    source = tmp_path / "corpus.txt"
    source.write_bytes(_corpus()[:50_000])
    tokenizer = runtime.train_bpe(source.read_bytes(), 300)
    key = runtime.hashlib.sha256(runtime.hashlib.sha256(source.read_bytes()).digest()
                                 + tokenizer.to_str().encode("utf-8")).hexdigest()[:16]
    (tmp_path / f"corpus.txt.{key}.tokens.npy.sha256").mkdir()  # (root ignores read-only modes)
    ids = runtime.tokenize(tokenizer, source.read_bytes(), source, tmp_path / "run")
    (cache,) = (tmp_path / "run" / "data_cache").glob("*.tokens.npy")
    assert np.array_equal(np.load(cache), ids) and not list(tmp_path.glob("corpus.txt.*.tokens.npy"))


@pytest.mark.slow
def test_train_with_bpe_then_sample_decodes_text(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_bytes(_corpus()[:300_000])
    (tmp_path / "tok.axl").write_text(SPEC.format(steps=8, tokenizer="bpe(vocab = 512)"))
    run = tmp_path / "runs" / "tok"
    assert runs.train(Path("tok.axl"), "cpu", run, None, None) == 0
    kept = run / "tokenizer.json"
    assert json.loads(kept.read_text())["model"]["type"] == "BPE"
    caches = sorted(tmp_path.glob("corpus.txt.*.tokens.npy"))
    assert len(caches) == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    assert losses[0] == pytest.approx(np.log(512), abs=0.5) and losses[-1] < losses[0]

    # a rerun resumes with the run's tokenizer and the cached ids (no new cache, same tokenizer)
    before = kept.read_text()
    capfd.readouterr()
    assert runs.train(Path("tok.axl"), "cpu", run, 12, None) == 0
    assert "resumed from step 8" in capfd.readouterr().err
    assert kept.read_text() == before and sorted(tmp_path.glob("corpus.txt.*.tokens.npy")) == caches

    out = subprocess.run([sys.executable, "-m", "axdsl", "sample", str(run), "--prompt", "The model",
                          "--max-tokens", "12", "--temperature", "0"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The model") and len(out.stdout) > len("The model\n")
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_given_tokenizer_file_and_its_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runtime = _runtime()
    (tmp_path / "corpus.txt").write_bytes(_corpus()[:100_000])
    (tmp_path / "hf").mkdir()
    runtime.train_bpe((tmp_path / "corpus.txt").read_bytes(), 1000).save(str(tmp_path / "hf" / "tokenizer.json"))

    def start(tokenizer: str, name: str) -> subprocess.Popen:
        (tmp_path / f"{name}.axl").write_text(SPEC.format(steps=2, tokenizer=tokenizer))
        return subprocess.Popen([sys.executable, "-m", "axdsl", "train", f"{name}.axl", "--target", "cpu",
                                 "--out", f"runs/{name}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def done(proc: subprocess.Popen) -> subprocess.CompletedProcess:
        out, err = proc.communicate(timeout=300)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # the three refusals are independent runs: side by side
    (tmp_path / "bad.json").write_text("{not json")
    started = [start('"hf/tokenizer.json"', "big"), start('"nope/tokenizer.json"', "missing"),
               start('"bad.json"', "bad")]
    too_big, missing, damaged = (done(p) for p in started)
    assert too_big.returncode == 1 and "Traceback" not in too_big.stderr  # 1000 tokens, vocab 512
    assert "the tokenizer has 1000 tokens, more than the model's vocab 512" in too_big.stderr

    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "tokenizer" in missing.stderr and "does not exist" in missing.stderr

    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr
    assert "is not a tokenizers tokenizer.json" in damaged.stderr

    runtime.train_bpe((tmp_path / "corpus.txt").read_bytes(), 500).save(str(tmp_path / "hf" / "tokenizer.json"))
    ok = done(start('"hf/tokenizer.json"', "ok"))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "runs" / "ok" / "tokenizer.json").read_text() == (tmp_path / "hf" / "tokenizer.json").read_text()
