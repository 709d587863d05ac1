"""Chat data in a train block (issue 37 item 1): `data = chat("x.jsonl", tokenizer = DIR,
train_on = ...)`. The train block's checks and `axdsl check`'s located errors on the file; the rows
the trainer makes (one conversation a row, the loss mask of encode_chat, cuts counted); model.py's
loss_fn on the marked labels only, and train.py's micro-batches weighed by their marked labels
(the same step as one batch); a run that trains, records its data and resumes bitwise, and refuses
to resume on another file; LoRA on chat data.

The data is examples/chat (40 conversations, a 320-token ChatML tokenizer). Everything runs in
this process on a one-layer model; the training tests compile one small step each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from axdsl.cli import main
from axdsl.runtime import chat, chat_data
from test_training import build_package

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat"
MODEL = """import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 320  dim = 16  layers = 1  heads = 2  kv_heads = 1  ffn = 32  max_seq = 48  dtype = f32
}
"""


def write_spec(folder: Path, data: str, extra: str = "") -> Path:
    """lm.axl in `folder` beside a copy of the example's data, reading `data`."""
    for name in ("conversations.jsonl", "tokenizer"):
        if not (folder / name).exists():
            copy = shutil.copytree if (EXAMPLE / name).is_dir() else shutil.copy
            copy(EXAMPLE / name, folder / name)
    spec = folder / "lm.axl"
    spec.write_text(
        MODEL + f"train {{\n  batch = 8  seq = 48  steps = 4  eval_every = 0\n  data = {data}\n{extra}}}\n"
    )
    return spec


CHAT = 'chat("conversations.jsonl", tokenizer = "tokenizer")'


# ----------------------------------------------------------------------------- the train block


@pytest.mark.parametrize("data,expected", [
    ('chat("conversations.jsonl")', 'chat(...) needs `tokenizer = "..."`'),
    ('chat(tokenizer = "tokenizer")', "chat(...) takes one path string"),
    ('chat("c.jsonl", tokenizer = "tokenizer", train_on = "users")',
     'chat(train_on = "users") is "assistant" or "all"'),
    ('chat("c.jsonl", tokenizer = "tokenizer", train = "all")', "chat(...) has no option `train`"),
])
def test_the_train_block_checks_the_chat_call(tmp_path, capsys, data, expected):
    spec = write_spec(tmp_path, data)
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:8:3: error: {expected}" in err and "hint:" in err, err


def test_chat_data_is_for_next_token(tmp_path, capsys):
    spec = write_spec(tmp_path, CHAT, "  objective = masked_lm(mask_token = 4)\n")
    assert main(["check", str(spec)]) == 1
    assert "objective masked_lm reads data" in capsys.readouterr().err


# ----------------------------------------------------------------------------- axdsl check


@pytest.mark.parametrize("lines,expected", [
    (['{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', '{"messages": ['],
     "line 2: not JSON"),
    (['{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}'],
     "line 1, message 1: unknown role 'robot' (the roles are system, user, assistant, tool)"),
    (['', '{"messages": [{"role": "user", "content": "only a question"}]}'],
     "line 2: no assistant message (nothing for the model to learn)"),
])
def test_check_locates_a_bad_chat_file_at_the_data_line(tmp_path, capsys, lines, expected):
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    spec = write_spec(tmp_path, 'chat("bad.jsonl", tokenizer = "tokenizer")')
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{spec}:8:3: error: chat data {tmp_path / 'bad.jsonl'}: {expected}"), err
    assert '  hint: each line is one conversation: {"messages": [{"role": "user"' in err


def test_check_refuses_a_tokenizer_without_a_chat_template(tmp_path, capsys):
    (tmp_path / "base").mkdir()
    shutil.copy(EXAMPLE / "tokenizer" / "tokenizer.json", tmp_path / "base")
    spec = write_spec(tmp_path, 'chat("conversations.jsonl", tokenizer = "base/tokenizer.json")')
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:8:3: error: the tokenizer in {tmp_path / 'base'} has no chat template" in err, err
    spec = write_spec(tmp_path, 'chat("conversations.jsonl", tokenizer = "nowhere")')
    assert main(["check", str(spec)]) == 1
    assert "error: tokenizer 'nowhere' is not a tokenizer.json nor a directory holding one" in capsys.readouterr().err
    spec = write_spec(tmp_path, CHAT)
    assert (main(["check", str(spec)]), capsys.readouterr().err) == (0, "")


