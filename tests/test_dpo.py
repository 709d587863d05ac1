"""Preference tuning (issue 37 item 2): `objective = dpo(beta = ...)`, `simpo(beta, gamma)` and
`orpo(beta)` over `data = preferences(...)`.

The train block's and `axdsl check`'s errors (more in tests/errors/train_objective_{simpo,orpo}_*);
the rows (each answer's mask on the answer alone, after a multi-turn prompt too); model.py's DPO
loss, metrics and gradients against an independent torch implementation on a tiny model; a run
whose first step is the reference's own (loss ln 2, margin 0: the reference is the initial model),
that logs its metrics and resumes bitwise (the reference is made again from the initial parameters
on a resume). SimPO's and ORPO's loss, metrics and gradients against torch on a bigram model, an
ORPO run that computes no reference, and the throughput of a pair (two sequences).

The data is examples/chat/pairs.jsonl (34 pairs) with the example's ChatML tokenizer.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from axdsl.cli import main
from axdsl.runtime import chat, chat_data
from test_chat_data import EXAMPLE, MODEL, saved_state, train
from test_training import build_package

PREFERENCES = 'preferences("pairs.jsonl", tokenizer = "tokenizer")'
TRAIN = """  optimizer = adamw(lr = 1e-2)  schedule = constant(warmup = 0)  log_every = 1
  checkpoint(every = 2, async = false)
