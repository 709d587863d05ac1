"""Conversations for chat fine-tuning: rendered with the tokenizer's own chat template as
transformers' `apply_chat_template` renders them, tokenized to the same ids, with a loss mask on
the assistant turns.

Copied (without this docstring and the imports) into the generated runtime.py by
axdsl/codegen/runtime_source.py; it must import nothing of axdsl but its sibling modules here."""

import json
import threading
import time
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

# A line of a chat file is {"messages": [{"role": ..., "content": ...}, ...]}. The conversation is
# rendered with the tokenizer's chat template (a jinja2 template that Hugging Face tokenizers ship)
# in the environment transformers renders it in, so that the text and the token ids equal what
# `tokenizer.apply_chat_template(messages, tokenize=True)` gives; the loss is taken on the tokens
# the model must learn to produce: each assistant turn's content and the end-of-turn token after it.

CHAT_ROLES = ("system", "user", "assistant", "tool")
# The named special tokens transformers hands every template (bos_token, eos_token, ...): its
# `special_tokens_map`, read from tokenizer_config.json.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Message fields a model's reasoning is given under; templates read `reasoning_content` (most) or
# `thinking` (gpt-oss), so each is filled from whichever the message has, as transformers does.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Unicode noncharacters: never in real text, and no template strips them (they are not whitespace).
# Two absent from a conversation's rendering mark where its assistant contents begin and end.
SENTINELS = tuple(chr(c) for c in range(0xFDD0, 0xFDF0))
# A chat template is an untrusted program (it comes with a model repository), rendered once or a
# few times per conversation. Real ones render a conversation in about a millisecond and write
# less than the conversation's text and its markup; one that runs longer or writes more than
# these limits is stopped with a TemplateFailure. The time limit is a deadline the sandbox
# checks at every call, loop step, operator and filter (see chat_environment): it works in any
# thread, unlike an alarm signal, which only the main thread receives.
RENDER_SECONDS = 2.0
RENDER_CHARS = 32 * 2**20  # 32 Mi characters: a hundred times a 128k-token context's text
RENDERING = threading.local()  # .deadline: the time.monotonic() the current render ends by


class TemplateFailure(ValueError):
    """A chat template that does not compile, or whose rendering raised, ran past RENDER_SECONDS
    or grew past RENDER_CHARS; the message says what and at which line of the template."""


class RenderLimit(Exception):
    """Raised inside a rendering that reached a limit; render_chat makes it a TemplateFailure."""


def load_template(path: str | Path) -> str:
    """The chat template of a tokenizer: `path` is its directory or its tokenizer.json (whose
    directory is read). As transformers loads it: chat_template.jinja (what transformers 5 saves)
    wins, else tokenizer_config.json's `chat_template`, a string or a list of named templates of
    which the one named "default" is used. A ValueError says what is missing when there is none."""
    path = Path(path)
    folder = path.parent if path.is_file() else path
    if not folder.is_dir():
        raise ValueError(f"tokenizer {path} does not exist")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = read_tokenizer_config(folder)
    template = config.get("chat_template")
    if isinstance(template, str) and template:
        return template
    if isinstance(template, list):
        # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        default = named.get("default")
        if isinstance(default, str):
            return default
        raise ValueError(
            f"the tokenizer in {folder} has several chat templates "
            f"({', '.join(sorted(str(n) for n in named))}) and none named \"default\""
        )
    raise ValueError(
        f"the tokenizer in {folder} has no chat template: neither chat_template.jinja nor a "
        "`chat_template` in tokenizer_config.json (a base model's tokenizer has none; give the "
        "tokenizer of its instruct version, or write a chat_template.jinja beside it)"
    )


def load_special_tokens(path: str | Path) -> dict[str, str]:
    """The named special tokens a template may read (bos_token, eos_token, ...) of the tokenizer
    in `path` (its directory or tokenizer.json), as transformers reads them: those of
    tokenizer_config.json, overridden by a legacy special_tokens_map.json's when the config has no
    `added_tokens_decoder`; a token is its text or an AddedToken's {"content": ...}; absent ones
    are left out. (transformers 5's model-specific tokenizer classes add defaults of their own,
    e.g. Gemma's mask_token; those models' templates read only bos_token and eos_token.)"""
    path = Path(path)
    folder = path.parent if path.is_file() else path
    config = read_tokenizer_config(folder)
    legacy = folder / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and legacy.is_file():
        config = {**config, **read_json_object(legacy)}
    special = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    return special


