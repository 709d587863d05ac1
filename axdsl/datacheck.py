"""`axdsl check`'s look at the training data a spec names, where the data already exists.

The trainer checks its data before the first step (train.py via runtime.load_data). A split too
short for `seq` is a mistake in the spec, though, and waiting for `axdsl train` to find it costs
the user a build and a JAX start. This module sizes the data from the file system alone (no read
of the tokens, no jax) and reports, located at the `data = ...` line, what would stop training:
an empty source, a token file of a partial id, a binary file in a text source (a NUL byte near its
start), a train or eval split shorter than one sequence; for pairs(...), each file's ids; for
arrays(...), the .npz's images and labels against the model's image shape (headers only); for
chat(...), the tokenizer and its chat template, and every line of the file (JSON, roles, an
assistant turn), with the trainer's own reader (axdsl/runtime/chat.py, which imports no jax).

The split rule is runtime.py's: the last 2% of the tokens are held out; a batch row reads
seq + 1 tokens from a random start, so a split needs seq + 2.
"""

from __future__ import annotations

from pathlib import Path

from axdsl.errors import Diagnostic, filled
from axdsl.ir import nodes as ir

KEPT = 0.98  # runtime.split: the first 98% of the tokens train, the last 2% are the eval split
BINARY_PROBE = (
    8192  # runtime.BINARY_PROBE: a text file with a NUL byte this near its start is binary
)


def data_problems(module: ir.Module, spec: Path) -> list[Diagnostic]:
    """Located errors for data that exists and cannot train the spec's `seq` (none otherwise)."""
    settings = module.train_settings
    if settings is None:
        return []
    choice = settings.choice("data")
    source = choice.value
    if choice.span is None:
        return []
    if source.kind == ir.DataKind.PAIRS:
        return [Diagnostic(choice.span, m) for m in _pairs_problems(source, spec)]
    if source.kind == ir.DataKind.ARRAYS:
        return [Diagnostic(choice.span, m, h) for m, h in _arrays_problems(module, source, spec)]
    if source.kind in (ir.DataKind.CHAT, ir.DataKind.PREFERENCES):
        return [Diagnostic(choice.span, m, h) for m, h in _chat_problems(source, spec, settings)]
    if source.kind not in (ir.DataKind.TOKENS, ir.DataKind.TEXT):
        return []  # the standard library's sources (tens of MiB), or a set made on the machine
    path = _resolve(source.path, spec)
    count = _token_count(source, path)
    if isinstance(count, str):
        return [Diagnostic(choice.span, count)]
    if count is None:
        return []  # not there yet: train.py says so if it still is not
    if source.kind == ir.DataKind.TEXT and (binary := _first_binary(path)) is not None:
        which = f"{path}" if binary == path else f"{path}: {binary}"
        return [
            Diagnostic(
                choice.span,
                f"text data {which} is binary (a NUL byte in its first "
                f"{BINARY_PROBE // 1024} KiB)",
                "text() trains on text files: use tokens(...) for token ids",
            )
        ]
    return [Diagnostic(choice.span, m, h) for m, h in _split_problems(count, settings)]


def _resolve(name: str | None, spec: Path) -> Path:
    """A data file's path (configure_train requires every file a source reads) as the trainer
    resolves it: relative to the spec's directory."""
    path = Path(filled(name, "a data file's path", "configure_train"))
    return path if path.is_absolute() else spec.parent / path  # as the trainer resolves it


def _pairs_problems(source: ir.DataSource, spec: Path) -> list[str]:
    """pairs(source, target): each file that exists is non-empty and holds whole ids."""
    out = []
    for name in (source.path, source.path2):
        count = _token_count(
            ir.DataSource(ir.DataKind.TOKENS, name, source.dtype), _resolve(name, spec)
        )
        if isinstance(count, str):
            out.append(count)
    return out


