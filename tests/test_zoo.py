"""The model zoo: published parameter counts, active parameters of the MoE models, model FLOPs,
`axdsl stats`, and Mixtral as a few-line change of Mistral."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from axdsl.analysis.flops import param_count
from axdsl.pipeline import compile_spec
from axdsl.stats import active_params, model_stats

ROOT = Path(__file__).resolve().parent.parent

# Published totals (papers, model cards; Hugging Face's num_parameters() for the same configs).
PUBLISHED = {
    "gemma2_2b": 2_614_341_888,
    "gemma3_1b": 999_885_952,  # transformers' Gemma3ForCausalLM for google/gemma-3-1b-pt's config
    "gpt2_small": 124_439_808,
    "gpt2_medium": 354_823_168,
    "llama2_7b": 6_738_415_616,
    "llama3_8b": 8_030_261_248,
    "llama3_1_8b": 8_030_261_248,  # Llama 3 8B's weights' shapes; only the rope scaling differs
    "llama3_2_1b": 1_235_814_400,  # tied head
    "mamba2_2_7b": 2_702_599_680,  # transformers' Mamba2ForCausalLM (tied) for state-spaces/mamba2-2.7b's config
    "mistral_7b": 7_241_732_096,
    "phi2": 2_779_683_840,
    "pythia_1_4b": 1_414_647_808,
    "qwen2_5_7b": 7_615_616_512,
    "mixtral_8x7b": 46_702_792_704,
    "qwen3_30b_a3b": 30_532_122_624,
    # transformers' num_parameters() of DeepseekV3ForCausalLM (no MTP layer). The 58 x 256
    # e_score_correction_bias values, a buffer there, are stored as parameters here but are
    # balancing state, not trained: `stats` counts them apart (test below).
    "deepseek_v3": 671_026_404_352,
    # transformers' BertForMaskedLM(BertConfig()) (bert-base-uncased): the decoder is tied to the
    # word embedding and has its own bias; no pooler. position_ids and token_type_ids are buffers.
    "bert_base": 109_514_298,

    # transformers' ViTForImageClassification(ViTConfig(num_labels=1000)) (google/vit-base-patch16-224):
    # no pooler; the patch conv, class token and position embeddings are parameters, no buffers.
    "vit_base": 86_567_656,

    # google/flan-t5-base: 247,577,856 with its own lm_head (the checkpoint stores it apart from
    # `shared`). transformers 5's T5Config forces tie_word_embeddings = True, so a freshly built
    # T5ForConditionalGeneration counts 222,903,552 (32,128 x 768 fewer) until from_pretrained
    # loads a distinct lm_head and unties it (tests/test_t5.py checks both).
    "t5_base": 247_577_856,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_equal_the_published_figures(name, in_root):
    model = compile_spec(Path(f"specs/{name}.axl")).models[0]
    assert model.name == name
    assert param_count(model).trained == PUBLISHED[name]


def test_every_zoo_spec_has_a_tiny_variant_made_by_extends(in_root):
    for name in PUBLISHED:
        models = compile_spec(Path(f"specs/{name}.axl")).models
        tiny = [m for m in models[1:] if "tiny" in m.name]
        own = Path(f"specs/{name.split('_')[0]}_tiny.axl")  # a tiny variant with its own train block
        if not tiny and own.exists() and f"extends {name}" in own.read_text():
            tiny = compile_spec(own).models
        assert tiny, f"{name} has no tiny variant"
        assert param_count(tiny[0]).total < 10_000_000
    assert "extends mixtral_8x7b" in Path("specs/mixtral_8x7b.axl").read_text()


def test_active_parameters_of_the_mixture_of_experts_models(in_root):
    mixtral = compile_spec(Path("specs/mixtral_8x7b.axl")).models[0]
    # Mistral AI: "12.9B active parameters"; exactly: everything but 6 of 8 experts per layer.
    experts = 32 * 8 * 3 * 4096 * 14336
    assert active_params(mixtral) == PUBLISHED["mixtral_8x7b"] - experts * 6 // 8 == 12_879_925_248
    qwen = compile_spec(Path("specs/qwen3_30b_a3b.axl")).models[0]
    assert active_params(qwen) == 3_353_032_704  # Qwen: "3.3B activated"
    dense = compile_spec(Path("specs/mistral_7b.axl")).models[0]
    assert active_params(dense) == PUBLISHED["mistral_7b"]


def test_training_flops_follow_maxtexts_formula_for_a_dense_and_an_moe_model(in_root):
    m = compile_spec(Path("specs/mistral_7b.axl")).models[0]
    seq, emb, mlp, hq, hkv, hd, vocab, layers = 4096, 4096, 14336, 32, 8, 128, 32000, 32
    ffn = 2 * mlp * emb * 2 + 2 * mlp * emb
    qkv = 2 * emb * (hq + 2 * hkv) * hd
    out = 2 * emb * hq * hd
    attn = 4 * min(seq, 4096) * hq * hd / 2  # causal, window 4096 covers the whole sequence
    per_token = 3 * (layers * (ffn + qkv + out + attn) + 2 * emb * vocab)
    assert model_stats(m, seq, batch=1).flops_per_token == per_token
    moe = compile_spec(Path("specs/mixtral_8x7b.axl")).models[0]
    routed = 3 * layers * (2 * 2 * (3 * emb * mlp) + 2 * emb * 8)  # top-2 SwiGLU experts + router
    dense_part = 3 * (layers * (qkv + out + attn) + 2 * emb * vocab)
    assert model_stats(moe, seq, batch=1).flops_per_token == dense_part + routed


def _changed_lines(a: str, b: str) -> int:
    """Lines a reviewer sees changed: a replaced line counts once, an added or removed line once."""
    sm = difflib.SequenceMatcher(None, a.splitlines(), b.splitlines())
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal")


def test_mixtral_is_mistral_with_at_most_ten_changed_lines(in_root):
    mistral = Path("specs/mistral_7b.axl").read_text()
    mixtral = Path("specs/mixtral_8x7b.axl").read_text()
    changed = _changed_lines(mistral, mixtral)
    assert 0 < changed <= 10, changed
    assert "MoE(" in mixtral and "MoE(" not in mistral


def test_stats_command(in_root):
    r = subprocess.run([sys.executable, "-m", "axdsl", "stats", "specs/mixtral_8x7b.axl", "-t", "gpu-h100-8",
                        "--model", "mixtral_8x7b"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "46,702,792,704 total" in r.stdout and "12,879,925,248 active per token" in r.stdout
    assert "optimizer state" in r.stdout and "of 79.11 GiB HBM" in r.stdout  # what CUDA reports
    code = ("import sys; from pathlib import Path; from axdsl import stats; "
            "stats.run(Path('specs/qwen3_30b_a3b.axl'), 'tpu-v5e-256'); assert 'jax' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([sys.executable, "-m", "axdsl", "stats", "specs/mixtral_8x7b.axl", "--model", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no model `nope`" in r.stderr and not r.stdout  # errors go to stderr


def test_balancing_biases_are_counted_apart_from_the_trained_parameters(in_root, capsys):
    """DeepSeek-V3's selection biases are stored (memory counts them) but moved by the balancing
    rule, not the optimizer: stats' parameter total is what is trained, and they are named apart."""
    from axdsl import stats

    count = param_count(compile_spec(Path("specs/deepseek_v3.axl")).models[0])
    assert count.balancing == 58 * 256 and count.total == count.trained + 58 * 256
    stats.run(Path("specs/deepseek_v3.axl"), "cpu")
    out = capsys.readouterr().out
    assert "671,026,404,352 total" in out and "+ state           14,848 MoE selection biases" in out
    assert param_count(compile_spec(Path("specs/mixtral_8x7b.axl")).models[0]).balancing == 0


