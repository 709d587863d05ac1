"""`axdsl eval` against transformers: a tiny random Llama with a byte-level BPE tokenizer is saved
with save_pretrained, imported with import-hf, and evaluated in-process through the command line;
each score is recomputed directly with transformers (PyTorch on CPU) from the same tokenizer:
per-choice log-likelihoods (1e-4), acc and acc_norm, perplexity and bits per byte, and greedy
generation against `generate`. Then every bad input is a located error, never a traceback.
"""

from __future__ import annotations

import json
import re
import math
import os
from pathlib import Path

import numpy as np
import pytest

from axdsl.cli import main

ROOT = Path(__file__).resolve().parent.parent
SPEC = """import "std/transformer.axl"

model eval_tiny = DecoderLM {
  vocab = 320  dim = 32  layers = 2  heads = 4  kv_heads = 2  ffn = 64  max_seq = 32
  rope_theta = 10000.0  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}
"""
HF_CONFIG = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                 rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
CHOICES = [  # a trailing space moves to the continuation; an empty context is scored after BOS
    {"context": "The cat sat on the", "choices": ["mat", "moon", "idea of a"], "gold": 0},
    {"context": "Two plus two is ", "choices": ["four", "five"], "gold": 1},
    {"context": "", "choices": ["hello world", "x"], "gold": 0},
    {"context": "def f(x):\n    return", "choices": ["x", "None", "x * x"], "gold": 2, "delimiter": ""},
]


def _tokenizer(path: Path):
    """A byte-level BPE of 300 ids (<s> 0, </s> 1) trained on the README, saved at `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((ROOT / "README.md").read_text().splitlines(), trainer)
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(project dir, import-hf output, the transformers model, the tokenizer), built once."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from axdsl import hf as axhf

    root = tmp_path_factory.mktemp("eval")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG)).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)  # peaked enough that the choices differ clearly
        model.save_pretrained(root / "hf")
        tok = _tokenizer(root / "hf" / "tokenizer.json")
        (root / "m.axl").write_text(SPEC)
        assert axhf.import_hf(Path("m.axl"), Path("hf"), None, Path("runs/m-hf/params")) == 0
        yield root, root / "runs" / "m-hf", model, tok
    finally:
        os.chdir(cwd)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _eval(root: Path, *argv: str) -> int:
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return main(["eval", *argv])
    finally:
        os.chdir(cwd)


def _loglik(model, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context) from transformers, in float64 from its float32 logits."""
    import torch

    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return sum(float(logp[len(context) - 1 + i, t]) for i, t in enumerate(continuation))


def _pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's _encode_pair with the tokenizers library."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False).ids
    ctx = tok.encode(context, add_special_tokens=False).ids
    return ctx or [HF_CONFIG["bos_token_id"]], whole[len(ctx):]


TEXT = "Perplexity in windows: every token is predicted once, ünïcode too.\n" * 3
PROMPTS = ["The model", "def main(", "axdsl eval"]


