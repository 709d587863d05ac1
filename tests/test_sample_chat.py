"""`axdsl sample RUN --chat MESSAGE [--system TEXT]` (issue 37 item 4): the prompt is the
message as a user turn rendered by the run's chat template with the assistant's turn header, to
the ids of transformers' `apply_chat_template(add_generation_prompt=True)` (Llama 3, ChatML/Qwen
and Gemma templates, the tokenizers of tests/test_chat.py); generation stops at the template's
end-of-turn token and only the answer is printed; a run without a template is a located error.

The run is trained here, in this process, on one short exchange until it knows it by heart (a
one-layer model, a few seconds)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from axdsl.cli import main
from axdsl.sampling import ChatTemplate
from test_chat import STYLES, hf_tokenizer, write_style

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "chat"
MESSAGES = [
    [{"role": "user", "content": "Wie heißt die Hauptstadt von Japan? 日本の首都は？"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Say hi."},
    ],
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: write_style(root / style, style) for style in STYLES}


@pytest.mark.parametrize("style", list(STYLES))
def test_prompt_ids_equal_transformers_with_the_generation_prompt(folders, style):
    hf = hf_tokenizer(folders[style])
    chat = ChatTemplate.load(folders[style])
    for messages in MESSAGES:
        want = hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert chat.prompt_ids(messages) == list(want)
    # the answer ends at the token the template writes after an assistant's content, or at eos
    _, special, _, end = STYLES[style]
    stops = [hf.convert_tokens_to_ids(t) for t in (end, special["eos_token"])]
    assert chat.end_of_turn() == tuple(dict.fromkeys(stops))


def _tiny_llama():
    """examples/chat/make_tiny_llama.py as a module (its writer of Hugging Face directories)."""
    spec = importlib.util.spec_from_file_location("make_tiny_llama", EXAMPLE / "make_tiny_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = """import "std/transformer.axl"

model lm = DecoderLM {
  vocab = 320  dim = 320  layers = 1  heads = 4  kv_heads = 2  ffn = 8  max_seq = 32  dtype = f32
}
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """An import-hf output of a Llama whose greedy answer is known: its blocks add nothing (o_proj
    and down_proj are zero), so the logits depend on the last token alone, and its head maps
    each token to the next of a chain: the prompt's last token -> "Paris." -> <|im_end|> -> X
    -> X ... (X shows when generation runs past the end of the turn)."""
    folder = tmp_path_factory.mktemp("import")
    maker = _tiny_llama()
    config = dict(maker.CONFIG, hidden_size=320, intermediate_size=8, num_hidden_layers=1)
    config["max_position_embeddings"] = 32
    tensors = {
        k: np.zeros_like(v) for k, v in maker.llama_tensors(config).items() if "norm" not in k
    }
    tensors |= {k: v for k, v in maker.llama_tensors(config).items() if "norm" in k}
    tensors["model.embed_tokens.weight"] = np.eye(320, dtype=np.float32)
    chat = ChatTemplate.load(EXAMPLE / "tokenizer")
    prompt = chat.prompt_ids([{"role": "user", "content": "Hi."}])
    answer = chat.tokenizer.encode("Paris.", add_special_tokens=False).ids
    end, x = chat.end_of_turn()[0], chat.tokenizer.token_to_id("X")
    chain = [prompt[-1], *answer, end, x, x]
    assert len(set(chain[:-1])) == len(chain) - 1  # each token has one successor
    head = tensors["lm_head.weight"]  # [vocab, dim]: logits = head @ one-hot(token) * sqrt(dim)
    for token, following in zip(chain[:-1], chain[1:], strict=True):
        head[following, token] = 1.0
    maker.write_model(folder / "hf", config, tensors)
    (folder / "lm.axl").write_text(SPEC)
    return folder