def _arrays_problems(module: ir.Module, source: ir.DataSource, spec: Path) -> list[tuple[str, str]]:
    """arrays("x.npz"), when it exists: `images` [N, H, W, C] of the model's image shape and integer
    `labels` [N], read from the .npy headers only (no data is loaded), and enough examples to hold
    one out for evaluation."""
    path = _resolve(source.path, spec)
    if not path.exists():
        return []  # not there yet: train.py says so if it still is not
    arrays = _npz_headers(path)
    if isinstance(arrays, str):
        return [
            (
                f"arrays data {path} is not a readable .npz file: {arrays}",
                "write it with numpy.savez(path, images=..., labels=...), "
                "or give a directory of images.npy and labels.npy",
            )
        ]
    root = module.models[0].root
    images = (
        next((a for a in root.forward.args if a.name == "images"), None) if root.forward else None
    )
    if images is None:
        return []
    shape = tuple(d.size for d in images.dims[1:])
    want = f"images [N, {', '.join(map(str, shape))}] and labels [N]"
    if "images" not in arrays or "labels" not in arrays:
        return [
            (
                f"arrays data {path} holds {sorted(arrays) or 'no arrays'}; the model reads {want}",
                "np.savez(path, images=..., labels=...)",
            )
        ]
    (ishape, _), (lshape, ldtype) = arrays["images"], arrays["labels"]
    if tuple(ishape[1:]) != shape or tuple(lshape) != tuple(ishape[:1]):
        return [
            (
                f"arrays data {path}: images are {list(ishape)} and labels {list(lshape)}; "
                f"the model reads {want}",
                "one label per image, every image of the model's shape",
            )
        ]
    if ldtype.kind not in "iu":
        return [
            (
                f"arrays data {path}: labels are {ldtype}, not integers",
                "labels are class ids 0, 1, ...",
            )
        ]
    if module.train.get("eval_every") and ishape[0] < 2:
        return [
            (
                f"arrays data {path} holds {ishape[0]} example(s): "
                "none is left to hold out for evaluation",
                "add data or set eval_every = 0",
            )
        ]
    return []


CHAT_LINE = '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}'
PREFERENCE_LINE = (
    '{"prompt": "...", "chosen": "...", "rejected": "..."} (or "messages" for "prompt")'
)
SHOWN = 5  # a chat file's problems listed, of all those found
TEMPLATE_HINT = (
    "the data is rendered with the tokenizer's chat template (chat_template.jinja, or "
    "tokenizer_config.json's chat_template): fix it there, or give another tokenizer"
)


def _chat_problems(
    source: ir.DataSource, spec: Path, settings: ir.TrainSettings
) -> list[tuple[str, str]]:
    """chat("x.jsonl", tokenizer = ...): the tokenizer has a chat template; the file, when it
    exists, holds conversations only (each line one: see runtime's validate_conversation), at
    least two when there is an eval split. preferences(...): the same of preference pairs
    (validate_preference)."""
    from axdsl.runtime import chat

    tokenizer = filled(source.tokenizer, "chat data's tokenizer", "configure_train")
    folder = chat.tokenizer_folder(filled(tokenizer.path, "its path", "configure_train"), str(spec))
    if not (folder / "tokenizer.json").is_file():
        return [
            (
                f"tokenizer {tokenizer.path!r} is not a tokenizer.json nor a directory holding one "
                f"(looked in {folder})",
                "give the directory of a Hugging Face tokenizer (`axdsl import-hf` writes one), "
                "relative to the spec",
            )
        ]
    try:
        template = chat.load_template(folder)
        chat.compile_template(template)
    except chat.TemplateFailure as exc:
        return [(f"the chat template of {folder} does not compile: {exc}", TEMPLATE_HINT)]
    except ValueError as exc:
        return [(str(exc), "the data is rendered with the tokenizer's own chat template")]
    path, pairs = _resolve(source.path, spec), source.kind is ir.DataKind.PREFERENCES
    if not path.is_file():
        return []  # not there yet: train.py says so if it still is not
    try:
        found, problems = chat.scan_conversations(path, pairs)
    except OSError as exc:
        return [(f"{source.kind} data {path} cannot be read: {exc.strerror or exc}", "")]
    hint = (
        f"each line is one pair: {PREFERENCE_LINE}"
        if pairs
        else f"each line is one conversation: {CHAT_LINE}"
    )
    if problems:
        more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        return [(f"{source.kind} data {path}: {p}", hint) for p in problems[: SHOWN - 1]] + [
            (f"{source.kind} data {path}: {p}{more}", hint) for p in problems[SHOWN - 1 : SHOWN]
        ]
    what = "pair" if pairs else "conversation"
    if not found:
        return [(f"{source.kind} data {path} holds no {what}", hint)]
    if failure := _first_render(found[0], pairs, template, folder):
        return [(f"{source.kind} data {path}, line {found[0][0]}: {failure}", TEMPLATE_HINT)]
    if settings.get("eval_every") and len(found) < 2:
        return [
            (
                f"{source.kind} data {path} holds one {what}: none is left for the eval split",
                "add conversations or set eval_every = 0",
            )
        ]
    return []