NEW_FAMILIES = ["gemma2_2b", "gemma3_1b", "llama3_1_8b", "llama3_2_1b", "phi2", "pythia_1_4b", "qwen2_5_7b"]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_each_family_builds_for_every_target_and_its_tiny_model_trains(name, tmp_path, in_root):
    """cpu and gpu-h100 are committed (test_golden); tpu-v5e must build too. The tiny variant's
    generated cpu code runs a forward and a gradient step with finite values."""
    import jax
    import jax.numpy as jnp

    from axdsl.build import build_files
    from tests.targets_util import import_generated

    assert "model.py" in build_files(Path(f"specs/{name}.axl"), "tpu-v5e")
    model, _ = import_generated(Path(f"specs/{name}.axl"), "cpu", tmp_path)
    tiny = next(n for n in model.CONFIGS if "tiny" in n)
    cfg = model.CONFIGS[tiny]
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, cfg.vocab)
    loss, grads = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0])(params)
    assert bool(jnp.isfinite(loss)) and abs(float(loss) - np.log(cfg.vocab)) < 2.0
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", ["deepseek_v3", "mamba2_2_7b", "t5_base"])
def test_deepseek_mamba_and_t5_build_for_tpu_v5e(name, in_root):
    """Their cpu and gpu-h100 outputs are committed; their training is tested in test_deepseek.py
    and test_mamba.py (T5's numerics against transformers in test_t5.py)."""
    from axdsl.build import build_files

    assert "model.py" in build_files(Path(f"specs/{name}.axl"), "tpu-v5e")