def test_sample_chat_prints_only_the_answer_and_stops_at_the_end_of_turn(
    imported, monkeypatch, capsys
):
    monkeypatch.chdir(imported)  # sample builds the spec into generated/ here
    assert main(["import-hf", "lm.axl", "hf", "--out", "lm-hf/params"]) == 0
    argv = ["sample", "lm-hf", "--chat", "Hi.", "--temperature", "0", "--max-tokens", "20"]
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == "Paris.\n"  # no prompt, no <|im_end|>, no X after it
    # the message as the positional prompt with --chat alone, after a system prompt (the prompt
    # still ends with the assistant's header, so the chain is the same)
    assert (
        main(["sample", "lm-hf", "Hi.", "--chat", "--system", "Be terse.", "--temperature", "0"])
        == 0
    )
    assert capsys.readouterr().out == "Paris.\n"
    # the same prompt as ids without --chat, with an eos it never makes: it runs past the end of
    # the turn, so the stop is what cut the answer above
    ids = ChatTemplate.load(EXAMPLE / "tokenizer").prompt_ids([{"role": "user", "content": "Hi."}])
    argv = ["sample", "lm-hf", " ".join(map(str, ids)), "--temperature", "0", "--eos", "319"]
    assert main([*argv, "--max-tokens", "9"]) == 0
    x = ChatTemplate.load(EXAMPLE / "tokenizer").tokenizer.token_to_id("X")
    assert (
        capsys.readouterr().out.split()[len(ids) + 6 :] == [str(x)] * 3
    )  # Paris. <|im_end|> X X X


def test_sample_chat_errors_are_located(imported, tmp_path, monkeypatch, capsys):
    assert main(["sample", "runs/x", "Hi.", "--system", "Be terse."]) == 2  # without --chat
    assert "give it with --chat" in capsys.readouterr().err
    # a run trained on bytes has no chat template: the error says how to get one (before any
    # model is loaded, so run.json alone is enough here)
    run = tmp_path / "run"
    run.mkdir()
    info = {"spec": str(tmp_path / "lm.axl"), "root": str(tmp_path), "train": {"data": "text"}}
    (run / "run.json").write_text(json.dumps(info))
    assert main(["sample", str(run), "--chat", "Hi."]) == 1
    err = capsys.readouterr().err
    assert "has no chat template" in err and 'data = chat("conversations.jsonl"' in err
    # chat data whose tokenizer has no template: where it was looked for, and what to do
    (tmp_path / "plain").mkdir()
    shutil.copy(EXAMPLE / "tokenizer" / "tokenizer.json", tmp_path / "plain")
    info["train"] = {"data": "chat", "tokenizer": "plain"}
    (run / "run.json").write_text(json.dumps(info))
    assert main(["sample", str(run), "--chat", "Hi."]) == 1
    err = capsys.readouterr().err
    assert f"the tokenizer in {tmp_path / 'plain'} has no chat template" in err
    assert "chat_template.jinja" in err
    # a prompt longer than the model's window (the import's max_seq, 32)
    monkeypatch.chdir(imported)
    if not (imported / "lm-hf").exists():
        assert main(["import-hf", "lm.axl", "hf", "--out", "lm-hf/params"]) == 0
    capsys.readouterr()
    assert main(["sample", "lm-hf", "--chat", "Hi. " * 20]) == 1
    err = capsys.readouterr().err
    assert "the chat prompt is" in err and "the model sees 32" in err and "Traceback" not in err