def _hf_greedy(model, tok, prompt: str, n: int) -> list[int]:
    import torch

    ids = tok.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return gen[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def evaluated(imported):
    """One `axdsl eval` of the import on the three kinds of task (one load, one jit per bucket;
    --batch 3 splits the choices' rows over batches): (results by task, table, HF's greedy ids)."""
    import contextlib
    import io

    root, out, model, tok = imported
    _write_jsonl(root / "mc.jsonl", CHOICES)
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    outputs = [_hf_greedy(model, tok, p, 6) for p in PROMPTS]
    texts = [tok.decode(o) for o in outputs]
    stop = texts[1][len(texts[1]) // 2:] or "\n"  # cut the second output at its second half
    _write_jsonl(root / "gen.jsonl", [
        {"prompt": PROMPTS[0], "answer": f" {texts[0]}  "},
        {"prompt": PROMPTS[1], "answer": texts[1][: texts[1].find(stop)], "until": [stop]},
        {"prompt": PROMPTS[2], "answer": texts[2] + "not it"}])
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        argv = ["--task", "mc.jsonl", "--task", "text.txt", "--task", "gen.jsonl"]
        assert _eval(root, str(out), *argv, "--max-tokens", "6", "--batch", "3") == 0
    results = {n: json.loads((out / "evals" / f"{n}.json").read_text()) for n in ("mc", "text", "gen")}
    return results, shown.getvalue(), outputs


def test_multiple_choice_matches_transformers(imported, evaluated):
    _, _, model, tok = imported
    results, table, _ = evaluated
    result = results["mc"]
    acc = acc_norm = 0
    for item, got in zip(CHOICES, result["items"], strict=True):
        delimiter = item.get("delimiter", " ")
        ref = [_loglik(model, *_pair(tok, item["context"], delimiter + c)) for c in item["choices"]]
        np.testing.assert_allclose(got["loglikelihoods"], ref, atol=1e-4, rtol=0)
        acc += int(np.argmax(ref) == item["gold"])
        acc_norm += int(np.argmax(np.array(ref) / [len(c) for c in item["choices"]]) == item["gold"])
    assert result["metrics"] == {"acc": acc / 4, "acc_norm": acc_norm / 4}
    assert 0 < acc < 4 or 0 < acc_norm < 4  # the task tells right from wrong: not all one way
    assert re.search(rf"mc.jsonl +acc +{acc / 4:.4f} +4\n", table), table


def test_perplexity_and_bits_per_byte_match_transformers(imported, evaluated):
    import torch

    _, _, model, tok = imported
    result = evaluated[0]["text"]
    ids = [HF_CONFIG["bos_token_id"]] + tok.encode(TEXT, add_special_tokens=False).ids
    nats, window = 0.0, 32
    for start in range(0, len(ids) - 1, window):  # disjoint windows of the model's max_seq
        chunk = ids[start:start + window + 1]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([chunk[:-1]])).logits[0].double(), -1)
        nats -= float(logp[torch.arange(len(chunk) - 1), torch.tensor(chunk[1:])].sum())
    tokens = len(ids) - 1
    assert result["windows"] > 2 and result["n"] == tokens
    assert result["metrics"]["perplexity"] == pytest.approx(math.exp(nats / tokens), rel=1e-5)
    bpb = nats / (math.log(2) * len(TEXT.encode("utf-8")))
    assert result["metrics"]["bits_per_byte"] == pytest.approx(bpb, rel=1e-5)


def test_greedy_exact_match_matches_transformers_generate(evaluated):
    results, _, outputs = evaluated
    result = results["gen"]
    assert [i["exact_match"] for i in result["items"]] == [True, True, False]
    assert result["items"][0]["ids"] == outputs[0] and result["items"][2]["ids"] == outputs[2]
    assert result["metrics"]["exact_match"] == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- errors


BAD = {
    "json.jsonl": ('{"context": "a", "choices": ["b"], "gold": 0}\n{"context": \n', ":2: error: not JSON"),
    "gold.jsonl": ('{"context": "a", "choices": ["b", "c"], "gold": 2}\n', ":1: error: gold 2 is out of range"),
    "empty.jsonl": ('\n{"context": "a", "choices": [], "gold": 0}\n', ":2: error: choices is empty"),
    "kind.jsonl": ('{"question": "a"}\n', ':1: error: not a task item: an object with "question"'),
    "until.jsonl": ('{"prompt": "a", "answer": "b", "until": [""]}\n', ":1: error: until must be"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_task_lines_are_located(name, tmp_path, capsys):
    content, expected = BAD[name]
    (tmp_path / name).write_text(content)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "import.json").write_text("{}")  # never read: the tasks are checked first
    assert main(["eval", str(tmp_path / "run"), "--task", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / name}{expected}" in err and "\n  hint: " in err, err
    assert "Traceback" not in err


def test_text_that_is_not_utf8_is_located(tmp_path, capsys):
    (tmp_path / "t.txt").write_bytes(b"line one\nsecond \xff line\n")
    assert main(["eval", str(tmp_path), "--task", str(tmp_path / "t.txt")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 't.txt'}:2: error: not UTF-8 text: byte 0xff at offset 16" in err


def test_a_directory_that_is_not_a_run(tmp_path, capsys):
    task = _write_jsonl(tmp_path / "t.jsonl", [CHOICES[0]])
    assert main(["eval", str(tmp_path), "--task", str(task)]) == 1
    assert "is not a run: it has no run.json nor import.json" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope"), "--task", str(task)]) == 1
    assert "nope does not exist" in capsys.readouterr().err


def test_a_results_file_the_user_wrote_is_never_replaced(tmp_path, capsys):
    task = _write_jsonl(tmp_path / "t.jsonl", [CHOICES[0]])
    (tmp_path / "import.json").write_text("{}")
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "t.json").write_text('{"mine": 1}')
    assert main(["eval", str(tmp_path), "--task", str(task)]) == 1
    assert "was not written by axdsl eval: not replacing it" in capsys.readouterr().err
    assert (tmp_path / "evals" / "t.json").read_text() == '{"mine": 1}'



def test_eval_needs_a_task(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "runs/x"])
    assert exc.value.code == 2 and "--task" in capsys.readouterr().err