@pytest.mark.parametrize("template, expected", [
    ("{% if %}", "does not compile: line 1 of the template: syntax error"),
    ("{% for m in messages %}\n{{ m.content / 0 }}{% endfor %}",
     "line 1: the chat template of {folder} fails: line 2 of the template: TypeError"),
])
def test_check_compiles_the_template_and_renders_the_first_conversation(tmp_path, capsys, template, expected):
    spec = write_spec(tmp_path, CHAT)
    (tmp_path / "tokenizer" / "chat_template.jinja").write_text(template)
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:8:3: error: " in err and expected.format(folder=tmp_path / "tokenizer") in err, err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------- the rows


def load(folder: Path, seq: int, train_on: str = "assistant", eval_every: int = 0):
    tc = SimpleNamespace(data_path="conversations.jsonl", tokenizer="tokenizer", train_on=train_on, seq=seq,
                         eval_every=eval_every)
    return chat_data.load_chat(SimpleNamespace(vocab=320), tc, str(write_spec(folder, CHAT)), False, folder / "run")


def test_rows_hold_one_conversation_each_with_encode_chats_mask(tmp_path, capsys):
    from tokenizers import Tokenizer

    train, held_out, figures = load(tmp_path, 23)  # rows of 24 tokens
    folder = tmp_path / "tokenizer"
    template, special = chat.load_template(folder), chat.load_special_tokens(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    lines = [json.loads(line)["messages"] for line in (tmp_path / "conversations.jsonl").read_text().splitlines()]
    rows = {k: np.concatenate([train[k], held_out[k]]) for k in train}
    assert rows["tokens"].shape == rows["loss_mask"].shape == (40, 24) and len(held_out["tokens"]) == 1
    cut = 0
    for r, messages in enumerate(lines):  # in file order, padded with id 0 and mask 0
        ids, mask = chat.encode_chat(messages, tokenizer, template, special)
        n = min(len(ids), 24)
        cut += len(ids) > 24
        assert rows["tokens"][r, :n].tolist() == ids[:n].tolist() and not rows["tokens"][r, n:].any()
        assert rows["loss_mask"][r, :n].tolist() == mask[:n].tolist() and not rows["loss_mask"][r, n:].any()
    assert 0 < cut == figures["cut"] and figures["conversations"] == figures["rows"] == 40
    assert figures["loss_tokens"] == int(rows["loss_mask"][:, 1:].sum())
    assert f"{cut} longer than seq + 1 = 24 tokens were cut" in capsys.readouterr().err
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    everything = load(tmp_path, 23, "all")[2]
    assert everything["loss_tokens"] == int((rows["tokens"][:, 1:] != 0).sum()) > figures["loss_tokens"]


def test_the_trainer_names_the_bad_line(tmp_path):
    (tmp_path / "conversations.jsonl").write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(SystemExit) as stop:
        load(tmp_path, 47)
    assert str(stop.value.code).startswith(f"error: chat data {tmp_path / 'conversations.jsonl'}: line 1: no assistant")


def test_the_trainer_names_the_line_a_template_fails_on(tmp_path):
    write_spec(tmp_path, CHAT)
    (tmp_path / "tokenizer" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content }}{% if m.content == 'Hi' %}{{ 1/0 }}{% endif %}{% endfor %}"
    )
    path = tmp_path / "conversations.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x"}]})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as stop:
        load(tmp_path, 47)
    assert str(stop.value.code) == (
        f"error: data {path}, line 3: the chat template of {tmp_path / 'tokenizer'} fails: "
        "line 1 of the template: ZeroDivisionError: division by zero"
    )


# ----------------------------------------------------------------------------- the loss


