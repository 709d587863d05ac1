"""Chat data (axdsl/runtime/chat.py): conversations rendered with a tokenizer's chat template give
the text and token ids of transformers' apply_chat_template, for Llama 3, ChatML (Qwen 2.5) and
Gemma 3 templates; the loss mask covers exactly each assistant content and its end-of-turn token;
bad lines are named.

Each template is a small tokenizer directory made here: a tokenizers BPE trained on a few lines
(with the template's special tokens added) and tokenizer_config.json holding the published
template of the model. transformers is optional: the comparisons are skipped without it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from axdsl.runtime import chat

# The chat templates as the models publish them (tokenizer_config.json's chat_template).
LLAMA3 = (  # meta-llama/Meta-Llama-3-8B-Instruct
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501 (the template as published)
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Each style: its template, its named special tokens, the added tokens its template writes, and
# the end-of-turn token after an assistant turn.
STYLES = {
    "llama3": (
        LLAMA3,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
        + ["<|eot_id|>"],
        "<|eot_id|>",
    ),
    "qwen": (
        QWEN25,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "<|im_end|>",
    ),
    "gemma": (
        GEMMA3,
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        "<end_of_turn>",
    ),
}

CONVERSATIONS = [
    [
        {
            "role": "system",
            "content": "You are a terse assistant. Réponds en français si possible.",
        },
        {"role": "user", "content": "Wie heißt die Hauptstadt von Japan? 日本の首都は？"},
        {"role": "assistant", "content": "東京 (Tokyo) — naïve café ☕ 🚀"},
        {"role": "user", "content": "And its population, roughly?"},
        {"role": "assistant", "content": "About 14 million people.\nMore in the metro area."},
    ],
    [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ],
]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. You are a helpful assistant.",
    "Réponds en français, naïve café. Wie heißt die Hauptstadt? 日本の首都は東京です。",
    "About 14 million people live in the metro area of Tokyo. Say hi! user model system",
    "Conversation roles, population, roughly? ☕ 🚀 — terse assistant Qwen Alibaba Cloud",
]


def make_tokenizer(specials: list[str], metaspace: bool):
    """A small BPE trained on CORPUS, with `specials` added: GPT-2's byte-level scheme (Llama 3,
    Qwen), or SentencePiece's spaces as ▁ with whole-string merges (Gemma)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if metaspace:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.decoder = decoders.Replace("▁", " ")
        text = CORPUS + [json.dumps(CONVERSATIONS, ensure_ascii=False), "\n"]
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=400, initial_alphabet=alphabet, special_tokens=specials, show_progress=False
        )
        text = CORPUS
    tokenizer.train_from_iterator(text, trainer)
    return tokenizer


def write_style(folder: Path, style: str) -> Path:
    """A tokenizer directory for `style`: tokenizer.json and tokenizer_config.json."""
    template, special, added, _ = STYLES[style]
    folder.mkdir(parents=True, exist_ok=True)
    make_tokenizer(added, metaspace=style == "gemma").save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: write_style(root / style, style) for style in STYLES}


def conversations_for(style: str) -> list[list[dict]]:
    """CONVERSATIONS, plus a tool turn where the template has one."""
    found = [list(c) for c in CONVERSATIONS]
    if style == "qwen":
        found.append(
            [
                {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": "Let me look."},
                {"role": "tool", "content": '{"temp_c": 21}'},
                {"role": "assistant", "content": "21 °C."},
            ]
        )
    return found


def hf_tokenizer(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


@pytest.mark.parametrize("style", list(STYLES))
def test_text_and_ids_equal_transformers(folders, style):
    from tokenizers import Tokenizer

    folder = folders[style]
    hf = hf_tokenizer(folder)
    template, special = chat.load_template(folder), chat.load_special_tokens(folder)
    assert template == STYLES[style][0] and special == STYLES[style][1]
    assert special == hf.special_tokens_map
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for messages in conversations_for(style):
        for prompt in (False, True):
            text = chat.render_chat(messages, template, special, add_generation_prompt=prompt)
            assert text == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=prompt
            )
        ids, mask = chat.encode_chat(messages, tokenizer, template, special)
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=False)
        assert ids.tolist() == list(want)
        assert ids.dtype == np.int32 and mask.shape == ids.shape


@pytest.mark.parametrize("style", list(STYLES))
def test_mask_is_each_assistant_content_and_its_end_of_turn(folders, style):
    from tokenizers import Tokenizer

    folder = folders[style]
    end_of_turn = STYLES[style][3]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template, special = chat.load_template(folder), chat.load_special_tokens(folder)
    for messages in conversations_for(style):
        ids, mask = chat.encode_chat(messages, tokenizer, template, special)
        turns = [m["content"].strip() + end_of_turn for m in messages if m["role"] == "assistant"]
        assert masked_runs(tokenizer, ids, mask) == turns
        assert chat.encode_chat(messages, tokenizer, template, special, "all")[1].all()