def read_tokenizer_config(folder: Path) -> dict:
    """tokenizer_config.json of `folder` as a dict ({} when there is none)."""
    config = folder / "tokenizer_config.json"
    return read_json_object(config) if config.is_file() else {}


def read_json_object(path: Path) -> dict:
    """The JSON object in `path`; a ValueError when it holds none."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return found


def render_chat(
    messages: list[dict], template: str, special: dict[str, str], add_generation_prompt=False
) -> str:
    """`messages` rendered with the chat `template`, exactly as transformers' apply_chat_template
    renders them (tokenize=False): the same jinja2 sandbox and globals (see chat_environment), the
    special tokens as variables, `tools` and `documents` None. As transformers does, message
    fields whose value is None are dropped and a message's reasoning is given under every name
    templates read it by. Any failure (a syntax error, `raise_exception(...)`, an exception
    the template's code raises, a limit reached) is a TemplateFailure."""
    compiled = compile_template(template)
    context = {
        "messages": [chat_message(m) for m in messages],
        "tools": None,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        **special,
    }
    RENDERING.deadline = time.monotonic() + RENDER_SECONDS
    parts, size = [], 0
    try:
        for part in compiled.generate(**context):
            size += len(part)
            if size > RENDER_CHARS:
                raise RenderLimit(f"it renders more than {RENDER_CHARS:,} characters")
            parts.append(part)
    except Exception as exc:  # the template is untrusted code: whatever it raises is its failure
        raise template_failure(exc) from None
    finally:
        RENDERING.deadline = None
    return "".join(parts)


def template_failure(exc: Exception) -> TemplateFailure:
    """`exc`, raised compiling or rendering a chat template, as a TemplateFailure that says what
    happened and where in the template (jinja2 rewrites a render's traceback to the template's
    lines, in frames of the file "<template>")."""
    import jinja2

    if isinstance(exc, TemplateFailure):
        return exc
    line = exc.lineno if isinstance(exc, jinja2.TemplateSyntaxError) else None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    said = str(exc)[:300]
    if not isinstance(exc, (jinja2.TemplateError, RenderLimit)) or not said:
        said = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    elif isinstance(exc, jinja2.TemplateSyntaxError):
        said = f"syntax error: {said}"
    return TemplateFailure(f"line {line} of the template: {said}" if line else said)


def check_deadline() -> None:
    """Stop the rendering under way when it ran past RENDER_SECONDS."""
    deadline = getattr(RENDERING, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise RenderLimit(f"it renders for longer than {RENDER_SECONDS:g} s (a limit)")


def check_size(value):
    """`value`, unless it is a string, list or number larger than RENDER_CHARS allows."""
    if isinstance(value, (str, list, tuple)):
        check_length(len(value))
    if isinstance(value, int) and value.bit_length() > 4 * RENDER_CHARS:
        raise RenderLimit("it makes a number too large to write")
    return value


def check_arguments(value, args: tuple, kwargs: dict) -> None:
    """Stop a filter or string method that would make a value past RENDER_CHARS before it does:
    one given a width or count past it (center, indent, ljust, zfill, ...), or replacing a
    string's parts by text that adds up past it."""
    given = [*args, *kwargs.values()]
    if any(isinstance(a, int) and a > RENDER_CHARS for a in given):
        raise RenderLimit(f"a width or count past {RENDER_CHARS:,} is given to a filter or method")
    if isinstance(value, str) and len(given) >= 2 and all(isinstance(a, str) for a in given[:2]):
        check_length(len(value) + (value.count(given[0]) + 1) * len(given[1]))  # replace


def check_length(length: int) -> None:
    """Stop a rendering that makes a string or list of `length` items, past RENDER_CHARS."""
    if length > RENDER_CHARS:
        raise RenderLimit(f"it makes a value of {length:,} items (the limit is {RENDER_CHARS:,})")


def chat_message(message: dict) -> dict:
    """A copy of `message` as transformers hands it to the template: None fields dropped, and
    a reasoning given under one name copied to `thinking` and `reasoning_content`."""
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


@lru_cache(maxsize=16)
def compile_template(template: str):
    """The jinja2 Template of a chat template's text, compiled once; a TemplateFailure when it
    does not compile."""
    try:
        return chat_environment().from_string(template)
    except Exception as exc:  # a syntax error, or what else jinja2 raises of odd text
        raise template_failure(exc) from None


@lru_cache(maxsize=1)
def chat_environment():
    """The jinja2 environment chat templates are written for: transformers' (whose templates
    come from model repositories and are untrusted code, hence the sandbox). An immutable sandbox
    with trim_blocks and lstrip_blocks; the loop controls `break` and `continue`; `tojson` that
    keeps non-ASCII text and takes indent, separators and sort_keys; `raise_exception(message)`;
    `strftime_now(format)` (today's date in Llama 3.1's system prompt); `dict` and `namespace`
    that cannot reach Python internals; and a `{% generation %}` block, which marks the assistant
    text for transformers' assistant mask and here only renders its body (encode_chat finds the
    assistant text without it). The sandbox keeps a rendering within RENDER_SECONDS and
    RENDER_CHARS (BoundedSandbox)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: renders what it encloses."""

        tags = {"generation"}

        def parse(self, parser):
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_enclosed")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(line)

        def _enclosed(self, caller):
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        """jinja2's namespace() that refuses attribute names starting with "_"."""

        def __init__(*args, **kwargs):  # the self-less signature of jinja2's Namespace
            self, rest = args[0], args[1:]
            attributes = dict(*rest, **kwargs)
            for name in attributes:
                SafeNamespace.refuse_private(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            SafeNamespace.refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def refuse_private(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot set {name!r} on a namespace (a name starting with _)"
                )

    class PlainDict:
        """dict(...) and dict.fromkeys(...) for templates, without the dict type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The sandbox with render_chat's limits checked at every step a template can repeat: a
        call (macros, recursion included), a loop step (each `for` iterates through `steps`),
        `*`, `**`, `+` and `%` (whose results are sized, `*` before it is computed) and a
        filter (whose result is sized)."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(jinja2.nodes.For):
                steps = jinja2.nodes.EnvironmentAttribute("steps")
                loop.iter = jinja2.nodes.Call(steps, [loop.iter], [], None, None)
                loop.iter.set_lineno(loop.lineno)
            return tree

        def steps(self, iterable):
            for item in iterable:
                check_deadline()
                yield item

        def call(*args, **kwargs):  # jinja2's (__self, __context, __obj, *args, **kwargs)
            check_deadline()
            method = args[2]
            if isinstance(getattr(method, "__self__", None), str):  # "x".center(10**9), ...
                check_arguments(method.__self__, args[3:], kwargs)
            return ImmutableSandboxedEnvironment.call(*args, **kwargs)

        def call_binop(self, context, operator, left, right):
            check_deadline()
            if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)):
                check_length(len(left) * right)  # before the product is made
            if operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
                check_length(len(right) * left)
            if operator == "**" and isinstance(right, (int, float)) and right > 64:
                if isinstance(left, int) and abs(left) > 1:
                    raise RenderLimit(f"it raises a number to the power {right}")
            return check_size(super().call_binop(context, operator, left, right))

    def bounded_filter(function):
        value = 1 if hasattr(function, "jinja_pass_arg") else 0  # after the context's argument

        def bounded(*args, **kwargs):
            check_deadline()
            check_arguments(args[value] if len(args) > value else None, args[value + 1 :], kwargs)
            return check_size(function(*args, **kwargs))

        if hasattr(function, "jinja_pass_arg"):
            bounded.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
        return bounded

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    environment = BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = tojson
    for name, function in list(environment.filters.items()):
        environment.filters[name] = bounded_filter(function)
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = PlainDict()
    environment.globals["namespace"] = SafeNamespace
    return environment


def encode_chat(
    messages: list[dict], tokenizer, template: str, special: dict[str, str], train_on="assistant"
) -> tuple[np.ndarray, np.ndarray]:
    """A conversation as token ids (int32) and its loss mask (int32, 1 where the loss is taken).

    The ids are transformers' `apply_chat_template(messages, tokenize=True)`: the rendered text
    encoded by the `tokenizers.Tokenizer` without added special tokens (the template writes them).
    (transformers 5 builds some model-specific classes, e.g. Qwen2Tokenizer, with a pre-tokenizer
    of their own instead of tokenizer.json's; where the two differ, these ids are tokenizer.json's.)
    With train_on="all" the mask is all 1. With "assistant" it is 1 on the tokens the model must
    learn to produce: each assistant message's content as the template rendered it, and the
    end-of-turn token the template writes after it (an added token such as <|eot_id|>,
    <|im_end|> or <end_of_turn>, reached over whitespace only); 0 on everything else, the
    turn headers (<|im_start|>assistant...) included, which are the prompt.

    How the assistant text is found without the `{% generation %}` blocks most templates lack:
    the template is rendered again with every assistant content wrapped in two sentinel
    characters (unicode noncharacters absent from the text; no template strips them). When that
    text, less the sentinels, is the conversation's text, the sentinels mark each content's
    characters. When it is not (a template that trims the whitespace around a content, which the
    sentinels shield), each content is located alone by two renders: with a sentinel before it,
    the text first differs from the conversation's where the content starts; with one after it,
    where the content ends; both are checked to differ only there (by the sentinel and trimmed
    whitespace), so that a template that renders other text from a content fails loudly. Tokens
    are then taken by their character offsets: every token that overlaps a content is masked,
    so a token straddling a content's edge is learned whole."""
    text = render_chat(messages, template, special)
    encoding = tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(encoding.ids, dtype=np.int32)
    if train_on == "all":
        return ids, np.ones(len(ids), dtype=np.int32)
    if train_on != "assistant":
        raise ValueError(f'train_on is "assistant" or "all", not {train_on!r}')
    spans = assistant_spans(messages, template, special, text)
    added = {int(i) for i in tokenizer.get_added_tokens_decoder()}
    return ids, span_mask(encoding.ids, encoding.offsets, spans, added, text)


def assistant_spans(
    messages: list[dict], template: str, special: dict[str, str], text: str
) -> list[tuple[int, int]]:
    """The character span in `text` (the rendering of `messages`) of each assistant message's
    content, in order (see encode_chat)."""
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    free = (c for c in SENTINELS if c not in text)
    begin, end = next(free, None), next(free, None)
    if begin is None or end is None:
        raise ValueError("a conversation holds all the unicode noncharacters U+FDD0..U+FDEF")
    wrapped = [dict(m) for m in messages]
    for i in turns:
        wrapped[i]["content"] = begin + str(messages[i].get("content", "")) + end
    marked = render_chat(wrapped, template, special)
    if marked.replace(begin, "").replace(end, "") == text:
        spans = sentinel_spans(marked, begin, end)
        if spans is not None and len(spans) == len(turns):
            return spans
    return [content_span(messages, i, template, special, text, begin) for i in turns]


def sentinel_spans(marked: str, begin: str, end: str) -> list[tuple[int, int]] | None:
    """The spans between `begin` and `end` in `marked`, as offsets into `marked` without them;
    None unless the two alternate, begin first."""
    spans, at, removed = [], 0, 0
    while (first := marked.find(begin, at)) >= 0:
        last = marked.find(end, first)
        if last < 0 or marked.find(begin, first + 1, last) >= 0:
            return None
        spans.append((first - removed, last - removed - 1))
        removed += 2
        at = last + 1
    if marked.count(end) != len(spans):
        return None
    return spans


def content_span(
    messages: list[dict], turn: int, template: str, special: dict[str, str], text: str, mark: str
) -> tuple[int, int]:
    """The span in `text` of message `turn`'s content, located by rendering it with `mark` before
    it and then after it (see encode_chat)."""
    content = str(messages[turn].get("content", ""))
    found = []
    for changed in (mark + content, content + mark):
        altered = [dict(m) for m in messages]
        altered[turn]["content"] = changed
        other = render_chat(altered, template, special)
        at = common_prefix(text, other)
        # `other` from `at` must be: whitespace, the mark, whitespace, then `text` from `at` (the
        # whitespace is what the template trimmed from the content and the mark kept)
        after = other[at:].lstrip()
        tail = text[at:]
        between = after[1 : len(after) - len(tail)]
        if not (after.startswith(mark) and after.endswith(tail) and not between.strip()):
            raise ValueError(
                f"cannot locate message {turn + 1}'s content in the conversation as the chat "
                "template renders it (the template renders text other than the content from it); "
                'train on every token with train_on = "all"'
            )
        # after the content, the common prefix can run on over the template's own whitespace
        found.append(at if changed.startswith(mark) else at - len(between))
    start, stop = found
    return start, max(start, stop)


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # a binary search over slice comparisons: C speed, not a Python loop
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def span_mask(
    ids: list[int],
    offsets: list[tuple[int, int]],
    spans: list[tuple[int, int]],
    added: set[int],
    text: str,
) -> np.ndarray:
    """1 on the tokens overlapping each span and on the end-of-turn token after it (the first
    added token after the span when only whitespace lies between), 0 elsewhere."""
    mask = np.zeros(len(ids), dtype=np.int32)
    t = 0
    for start, end in spans:
        while t < len(ids) and offsets[t][1] <= start:
            t += 1  # tokens before the span
        while t < len(ids) and offsets[t][0] < end:
            mask[t] = 1  # tokens overlapping it
            t += 1
        marker = t
        while marker < len(ids) and ids[marker] not in added and is_blank(text, offsets[marker]):
            marker += 1
        if (
            marker < len(ids)
            and ids[marker] in added
            and not text[end : offsets[marker][0]].strip()
        ):
            mask[t : marker + 1] = 1
            t = marker + 1
    return mask


def is_blank(text: str, offset: tuple[int, int]) -> bool:
    """Whether the token at `offset` in `text` is whitespace (or empty)."""
    return not text[offset[0] : offset[1]].strip()


def validate_conversation(obj, line_no: int) -> list[str]:
    """What is wrong with one parsed line of a chat file (`line_no` counts from 1), as messages
    fit for users; empty when it is a conversation to train on: an object whose `messages` is a
    list of {"role", "content"} objects, roles among system, user, assistant and tool, every
    content a string, and at least one assistant turn (else nothing would be learned)."""
    where = f"line {line_no}"
    if not isinstance(obj, dict):
        return [f"{where}: a conversation is a JSON object, not {json_kind(obj)}"]
    messages = obj.get("messages")
    if not isinstance(messages, list):
        if "messages" not in obj:
            return [f'{where}: no "messages" list (the object has {keys_of(obj)})']
        return [f'{where}: "messages" is {json_kind(messages)}, not a list of messages']
    if not messages:
        return [f'{where}: "messages" is empty']
    problems = []
    for n, message in enumerate(messages, 1):
        at = f"{where}, message {n}"
        if not isinstance(message, dict):
            problems.append(f"{at}: a message is a JSON object, not {json_kind(message)}")
            continue
        role = message.get("role")
        if role not in CHAT_ROLES:
            said = f"unknown role {role!r}" if "role" in message else "no role"
            problems.append(f"{at}: {said} (the roles are {', '.join(CHAT_ROLES)})")
        if "content" not in message:
            problems.append(f"{at}: no content")
        elif not isinstance(message["content"], str):
            problems.append(f"{at}: content is {json_kind(message['content'])}, not a string")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append(f"{where}: no assistant message (nothing for the model to learn)")
    return problems


def scan_conversations(
    path: Path, preferences: bool = False
) -> tuple[list[tuple[int, list[dict]]], list[str]]:
    """(line number, messages) of each good non-blank line of a chat file, and what is wrong with
    the others (bad JSON with its line, unknown roles, no assistant turn, ...: see
    validate_conversation). `axdsl check` and the trainer both read a file with it. With
    `preferences`, the lines are preference pairs (validate_preference), given as their objects."""
    validate = validate_preference if preferences else validate_conversation
    found, problems = [], []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                problems.append(f"line {n}: not JSON ({exc})")
                continue
            wrong = validate(obj, n)
            problems += wrong
            if not wrong:
                found.append((n, obj if preferences else obj["messages"]))
    return found, problems


def validate_preference(obj, line_no: int) -> list[str]:
    """What is wrong with one parsed line of a preferences file, as messages fit for users; empty
    when it is a pair to train on: an object with a `prompt` (a string: the user's message) or
    `messages` (the conversation so far, as validate_conversation checks it, without needing an
    assistant turn), and a `chosen` and a `rejected` answer, each a string or a list of assistant
    messages."""
    where = f"line {line_no}"
    if not isinstance(obj, dict):
        return [f"{where}: a preference pair is a JSON object, not {json_kind(obj)}"]
    problems = []
    if isinstance(obj.get("prompt"), str):
        pass
    elif isinstance(obj.get("messages"), list):
        problems += [
            p
            for p in validate_conversation({"messages": obj["messages"]}, line_no)
            if "no assistant message" not in p
        ]
    elif "prompt" in obj or "messages" in obj:  # there, but of the wrong kind
        key = "prompt" if "prompt" in obj else "messages"
        want = "a string" if key == "prompt" else "a list of messages"
        problems.append(f'{where}: "{key}" is {json_kind(obj[key])}, not {want}')
    else:
        problems.append(
            f'{where}: no "prompt" string nor "messages" list (the object has {keys_of(obj)})'
        )
    for side in ("chosen", "rejected"):
        answer = obj.get(side)
        if isinstance(answer, str):
            continue
        if not isinstance(answer, list) or not answer:
            said = json_kind(answer) if side in obj else "missing"
            problems.append(f'{where}: "{side}" is {said}, not a string or assistant messages')
            continue
        bad = [m for m in answer if not (isinstance(m, dict) and m.get("role") == "assistant")]
        if bad or any(not isinstance(m.get("content"), str) for m in answer):
            problems.append(f'{where}: "{side}" holds messages other than assistant ones')
    return problems


def preference_conversations(obj: dict) -> tuple[list[dict], list[dict], int]:
    """(chosen conversation, rejected conversation, assistant turns of the prompt) of a valid
    preference line: the prompt's messages followed by each answer's."""
    prompt = obj["messages"] if "messages" in obj and "prompt" not in obj else None
    if prompt is None:
        prompt = [{"role": "user", "content": obj["prompt"]}]

    def answer(a) -> list[dict]:
        return [{"role": "assistant", "content": a}] if isinstance(a, str) else list(a)

    turns = sum(m.get("role") == "assistant" for m in prompt)
    return prompt + answer(obj["chosen"]), prompt + answer(obj["rejected"]), turns


def answer_mask(mask: np.ndarray, skip: int) -> np.ndarray:
    """encode_chat's assistant mask less its first `skip` runs of 1s (one run per assistant
    turn): 1 on the answer's turns only, those after the prompt's."""
    starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
    out = mask.copy()
    if skip:
        out[: starts[skip] if skip < len(starts) else len(out)] = 0
    return out


def tokenizer_folder(tokenizer: str, spec: str) -> Path:
    """The directory of chat data's tokenizer: `tokenizer` names it or its tokenizer.json,
    relative to the spec's directory unless absolute (not checked to exist)."""
    path = Path(tokenizer) if Path(tokenizer).is_absolute() else Path(spec).parent / tokenizer
    return path.parent if path.suffix == ".json" else path


def json_kind(value) -> str:
    """How JSON names the kind of a parsed value, with an article: "an array", "null"."""
    kinds = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"))
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def keys_of(obj: dict) -> str:
    """The keys of an object, for a message: `"a", "b"` or "no keys"."""
    return ", ".join(json.dumps(k) for k in list(obj)[:8]) if obj else "no keys"