TRAIN = """  optimizer = adamw(lr = 1e-2)  schedule = constant(warmup = 0)  log_every = 1
  checkpoint(every = 2, async = false)
"""


@pytest.fixture(scope="module")
def tm(tmp_path_factory):
    """The generated train.py of the test spec over chat data (module: its jitted steps are shared)."""
    folder = tmp_path_factory.mktemp("chat")
    write_spec(folder, CHAT, TRAIN)
    return build_package(folder, "lm", (folder / "lm.axl").read_text())


def batch_of(tm, rows: slice = slice(0, 8)) -> dict[str, np.ndarray]:
    folder = Path(tm.__file__).parents[3]
    train, _, _ = chat_data.load_chat(SimpleNamespace(vocab=320), tm.TRAIN, str(folder / "lm.axl"), False)
    return {k: v[rows] for k, v in train.items()}


def reference_loss(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray, z_loss: float) -> float:
    """Mean cross-entropy (+ z-loss) over the marked labels, in float64 numpy."""
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    ce = lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return float(((ce + z_loss * lse**2) * mask).sum() / mask.sum())


def test_loss_fn_takes_the_mean_over_the_marked_labels(tm):
    import jax
    import jax.numpy as jnp

    model = __import__(tm.__package__ + ".model", fromlist=["model"])
    cfg = tm.model_config(tm.TRAIN)
    params = model.init_params(cfg, jax.random.key(0))
    batch = batch_of(tm)
    tokens, mask = batch["tokens"], batch["loss_mask"]
    x = jax.jit(model.decoder_lm_hidden, static_argnums=0)(cfg, params, tokens[:, :-1])
    head = lambda p, h: model.decoder_lm_head(cfg, p, h)  # noqa: E731
    hp = {k: params[k] for k in model.HEAD_PARAMS}
    logits = np.asarray(head(hp, x))  # forward's logits: its body, then its head
    loss_fn = jax.jit(model.loss_fn, static_argnums=(0, 4))
    for z in (0.0, 1e-2):
        loss, ce = loss_fn(cfg, params, tokens, mask, z)
        assert float(loss) == pytest.approx(reference_loss(logits, tokens[:, 1:], mask[:, 1:], z), rel=1e-5)
        assert float(ce) == pytest.approx(reference_loss(logits, tokens[:, 1:], mask[:, 1:], 0.0), rel=1e-5)
    # chunks of 5 positions (the last one padded) give the loss and gradients of the whole at once
    w = jnp.asarray(mask[:, 1:], jnp.float32)

    def direct(p, h):
        lg = head(p, h)
        lse = jax.nn.logsumexp(lg, axis=-1)
        ce = lse - jnp.take_along_axis(lg, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum((ce + 0.01 * lse**2) * w) / jnp.sum(w)

    fused = __import__(model.__package__ + ".kernels", fromlist=["kernels"]).fused_cross_entropy
    chunked = lambda p, h: fused(head, p, h, tokens[:, 1:], 0.01, 5, w)[0]  # noqa: E731
    want, got = (jax.jit(jax.grad(f, (0, 1)))(hp, x) for f in (direct, chunked))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


def test_micro_batches_weigh_by_their_marked_labels(tm):
    """Two micro-batches with unequal counts of marked labels give the gradient of one batch
    (the mean over all marked labels), not the mean of the two micro-batches' means."""
    import dataclasses

    import jax

    model = __import__(tm.__package__ + ".model", fromlist=["model"])
    cfg = tm.model_config(tm.TRAIN)
    params = model.init_params(cfg, jax.random.key(0))
    batch = batch_of(tm)
    counts = batch["loss_mask"][:, 1:].sum(1)
    assert counts[0::2].sum() != counts[1::2].sum()  # micro-batch i is rows i, i + 2
    one = jax.jit(lambda p, b: tm.grads_and_loss(cfg, tm.TRAIN, p, b))(params, batch)
    two_tc = dataclasses.replace(tm.TRAIN, microbatches=2)
    two = jax.jit(lambda p, b: tm.grads_and_loss(cfg, two_tc, p, b))(params, batch)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-7)
    loss_fn = jax.jit(model.loss_fn, static_argnums=0)
    halves = [loss_fn(cfg, params, batch["tokens"][i::2], batch["loss_mask"][i::2])[1] for i in (0, 1)]
    assert abs(float(np.mean(halves)) - float(one[1])) > 1e-3  # a mean of means would differ