def masked_runs(tokenizer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """The text of each run of masked tokens."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [
        tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=False)
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


def test_mask_finds_contents_the_template_trims(folders, monkeypatch):
    """Llama 3 trims each content: whitespace around it is not in the text, and the sentinels
    around the content would keep it, so each content is located alone (content_span)."""
    from tokenizers import Tokenizer

    located = []
    alone = chat.content_span
    monkeypatch.setattr(chat, "content_span", lambda *a: located.append(a[1]) or alone(*a))

    folder = folders["llama3"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template, special = chat.load_template(folder), chat.load_special_tokens(folder)
    messages = [
        {"role": "user", "content": "  Say hi.\n"},
        {"role": "assistant", "content": "\n  Hi there!  \n"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "   "},
    ]
    ids, mask = chat.encode_chat(messages, tokenizer, template, special)
    assert masked_runs(tokenizer, ids, mask) == ["Hi there!<|eot_id|>", "<|eot_id|>"]
    assert located == [1, 3]
    located.clear()
    chat.encode_chat(CONVERSATIONS[0], tokenizer, template, special)
    assert located == []  # no whitespace to trim: one render with sentinels found every content


def test_mask_skips_text_the_template_adds_before_a_content(folders):
    """Qwen 3 writes an empty <think></think> before the last assistant content only: rendering a
    conversation's prefix does not give a prefix of its text, the sentinels still find each
    content, and the think block (written by the prompt in thinking-off mode) is not learned."""
    from tokenizers import Tokenizer

    hf = hf_tokenizer(folders["qwen"])
    tokenizer = Tokenizer.from_file(str(folders["qwen"] / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
        "loop.last %}<think>\n\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    messages = CONVERSATIONS[0]
    ids, mask = chat.encode_chat(messages, tokenizer, template, {})
    assert ids.tolist() == hf.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=False
    )
    turns = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert masked_runs(tokenizer, ids, mask) == turns
    odd = [{"role": "user", "content": "\ufdd0"}, {"role": "assistant", "content": "\ufdd1!"}]
    ids, mask = chat.encode_chat(odd, tokenizer, template, {})  # sentinels the text lacks
    assert masked_runs(tokenizer, ids, mask) == ["\ufdd1!<|im_end|>"]


def test_a_template_that_rewrites_the_content_is_refused(folders):
    """A content rendered twice, or cut, cannot be located: a clear error, unless train_on="all"."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folders["qwen"] / "tokenizer.json"))
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"}]
    for shown in ("m.content + m.content", "m.content[:2]"):
        template = "{% for m in messages %}{{ " + shown + " }}<|im_end|>{% endfor %}"
        with pytest.raises(ValueError, match="cannot locate message 2's content"):
            chat.encode_chat(messages, tokenizer, template, {})
        ids, mask = chat.encode_chat(messages, tokenizer, template, {}, train_on="all")
        assert mask.all() and len(ids)
    template = "{% for m in messages %}{{ m.content | upper }}<|im_end|>{% endfor %}"
    ids, mask = chat.encode_chat(messages, tokenizer, template, {})  # what the model must write
    assert masked_runs(tokenizer, ids, mask) == ["B C<|im_end|>"]


ENVIRONMENT = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'tool' %}{% continue %}"
    "{% endif %}{% set ns.n = ns.n + 1 %}{{ m | tojson }}|"
    "{{ m | tojson(indent=2, sort_keys=true) }}"
    "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}{{ ns.n }}"
    "{{ dict(a=1) | tojson(separators=(',', ':')) }}{{ strftime_now('%Y') }}"
    "{% generation %}{{ eos_token }}{% endgeneration %}{{ bos_token is defined }}\n"
    "  {% if messages %}\n    blocks keep no line of their own\n  {% endif %}\n"
)


def test_environment_matches_transformers(folders):
    """The globals, filters and extensions templates use render as in transformers."""
    hf = hf_tokenizer(folders["qwen"])
    messages = [
        {"role": "user", "content": "ünï <b>&</b>", "reasoning": "hm"},
        {"role": "tool", "content": "x"},
        {"role": "assistant", "content": "ok", "tool_calls": None},
        {"role": "user", "content": "z"},
        {"role": "user", "content": "not reached"},
    ]
    special = chat.load_special_tokens(folders["qwen"])
    text = chat.render_chat(messages, ENVIRONMENT, special)
    assert text == hf.apply_chat_template(messages, chat_template=ENVIRONMENT, tokenize=False)
    assert '"ünï <b>&</b>"' in text and '"thinking": "hm"' in text and "not reached" not in text