"""


def write_spec(folder: Path, data: str, extra: str = "  objective = dpo(beta = 0.1)\n") -> Path:
    for name in ("pairs.jsonl", "tokenizer"):
        if not (folder / name).exists():
            copy = shutil.copytree if (EXAMPLE / name).is_dir() else shutil.copy
            copy(EXAMPLE / name, folder / name)
    spec = folder / "lm.axl"
    block = f"  batch = 8  seq = 48  steps = 4  eval_every = 0\n  data = {data}\n{extra}"
    spec.write_text(MODEL + f"train {{\n{block}}}\n")
    return spec


@pytest.mark.parametrize(
    "data,extra,expected",
    [
        (
            'chat("pairs.jsonl", tokenizer = "tokenizer")',
            "  objective = dpo()\n",
            "objective dpo reads data `preferences`, not `chat`",
        ),
        (
            PREFERENCES,
            "  objective = dpo(beta = 0)\n",
            "dpo(beta = 0.0) weighs the log-ratios to the reference",
        ),
        (
            'chat("pairs.jsonl", tokenizer = "tokenizer")',
            "  objective = orpo()\n",
            "objective orpo reads data `preferences`, not `chat`",
        ),
        (
            PREFERENCES,
            "",
            "data preferences(...) is for objective = dpo(...), simpo(...) or orpo(...)",
        ),
        (
            'preferences("pairs.jsonl")',
            "  objective = dpo()\n",
            'preferences(...) needs `tokenizer = "..."`',
        ),
    ],
)
def test_the_train_block_checks_dpo(tmp_path, capsys, data, extra, expected):
    spec = write_spec(tmp_path, data, extra)
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"error: {expected}" in err and "hint:" in err, err


def test_check_locates_a_bad_preference_line(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text(
        '{"prompt": "x", "chosen": "a", "rejected": "b"}\n'
        '{"prompt": "x", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"}\n'
    )
    spec = write_spec(tmp_path, 'preferences("bad.jsonl", tokenizer = "tokenizer")')
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"{spec}:8:3: error: preferences data {tmp_path / 'bad.jsonl'}: line 2: "
        '"chosen" holds messages other than assistant ones'
    ), err
    assert (
        'hint: each line is one pair: {"prompt": "...", "chosen": "...", "rejected": "..."}' in err
    )
    assert (main(["check", str(write_spec(tmp_path, PREFERENCES))]), capsys.readouterr().err) == (
        0,
        "",
    )


def test_each_answer_is_masked_alone(tmp_path):
    """The mask marks the answer's content and end-of-turn only, not an assistant turn of the
    prompt; the two rows of a pair share the prompt's tokens."""
    from tokenizers import Tokenizer

    write_spec(tmp_path, PREFERENCES)
    tc = SimpleNamespace(
        data="preferences", data_path="pairs.jsonl", tokenizer="tokenizer", seq=47, eval_every=0
    )
    train_rows, held_out, figures = chat_data.load_preferences(
        SimpleNamespace(vocab=320), tc, str(tmp_path / "lm.axl"), False
    )
    assert figures == {"pairs": 34, "cut": 0} and len(held_out["chosen"]) == 1
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))

    def marked(ids, mask) -> str:
        return tokenizer.decode(
            [int(i) for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False
        )

    rows = {k: np.concatenate([train_rows[k], held_out[k]]) for k in train_rows}
    assert marked(rows["chosen"][0], rows["chosen_mask"][0]) == "2.<|im_end|>"  # 1 + 1?
    assert marked(rows["rejected"][0], rows["rejected_mask"][0]) == "3.<|im_end|>"
    last = -1  # messages: user, assistant "4.", user; then the answers "6." and "7."
    assert marked(rows["chosen"][last], rows["chosen_mask"][last]) == "6.<|im_end|>"
    assert marked(rows["rejected"][last], rows["rejected_mask"][last]) == "7.<|im_end|>"
    prompt = np.flatnonzero(rows["chosen_mask"][last])[0]
    assert (rows["chosen"][last, :prompt] == rows["rejected"][last, :prompt]).all()
    assert chat.answer_mask(np.array([0, 1, 1, 0, 1, 0, 1, 1]), 2).tolist() == [
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        1,
    ]


@pytest.fixture(scope="module")
def tm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dpo")
    write_spec(folder, PREFERENCES, "  objective = dpo(beta = 0.1)\n" + TRAIN)
    return build_package(folder, "lm", (folder / "lm.axl").read_text())


def test_loss_metrics_and_gradients_match_torch(tm):
    """model.py's DPO loss_fn on a batch whose reference is another model: the loss, metrics and
    gradients of a torch implementation of the paper's formula over the same logits (torch's
    gradient of the logits, taken back through forward's vjp)."""
    import jax
    import jax.numpy as jnp

    torch = pytest.importorskip("torch")

    model = __import__(tm.__package__ + ".model", fromlist=["model"])
    cfg = tm.model_config(tm.TRAIN)
    params, other = (model.init_params(cfg, jax.random.key(k)) for k in (0, 1))
    folder = Path(tm.__file__).parents[3]
    rows, _, _ = chat_data.load_preferences(
        SimpleNamespace(vocab=320), tm.TRAIN, str(folder / "lm.axl"), False
    )
    batch = {k: v[:8] for k, v in rows.items()}
    logps = jax.jit(model.sequence_logps, static_argnums=0)
    for side in ("chosen", "rejected"):  # the reference: another model's log-probabilities
        batch[f"ref_{side}"] = np.asarray(logps(cfg, other, batch[side], batch[f"{side}_mask"]))
    (loss, metrics), grads = jax.jit(
        jax.value_and_grad(lambda p: model.loss_fn(cfg, p, batch), has_aux=True)
    )(params)

    tokens = np.concatenate([batch["chosen"], batch["rejected"]])
    mask = np.concatenate([batch["chosen_mask"], batch["rejected_mask"]])
    forward = jax.jit(lambda p: model.forward(cfg, p, jnp.asarray(tokens[:, :-1])))
    logits, pullback = jax.vjp(forward, params)
    x = torch.tensor(np.asarray(logits), dtype=torch.float64, requires_grad=True)
    picked = torch.log_softmax(x, -1).gather(
        -1, torch.tensor(tokens[:, 1:, None], dtype=torch.int64)
    )[..., 0]
    seq = (picked * torch.tensor(mask[:, 1:], dtype=torch.float64)).sum(-1)
    chosen, rejected = seq[:8], seq[8:]
    ref = [torch.tensor(batch[f"ref_{s}"], dtype=torch.float64) for s in ("chosen", "rejected")]
    margin = 0.1 * ((chosen - ref[0]) - (rejected - ref[1]))
    want = -torch.nn.functional.logsigmoid(margin).mean()
    want.backward()
    want, margin, chosen, rejected = (t.detach() for t in (want, margin, chosen, rejected))
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert float(metrics["margin"]) == pytest.approx(float(margin.mean()), rel=1e-4, abs=1e-6)
    assert float(metrics["reward_accuracy"]) == float((margin > 0).double().mean())
    assert float(metrics["chosen_logp"]) == pytest.approx(float(chosen.mean()), rel=1e-5)
    assert float(metrics["rejected_logp"]) == pytest.approx(float(rejected.mean()), rel=1e-5)
    assert 0 < float(metrics["reward_accuracy"]) < 1  # the check above compares a real mix
    expected = pullback(jnp.asarray(x.grad.numpy(), jnp.float32))[0]
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


def test_a_dpo_run_starts_at_the_reference_and_resumes_bitwise(tm, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(tm, whole, 4)
    train(tm, halves, 2)
    train(tm, halves, 4)  # resumes from step 2: the reference is the initial model again
    assert saved_state(halves, 4) == saved_state(whole, 4)
    steps = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    first = steps[0]
    assert first["step"] == 1 and first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["margin"] == 0.0 and first["reward_accuracy"] == 0.0  # policy == reference
    assert {"chosen_logp", "rejected_logp"} <= set(first) and first["chosen_logp"] < 0
    assert any(s["margin"] != 0.0 for s in steps[1:])
    info = json.loads((whole / "run.json").read_text())
    assert info["data"] == {"pairs": 34, "cut": 0} and set(info["identity"]["data"]) == {
        "data_path",
        "tokenizer",
    }


def test_dpo_with_lora_takes_the_base_without_adapters_as_the_reference(tmp_path):
    """Under LoRA the reference is the frozen base (B starts at zero: step 1 is ln 2 with margin
    0); only the adapters move."""
    lora = TRAIN + '  lora(rank = 2, alpha = 4.0, targets = "blocks/*/attn/w[qv]")\n'
    write_spec(tmp_path, PREFERENCES, "  objective = dpo(beta = 0.1)\n" + lora)
    lm = build_package(tmp_path, "lm", (tmp_path / "lm.axl").read_text())
    train(lm, tmp_path / "run", 4)
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6) and first["margin"] == 0.0
    start, end = saved_state(tmp_path / "run", 2), saved_state(tmp_path / "run", 4)
    assert all(start[k] == end[k] for k in start if k.startswith("['params']"))
    assert any(start[k] != end[k] for k in start if k.startswith("['lora']"))


@pytest.fixture(scope="module")
def pair_models(tmp_path_factory):
    """model.py of the test model under simpo and under orpo (built; their train.py not imported),
    and 8 pairs of the example's rows."""
    from axdsl.build import build_files
    from tests.targets_util import import_model

    folder = tmp_path_factory.mktemp("pairs")
    models = {}
    for objective in ("simpo(beta = 2.0, gamma = 0.5)", "orpo(beta = 0.1)"):
        spec = write_spec(folder, PREFERENCES, f"  objective = {objective}\n")
        name = objective.split("(")[0]
        models[name] = import_model(build_files(spec, "cpu"), folder / name)
    tc = SimpleNamespace(
        data="preferences", data_path="pairs.jsonl", tokenizer="tokenizer", seq=47, eval_every=0
    )
    rows, _, _ = chat_data.load_preferences(
        SimpleNamespace(vocab=320), tc, str(folder / "lm.axl"), False
    )
    return models, {k: v[:8] for k, v in rows.items()}


def torch_pair_loss(name: str, table, batch: dict):
    """The paper's loss and metrics of `name` in torch over a bigram model (logits = table[token]),
    written from the formulas: SimPO -log sigmoid(2 * (c / |c| - r / |r|) - 0.5); ORPO the chosen
    answers' token-mean NLL - 0.1 * log sigmoid(log odds(c / |c|) - log odds(r / |r|))."""
    import torch

    def answer_logps(side: str):
        tokens = torch.tensor(batch[side], dtype=torch.int64)
        mask = torch.tensor(batch[f"{side}_mask"][:, 1:], dtype=torch.float64)
        logp = torch.log_softmax(table[tokens[:, :-1]], -1).gather(-1, tokens[:, 1:, None])[..., 0]
        return (logp * mask).sum(-1), mask.sum(-1)

    (chosen, n_chosen), (rejected, n_rejected) = answer_logps("chosen"), answer_logps("rejected")
    mean_c, mean_r = chosen / n_chosen, rejected / n_rejected
    if name == "simpo":
        margin = 2.0 * (mean_c - mean_r)
        loss = -torch.nn.functional.logsigmoid(margin - 0.5).mean()
        extra = {}
    else:
        odds = (mean_c - mean_r) - (
            torch.log1p(-torch.exp(mean_c)) - torch.log1p(-torch.exp(mean_r))
        )
        nll = -chosen.sum() / n_chosen.sum()
        loss = nll - 0.1 * torch.nn.functional.logsigmoid(odds).mean()
        margin = 0.1 * (mean_c - mean_r)
        extra = {"nll": nll, "log_odds": odds.mean()}
    return loss, {
        "margin": margin.mean(),
        "reward_accuracy": (margin > 0).double().mean(),
        "chosen_logp": chosen.mean(),
        "rejected_logp": rejected.mean(),
        **extra,
    }


@pytest.mark.parametrize("name", ["simpo", "orpo"])
def test_reference_free_losses_and_gradients_match_torch(pair_models, monkeypatch, name):
    """model.py's SimPO and ORPO loss_fn (over its own sequence_logps) with a bigram model as the
    forward: the loss, every metric and the gradient equal torch's from the papers' formulas; the
    batch holds no reference log-probabilities."""
    import jax
    import jax.numpy as jnp

    torch = pytest.importorskip("torch")

    models, batch = pair_models
    model = models[name]
    monkeypatch.setattr(model, "forward", lambda cfg, params, tokens: params["table"][tokens])
    table = np.random.default_rng(0).normal(0, 2, (320, 320)).astype(np.float32)
    loss_and_grad = jax.jit(
        jax.value_and_grad(lambda p: model.loss_fn(None, p, batch), has_aux=True)
    )
    (loss, metrics), grads = loss_and_grad({"table": jnp.asarray(table)})

    x = torch.tensor(table, dtype=torch.float64, requires_grad=True)
    want, expected = torch_pair_loss(name, x, batch)
    want.backward()
    want, expected = want.detach(), {k: v.detach() for k, v in expected.items()}
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert set(metrics) == {"loss", *expected}
    for k, v in expected.items():
        assert float(metrics[k]) == pytest.approx(float(v), rel=1e-4, abs=1e-6), k
    assert 0 < float(metrics["reward_accuracy"]) < 1  # the check above compares a real mix
    np.testing.assert_allclose(np.asarray(grads["table"]), x.grad.numpy(), rtol=1e-4, atol=1e-7)


def test_orpo_log_odds_stay_finite_when_the_model_is_sure(pair_models):
    """log(p / (1 - p)) from log p: exact at p = 1/4, and finite with a finite gradient at p = 1
    (an answer the model predicts with certainty), where log(1 - p) would be -inf."""
    import jax

    log_odds = pair_models[0]["orpo"].log_odds
    assert float(log_odds(np.log(np.float32(0.25)))) == pytest.approx(math.log(1 / 3), rel=1e-6)
    value, slope = jax.value_and_grad(log_odds)(np.float32(0.0))
    assert np.isfinite(value) and np.isfinite(slope) and value > 13  # p held at 1 - 1e-6


def test_a_preference_pair_is_two_sequences_of_throughput(tmp_path):
    """tokens/s, TFLOP/s and the summary count a pair's chosen and rejected rows: 2 x seq tokens a
    row of the batch, where a row of chat data is one sequence."""
    from axdsl.runtime import metrics

    flops = metrics.ModelFlops(1e6, ())
    for data, sequences in (("preferences", 2), ("chat", 1)):
        tc = SimpleNamespace(
            seq=48, batch=8, steps=1, log_every=1, max_bad_steps=3, data=data, checkpoint_dir="ckpt"
        )
        (tmp_path / data).mkdir()
        log = metrics.MetricsLog(
            SimpleNamespace(out=tmp_path / data, no_progress=True), tc, 0, flops, 1e15
        )
        log.step(
            1, {"loss": 0.5, "grad_norm": 1.0, "lr": 0.1, "ok": True, "bad_steps": 0}, rate=2.0
        )
        log.close(summary=False)
        row = json.loads((tmp_path / data / "metrics.jsonl").read_text())
        assert row["tokens_per_s"] == 2.0 * 8 * 48 * sequences
        assert row["tflops_per_device"] == pytest.approx(
            2.0 * 1e6 * 8 * 48 * sequences / jax_devices() / 1e12
        )
        assert f"{8 * 48 * sequences:,} tokens" in log.summary()


def jax_devices() -> int:
    import jax

    return jax.device_count()


def test_an_orpo_run_logs_its_metrics_without_a_reference(tmp_path):
    """train.py for orpo loads the pairs and computes no reference log-probabilities (no frozen
    pass); its steps and evaluations log the loss and every metric of loss_fn."""
    quick = TRAIN.replace("checkpoint(every = 2, async = false)", "checkpoint(every = 0)")
    spec = write_spec(tmp_path, PREFERENCES, "  objective = orpo(beta = 0.1)\n" + quick)
    spec.write_text(spec.read_text().replace("eval_every = 0", "eval_every = 2"))
    tm = build_package(tmp_path, "lm", spec.read_text())
    source = Path(tm.__file__).read_text()
    assert "with_reference" not in source and "initial_params" not in source
    assert "orpo is reference-free: no reference log-probabilities" in source
    train(tm, tmp_path / "run", 2)
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    stats = {"reward_accuracy", "margin", "chosen_logp", "rejected_logp", "nll", "log_odds"}
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(stats <= set(r) for r in steps)
    assert steps[0]["loss"] > steps[0]["nll"] > 0 and steps[0]["chosen_logp"] < 0
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2] and {f"eval_{k}" for k in stats} <= set(evals[0])
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["data"] == {"pairs": 34, "cut": 0}
