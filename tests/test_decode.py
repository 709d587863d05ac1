"""`axdsl sample`: its options are checked with clean errors, generated text never writes raw
control bytes, and an `axdsl import-hf` output samples directly (`axdsl sample runs/x-hf`), with
greedy tokens equal to transformers' own greedy `generate` for a tiny random Llama.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from axdsl import cli, sampling

MODEL = """import "std/transformer.axl"
model dec_tiny = DecoderLM {
  vocab = 256  dim = 64  layers = 2  heads = 4  kv_heads = 2  ffn = 128  max_seq = 32
  rope_theta = 500000.0  norm = RMSNorm(eps = 1e-5)  dtype = f32  param_dtype = f32
}
"""
HF_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                 rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 tie_word_embeddings=False)


@pytest.mark.parametrize("flag, value, words", [
    ("--temperature", "-1", "--temperature must be a finite number >= 0"),
    ("--temperature", "nan", "--temperature must be a finite number >= 0"),
    ("--top-k", "0", "--top-k must be >= 1"),
    ("--top-p", "0", "--top-p must be in (0, 1]"),
    ("--top-p", "1.5", "--top-p must be in (0, 1]"),
    ("--eos", "-2", "--eos must be a token id >= 0"),
    ("--max-tokens", "-1", "--max-tokens must be >= 0"),
])
def test_bad_sampling_options_are_clean_errors(tmp_path, capsys, flag, value, words):
    assert cli.main(["sample", str(tmp_path), "--prompt", "x", flag, value]) == 1
    err = capsys.readouterr().err
    assert err.startswith("axdsl: error: ") and words in err and "Traceback" not in err


def test_generated_control_bytes_are_escaped():
    assert sampling.printable("a\x1b[31mb\rc\x07\n\td\x7fé") == "a\\x1b[31mb\\rc\\x07\n\td\\x7fé"


def test_top_p_and_top_k_cut_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    picks = {sampling._pick(logits.copy(), sampling.Sampling(1.0, None, 0.7), rng) for _ in range(300)}
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.7: the rest is cut
    picks = {sampling._pick(logits.copy(), sampling.Sampling(1.0, 3, 1.0), rng) for _ in range(300)}
    assert picks == {0, 1, 2}
    assert sampling._pick(logits.copy(), sampling.Sampling(0.0), rng) == 0


def test_sample_from_an_import_hf_dir_matches_transformers_greedy(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from axdsl.hf.importer import import_hf

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG)).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(40.0)  # a peaked head: greedy ties are impossible
    hf.save_pretrained(tmp_path / "hf")
    spec = tmp_path / "dec_tiny.axl"
    spec.write_text(MODEL, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert import_hf(spec, tmp_path / "hf", None, None) == 0, capsys.readouterr().err
    prompt = [5, 17, 99, 3]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                           pad_token_id=0)[0].tolist()
    capsys.readouterr()
    assert cli.main(["sample", "runs/dec_tiny-hf", "--prompt", "5 17 99 3", "--temperature", "0",
                     "--max-tokens", "8"]) == 0
    got = [int(t) for t in capsys.readouterr().out.split()]
    assert got == want
    # --no-cache runs a full forward per token (never the cached path): the same greedy tokens
    def cached(*args, **kwargs):
        raise AssertionError("--no-cache used the KV cache")
        yield

    with monkeypatch.context() as patched:
        patched.setattr(sampling, "generate_cached", cached)
        assert cli.main(["sample", "runs/dec_tiny-hf", "5 17 99 3", "--temperature", "0", "--max-tokens", "8",
                         "--no-cache"]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == want
    # --eos stops right after that token
    assert cli.main(["sample", "runs/dec_tiny-hf/params", "--prompt", "5 17 99 3", "--temperature", "0",
                     "--max-tokens", "8", "--eos", str(want[6])]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == want[:7]


def test_seq2seq_greedy_from_an_import_hf_t5_equals_transformers_generate(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import test_t5
    from axdsl.hf.importer import import_hf

    root = Path(__file__).resolve().parent.parent
    from generated.t5_tiny.cpu import model

    cfg = model.CONFIGS["t5_tiny"]
    hf = test_t5._hf_tiny(cfg)
    hf.config.decoder_start_token_id, hf.config.eos_token_id, hf.config.pad_token_id = 0, 1, 0  # T5's ids
    hf.save_pretrained(tmp_path / "hf")
    monkeypatch.chdir(tmp_path)
    assert import_hf(root / "specs" / "t5_tiny.axl", tmp_path / "hf", "t5_tiny", None) == 0, \
        capsys.readouterr().err
    prompt = [7, 21, 4, 90, 13, 2]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                           decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)[0].tolist()[1:]
    capsys.readouterr()
    assert cli.main(["sample", "runs/t5_tiny-hf", "--prompt", " ".join(map(str, prompt)),
                     "--temperature", "0", "--max-tokens", "10"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("7 21 4 90 13 2 ->")
    assert [int(t) for t in out.split("->")[1].split()] == want