def test_templates_stay_in_the_sandbox():
    with pytest.raises(
        chat.TemplateFailure, match="line 15 of the template: Conversation roles must alternate"
    ):
        chat.render_chat([{"role": "assistant", "content": "x"}], GEMMA3, {})
    with pytest.raises(chat.TemplateFailure, match="cannot set '_x'"):
        chat.render_chat([], "{% set ns = namespace(_x=1) %}", {})
    with pytest.raises(chat.TemplateFailure, match="unsafe"):
        chat.render_chat([], "{{ messages.__class__.__subclasses__() }}", {})
    with pytest.raises(chat.TemplateFailure, match="unsafe"):  # immutable: no list.append
        chat.render_chat([], "{% set x = [] %}{{ x.append(1) }}", {})


@pytest.mark.parametrize(
    "template, says",
    [
        ("a\n{{ 1/0 }}", "line 2 of the template: ZeroDivisionError: division by zero"),
        ("{% include 'x.jinja' %}", "TypeError: no loader"),
        ("{{ messages + 1 }}", "TypeError: can only concatenate list"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{% for i in range(10**9) %}x{% endfor %}", "MAX_RANGE"),
        ("{{ 'x' * 10**10 }}", "a value of 10,000,000,000 items"),
        ("{{ 'x'|center(10**10) }}", "a width or count past"),
        ("{{ 'x'.rjust(10**10) }}", "a width or count past"),
        ("{{ ('x' * 10**6)|replace('', 'y' * 1000) }}", "a value of 1,001,002,000 items"),
        ("{{ 'x' * 10**7 }}" * 4, "it renders more than 33,554,432 characters"),
        ("{{ 7 ** (10**6) }}", "to the power 1000000"),
        ("{% if %}", "line 1 of the template: syntax error"),
    ],
)
def test_a_failing_template_is_a_template_failure(template, says):
    with pytest.raises(chat.TemplateFailure, match=re.escape(says)):
        chat.render_chat([{"role": "user", "content": "hi"}], template, {})


def test_a_template_that_runs_too_long_is_stopped(monkeypatch):
    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.2)
    loops = (
        "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"
    )
    start = time.monotonic()
    with pytest.raises(chat.TemplateFailure, match="line 1 of the template: it renders for"):
        chat.render_chat([], loops, {})
    assert time.monotonic() - start < 2


def test_load_template_reads_what_transformers_reads(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="has no chat template"):
        chat.load_template(tmp_path / "tokenizer.json")
    config = {"chat_template": [{"name": "tool_use", "template": "T"}], "bos_token": "<s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match='none named "default"'):
        chat.load_template(tmp_path)
    config["chat_template"].append({"name": "default", "template": "D"})
    config["eos_token"] = {"content": "</s>", "__type": "AddedToken"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert chat.load_template(tmp_path / "tokenizer.json") == "D"
    assert chat.load_special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "chat_template.jinja").write_text("J", encoding="utf-8")
    assert chat.load_template(tmp_path) == "J"
    with pytest.raises(ValueError, match="does not exist"):
        chat.load_template(tmp_path / "missing")
    legacy = {
        "bos_token": {"content": "<B>"},
        "unk_token": "<U>",
    }  # read without added_tokens_decoder
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(legacy))
    assert chat.load_special_tokens(tmp_path) == {
        "bos_token": "<B>",
        "eos_token": "</s>",
        "unk_token": "<U>",
    }
    config["added_tokens_decoder"] = {}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert chat.load_special_tokens(tmp_path) == {"bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(ValueError, match="does not hold a JSON object"):
        chat.load_special_tokens(tmp_path / "tokenizer.json")


def test_validation_names_each_problem():
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert chat.validate_conversation(good, 1) == []
    assert chat.validate_conversation([1], 2) == [
        "line 2: a conversation is a JSON object, not an array"
    ]
    assert chat.validate_conversation({"text": "x"}, 3) == [
        'line 3: no "messages" list (the object has "text")'
    ]
    assert chat.validate_conversation({"messages": "x"}, 4) == [
        'line 4: "messages" is a string, not a list of messages'
    ]
    bad = {
        "messages": [
            {"role": "human", "content": "q"},
            {"role": "user", "content": ["q"]},
            {"content": "x"},
            "hello",
            {"role": "tool"},
        ]
    }
    assert chat.validate_conversation(bad, 5) == [
        "line 5, message 1: unknown role 'human' (the roles are system, user, assistant, tool)",
        "line 5, message 2: content is an array, not a string",
        "line 5, message 3: no role (the roles are system, user, assistant, tool)",
        "line 5, message 4: a message is a JSON object, not a string",
        "line 5, message 5: no content",
        "line 5: no assistant message (nothing for the model to learn)",
    ]