def _first_render(first: tuple, pairs: bool, template: str, folder: Path) -> str | None:
    """What is wrong rendering the file's first conversation (a pair's chosen one) with the
    chat template, as the trainer renders every one (runtime's render_chat, in its sandbox and
    limits); None when it renders."""
    from axdsl.runtime import chat

    messages = chat.preference_conversations(first[1])[0] if pairs else first[1]
    try:
        chat.render_chat(messages, template, chat.load_special_tokens(folder))
    except ValueError as exc:
        return f"the chat template of {folder} fails: {exc}"
    return None


def _npz_headers(path: Path) -> dict | str:
    """{name: (shape, dtype)} of the arrays of a .npz or a directory of .npy files, from their .npy
    headers; or what is wrong."""
    import zipfile

    out = {}
    if path.is_dir():  # a directory of NAME.npy files
        for file in sorted(path.glob("*.npy")):
            header = _npy_header(file)
            if isinstance(header, str):
                return f"{file.name}: {header}"
            out[file.stem] = header
        return out
    try:
        with path.open("rb") as f:
            if f.read(6) == b"\x93NUMPY":
                return (
                    "it is one .npy array, not a .npz of named arrays "
                    "(or a directory of .npy files)"
                )
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if not name.endswith(".npy"):
                    continue
                with z.open(name) as f:
                    out[name[:-4]] = _read_npy_header(f)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        return str(exc)[:200]
    return out


def _npy_header(path: Path) -> tuple | str:
    """(shape, dtype) of a .npy file from its header; or what is wrong."""
    try:
        with path.open("rb") as f:
            return _read_npy_header(f)
    except (OSError, ValueError, EOFError) as exc:
        return str(exc)[:200]


def _read_npy_header(f) -> tuple:
    """(shape, dtype) from the .npy header at f's position (numpy's format module, no data read)."""
    import numpy as np

    major, _ = np.lib.format.read_magic(f)
    read = (
        np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read(f)
    return shape, dtype


def _first_binary(path: Path) -> Path | None:
    """The first file of a text source with a NUL byte near its start (runtime.binary_files'
    rule)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        try:
            with file.open("rb") as f:
                if b"\0" in f.read(BINARY_PROBE):
                    return file
        except OSError:
            continue  # unreadable: the trainer names it
    return None


def _token_count(source: ir.DataSource, path: Path) -> int | str | None:
    """How many tokens the source holds (a text byte is a token), a problem, or None if absent."""
    try:
        if not path.exists():
            return None
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            if not files:
                return f"data directory {path} holds no files"
            return sum(p.stat().st_size for p in files) + len(files) - 1  # joined by newlines
        size = path.stat().st_size
    except OSError as exc:
        return f"data {path} cannot be read: {exc.strerror or exc}"
    if size == 0:
        return f"data file {path} is empty"
    if source.kind == ir.DataKind.TOKENS:
        ids = source.dtype or ir.TokenWidth.U16
        width = ids.bytes
        if size % width:
            return (
                f"token file {path} has {size} bytes, not a whole number of {ids} ids: "
                f"is its dtype right?"
            )
        return size // width
    return size


def _split_problems(count: int, settings: ir.TrainSettings) -> list[tuple[str, str]]:
    """What the trainer would refuse: a split of `count` tokens too short for one sequence."""
    seq, eval_every = settings.get("seq"), settings.get("eval_every")
    cut = int(count * KEPT)  # exactly runtime.split's cut
    train, held_out, need = cut, count - cut, seq + 2
    if train < need:
        return [
            (
                f"the data holds {count} tokens: its training split has {train}, "
                f"one sequence needs {need} (seq {seq})",
                "add data or lower seq",
            )
        ]
    if eval_every and held_out < need:
        return [
            (
                f"the eval split (the last 2% of the data's {count} tokens) has {held_out}, one "
                f"sequence needs {need} (seq {seq})",
                "add data, lower seq or set eval_every = 0",
            )
        ]
    return []