def test_eval_stops_a_chat_runs_generation_at_the_end_of_turn(tmp_path):
    """`axdsl eval`'s generation tasks on a chat run stop where `sample --chat` does (the run's
    template's end-of-turn id), found the first time a task generates (a .txt task never renders
    the template); a template that fails is an error naming it."""
    from axdsl.evaluation.command import EvalError, Text, _chat_end

    shutil.copytree(EXAMPLE / "tokenizer", tmp_path / "tokenizer")
    info = {
        "spec": "lm.axl",
        "root": str(tmp_path),
        "train": {"data": "chat", "tokenizer": "tokenizer"},
    }
    (tmp_path / "run.json").write_text(json.dumps(info))
    end = ChatTemplate.load(EXAMPLE / "tokenizer").tokenizer.token_to_id("<|im_end|>")
    assert _chat_end(tmp_path, None) == end
    found = []
    text = Text(str.split, " ".join, "t", eos=7, find_eos=lambda: found.append(1) or end)
    assert not found and (text.stop(), text.stop(), found) == (end, end, [1])
    (tmp_path / "tokenizer" / "chat_template.jinja").write_text("{{ 1/0 }}")
    with pytest.raises(EvalError, match="line 1 of the template: ZeroDivisionError"):
        _chat_end(tmp_path, None)


def test_a_chat_run_keeps_its_template_and_prompts_with_it_after_the_tokenizer_goes(tmp_path):
    """keep_tokenizer writes the run's tokenizer directory (tokenizer.json, chat_template.jinja,
    special_tokens_map.json); sample --chat and eval read it, so the run prompts as it trained
    after the spec's tokenizer directory is changed or removed."""
    from types import SimpleNamespace

    from axdsl.runtime.chat_data import chat_tokenizer, keep_tokenizer
    from axdsl.sampling import run_chat_template

    shutil.copytree(EXAMPLE / "tokenizer", tmp_path / "tokenizer")
    spec = str(tmp_path / "lm.axl")
    tc = SimpleNamespace(tokenizer="tokenizer")
    _, template, special = chat_tokenizer(tc, spec)
    run = tmp_path / "run"
    keep_tokenizer(tc, spec, template, special, run)
    assert sorted(p.name for p in run.iterdir()) == [
        "chat_template.jinja",
        "special_tokens_map.json",
        "tokenizer.json",
    ]
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi."}]
    want = ChatTemplate.load(EXAMPLE / "tokenizer")
    shutil.rmtree(tmp_path / "tokenizer")  # the spec's tokenizer directory is gone
    info = {
        "spec": "lm.axl",
        "root": str(tmp_path),
        "train": {"data": "chat", "tokenizer": "tokenizer"},
    }
    got = run_chat_template(run, info)
    assert got.special == want.special and got.template == want.template
    assert got.prompt_ids(messages) == want.prompt_ids(messages)
    assert got.end_of_turn() == want.end_of_turn()


def test_the_walk_through_files_agree(in_root, capsys):
    """The README walk-through's pieces, short of running it (about 75 s): its specs pass `axdsl
    check` (data lines, LoRA targets), every examples/ path it names exists, and the eval task of
    pairs is pairs.jsonl as the template renders it (the prompt with the assistant's header as
    context, each answer and its end of turn as a choice, the chosen one gold)."""
    import re

    from axdsl.runtime.chat import render_chat

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    walk = readme[readme.index("### From a base model to an assistant") :].split("```")[1]
    named = set(re.findall(r"examples/chat/\S+", walk))
    assert len(named) >= 5 and all((ROOT / p).is_file() for p in named), named
    for spec in ("assistant_sft.axl", "assistant_dpo.axl"):
        assert main(["check", f"examples/chat/{spec}"]) == 0, capsys.readouterr().err
    chat = ChatTemplate.load(EXAMPLE / "tokenizer")
    lines = (EXAMPLE / "pairs.jsonl").read_text(encoding="utf-8").splitlines()
    items = (EXAMPLE / "eval_pairs.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(items) == len(lines)
    for line, item in zip(lines, items, strict=True):
        pair, item = json.loads(line), json.loads(item)
        prompt = pair.get("messages") or [{"role": "user", "content": pair["prompt"]}]
        assert item["context"] == render_chat(prompt, chat.template, chat.special, True)
        answers = [
            a if isinstance(a, str) else a[0]["content"] for a in (pair["chosen"], pair["rejected"])
        ]
        assert item["choices"] == [a + "<|im_end|>" for a in answers] and item["gold"] == 0