# ----------------------------------------------------------------------------- training runs


def saved_state(run: Path, step: int) -> dict[str, bytes]:
    import jax
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore((run / "checkpoints" / str(step) / "state").absolute())
    return {jax.tree_util.keystr(p): np.asarray(v).tobytes() for p, v in jax.tree_util.tree_leaves_with_path(state)}


def train(tm, run: Path, steps: int) -> None:
    """tm's main into `run` for `steps` steps, as a process that then ends (its run lock freed)."""
    cache = Path(tm.__file__).parents[3] / "compile_cache"  # the steps compile once
    try:
        tm.main(["--no-progress", "--out", str(run), "--steps", str(steps), "--compile-cache", str(cache)])
    finally:
        (run / "lock").unlink(missing_ok=True)


def test_a_chat_run_trains_records_its_data_and_resumes_bitwise(tm, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(tm, whole, 4)
    train(tm, halves, 2)
    train(tm, halves, 4)  # resumes from step 2
    assert saved_state(halves, 4) == saved_state(whole, 4)
    losses = [json.loads(line)["loss"] for line in (whole / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert len(losses) == 4 and losses[-1] < losses[0] and abs(losses[0] - np.log(320)) < 0.2
    info = json.loads((whole / "run.json").read_text())
    assert info["data"] == {"conversations": 40, "rows": 40, "tokens": 776, "loss_tokens": 149, "cut": 0}
    assert set(info["identity"]["data"]) == {"data_path", "tokenizer"}
    # another file, or another template, is another run: no resume over it
    folder = Path(tm.__file__).parents[3]
    template = folder / "tokenizer" / "chat_template.jinja"
    original = template.read_text()
    template.write_text(original.replace("'\\n'", "'\\n\\n'"))
    try:
        with pytest.raises(SystemExit) as stop:
            train(tm, halves, 6)
        assert "the data of tokenizer differs" in str(stop.value.code)
    finally:
        template.write_text(original)



def test_lora_on_chat_data_starts_from_the_base_model_and_trains_only_the_adapters(tm, tmp_path):
    """LoRA over chat data: B starts at zero, so step 1's loss is the full model's at the same
    initial parameters; the loss falls while the base weights stay bitwise as they were."""
    lora = TRAIN + '  lora(rank = 2, alpha = 4.0, targets = "blocks/*/attn/w[qv]")\n'
    write_spec(tmp_path, CHAT, lora)
    lm = build_package(tmp_path, "lm", (tmp_path / "lm.axl").read_text())
    train(tm, tmp_path / "full", 1)
    train(lm, tmp_path / "lora", 4)

    def losses(run: Path) -> list[float]:
        return [m["loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in m]

    full, adapted = losses(tmp_path / "full"), losses(tmp_path / "lora")
    assert adapted[0] == pytest.approx(full[0], rel=1e-6) and adapted[-1] < adapted[0]
    first, last = saved_state(tmp_path / "lora", 2), saved_state(tmp_path / "lora", 4)
    base = [k for k in first if k.startswith("['params']")]
    assert base and all(first[k] == last[k] for k in base)
    assert any(first[k] != last[k] for k in first if k.startswith("['lora']"))


def test_a_preference_line_with_a_mistyped_prompt_says_which_key():
    """`{"messages": 5}` said `no "prompt" string nor "messages" list (the object has "messages")`;
    a key that is there but of the wrong kind is now named with what it holds."""
    from axdsl.runtime.chat import validate_preference

    pair = {"chosen": "a", "rejected": "b"}
    assert validate_preference({"messages": 5, **pair}, 3) == [
        'line 3: "messages" is a number, not a list of messages'
    ]
    assert validate_preference({"prompt": [1], **pair}, 3) == ['line 3: "prompt" is an array, not a string']
