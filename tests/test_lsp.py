"""`axdsl lsp` end to end: a real server process over stdio, driven by pytest-lsp's client with
the recorded capabilities of VS Code and of Neovim (which negotiates UTF-8 positions). One server
per client for the whole module."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp")
from lsprotocol import types as lsp  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402

from axdsl.editor.fmt import format_source  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
CLIENTS = ["visual-studio-code", "neovim@v0.11.0"]
# Error fixtures and where their first `# expect:` line says the error is.
FIXTURES = [
    "axis_used_twice",
    "syntax_unexpected_token",
    "unknown_function",
    "hparam_bound_broken",
    "rope_scaling_unknown",
]
module_loop = pytest.mark.asyncio(loop_scope="module")  # the tests share one server per client


@pytest_lsp.fixture(
    scope="module",
    params=CLIENTS,
    config=ClientServerConfig(
        server_command=[sys.executable, "-m", "axdsl", "lsp"], server_env=ENV
    ),
)
async def client(request, lsp_client: LanguageClient):
    await lsp_client.initialize_session(
        lsp.InitializeParams(
            capabilities=client_capabilities(request.param),
            root_uri=REPO.as_uri(),
            initialization_options={"debounce": 0.05},
        )
    )
    yield
    await lsp_client.shutdown_session()


def _encoding(client: LanguageClient) -> str:
    """The position encoding the server chose for this client (UTF-8 for Neovim 0.11)."""
    general = client.capabilities.general if client.capabilities else None
    offered = (general.position_encodings if general else None) or ["utf-16"]
    return str(offered[0])


def _column(line: str, col: int, encoding: str) -> int:
    """The protocol column of 1-based character column `col`, computed here independently."""
    prefix = line[: col - 1]
    if encoding == "utf-8":
        return len(prefix.encode("utf-8"))
    if encoding == "utf-32":
        return len(prefix)
    return len(prefix.encode("utf-16-le")) // 2


def _open(client: LanguageClient, path: Path, text: str | None = None) -> str:
    uri = path.resolve().as_uri()
    text = path.read_text(encoding="utf-8") if text is None else text
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(
            text_document=lsp.TextDocumentItem(uri=uri, language_id="axl", version=1, text=text)
        )
    )
    return uri


async def _diagnostics(client: LanguageClient, uri: str) -> list[lsp.Diagnostic]:
    while uri not in client.diagnostics:
        await asyncio.wait_for(
            client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS), timeout=60
        )
    return client.diagnostics.pop(uri)


def _expected(path: Path) -> tuple[int, int, str]:
    """(line, column, message) of a fixture's first `# expect:` line (1-based)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# expect:"):
            where, _, message = line.removeprefix("# expect:").strip().partition(": error: ")
            _, number, col = where.rsplit(":", 2)
            return int(number), int(col), message
    raise AssertionError(f"{path} has no `# expect:` line")


def _pos(text: str, needle: str, offset: int = 0) -> lsp.Position:
    """The position of `needle` in `text` (its lines are ASCII: characters are code units)."""
    i = text.index(needle) + offset
    return lsp.Position(line=text.count("\n", 0, i), character=i - text.rfind("\n", 0, i) - 1)


@module_loop
async def test_diagnostics_of_error_fixtures(client: LanguageClient):
    encoding = _encoding(client)
    for name in FIXTURES:
        path = REPO / "tests" / "errors" / f"{name}.axl"
        line, col, message = _expected(path)
        found = await _diagnostics(client, _open(client, path))
        text_line = path.read_text(encoding="utf-8").splitlines()[line - 1]
        start = lsp.Position(line=line - 1, character=_column(text_line, col, encoding))
        assert any(d.range.start == start and d.message.startswith(message) for d in found), (
            name,
            start,
            message,
            found,
        )
        assert all(
            d.severity == lsp.DiagnosticSeverity.Error and d.source == "axdsl" for d in found
        )


@module_loop
async def test_a_note_in_std_is_related_information(client: LanguageClient):
    """The library line an error arose in (`note: raised here`) travels with the error."""
    path = REPO / "tests" / "errors" / "head_dim_division_not_exact.axl"
    line, col, message = _expected(path)
    (found,) = await _diagnostics(client, _open(client, path))
    assert found.range.start.line == line - 1 and found.message.startswith(message)
    assert "\nhint: the divisor must divide the dividend" in found.message
    (note,) = found.related_information
    std = REPO / "axdsl" / "std" / "transformer.axl"
    assert note.location.uri == std.resolve().as_uri()
    where = _pos(std.read_text(encoding="utf-8"), "head_dim: int = dim / heads")
    assert note.location.range.start == where  # Attention's hyperparameter of that default
    assert note.message.startswith("raised here, in the default of a layer")


@module_loop
async def test_positions_count_code_units_after_non_ascii(client: LanguageClient, tmp_path):
    text = (
        'import "std/transformer.axl"\n'
        "model m = DecoderLM {\n"
        "  vocab = 256  dim = 64  heads = 2\n"
        '  positions = "rópe🙂"  layers = bogus\n'
        "}\n"
    )
    found = await _diagnostics(client, _open(client, tmp_path / "unicode.axl", text))
    bogus = next(d for d in found if "bogus" in d.message)
    line = text.splitlines()[3]
    expected = _column(line, line.index("bogus") + 1, _encoding(client))
    assert bogus.range.start == lsp.Position(line=3, character=expected)
    assert expected != line.index("bogus")  # the emoji and ó count differently from characters
    assert "unknown name `bogus`" in bogus.message


@module_loop
async def test_changes_are_rechecked(client: LanguageClient, tmp_path):
    path = tmp_path / "edit.axl"
    good = (
        'import "std/transformer.axl"\n'
        "model m = DecoderLM { vocab = 256  dim = 64  heads = 2  layers = 1 }\n"
    )
    uri = _open(client, path, good)
    assert not await _diagnostics(client, uri)
    client.text_document_did_change(
        lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                lsp.TextDocumentContentChangeWholeDocument(text=good.replace("64", "6x"))
            ],
        )
    )
    (changed,) = await _diagnostics(client, uri)
    assert "syntax error" in changed.message


@module_loop
async def test_checks_are_debounced(client: LanguageClient, tmp_path):
    """Edits in quick succession are checked once, at the last text."""
    good = (
        'import "std/transformer.axl"\n'
        "model m = DecoderLM { vocab = 256  dim = 64  heads = 2  layers = 1 }\n"
    )
    uri = _open(client, tmp_path / "typing.axl", good)
    assert not await _diagnostics(client, uri)
    for version, text in enumerate([good.replace("64", "6x"), good.replace("64", "bogus"), good]):
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version + 2),
                content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )
    assert not await _diagnostics(client, uri)  # the last text's: clean
    await asyncio.sleep(0.3)  # six debounce periods: no check of an older text follows
    assert uri not in client.diagnostics


@module_loop
async def test_hover_and_definition_into_std(client: LanguageClient):
    path = REPO / "specs" / "tiny_llama.axl"
    text = path.read_text(encoding="utf-8")
    uri = _open(client, path)
    document = lsp.TextDocumentIdentifier(uri=uri)
    setting = await client.text_document_hover_async(lsp.HoverParams(document, _pos(text, "ffn")))
    assert setting is not None
    assert "ffn: int = 128  # set at specs/tiny_llama.axl" in setting.contents.value
    llama = (REPO / "specs" / "llama3_8b.axl").read_text(encoding="utf-8")
    llama_uri = _open(client, REPO / "specs" / "llama3_8b.axl")
    layer = await client.text_document_hover_async(
        lsp.HoverParams(lsp.TextDocumentIdentifier(uri=llama_uri), _pos(llama, "DecoderLM"))
    )
    assert layer is not None and "layer DecoderLM(" in layer.contents.value
    assert "forward(tokens: [B, S], segments: [B, S] if packed) -> [B, S, vocab]" in layer.contents.value
    found = await client.text_document_definition_async(
        lsp.DefinitionParams(lsp.TextDocumentIdentifier(uri=llama_uri), _pos(llama, "DecoderLM"))
    )
    std = REPO / "axdsl" / "std" / "transformer.axl"
    assert isinstance(found, lsp.Location) and found.uri == std.resolve().as_uri()
    std_line = std.read_text(encoding="utf-8").splitlines()[found.range.start.line]
    assert std_line[found.range.start.character :].startswith("DecoderLM(")
    std_text = std.read_text(encoding="utf-8")
    std_uri = _open(client, std)
    member = await client.text_document_hover_async(
        lsp.HoverParams(lsp.TextDocumentIdentifier(uri=std_uri), _pos(std_text, "param wq", 7))
    )
    assert member is not None  # a library layer's member, seen through the specs that use it
    assert "param wq: [dim, heads, head_dim] axes(embed, heads, head_dim)" in member.contents.value
    assert "llama3_8b /blocks/attn: param wq: [layers=32, dim=4096, heads=32, head_dim=128]" in (
        member.contents.value
    )
    imported = await client.text_document_definition_async(
        lsp.DefinitionParams(document, _pos(text, '"llama3_8b.axl"', 2))
    )
    assert isinstance(imported, lsp.Location)
    assert imported.uri == (REPO / "specs" / "llama3_8b.axl").resolve().as_uri()


@module_loop
async def test_formatting_symbols_completion_and_hints(client: LanguageClient, tmp_path):
    messy = 'import "llama3_8b.axl"\nmodel  t extends llama3_8b{vocab=256\n   dim = 64 }\n'
    path = tmp_path / "messy.axl"
    (tmp_path / "llama3_8b.axl").write_text(
        (REPO / "specs" / "llama3_8b.axl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    uri = _open(client, path, messy)
    document = lsp.TextDocumentIdentifier(uri=uri)
    edits = await client.text_document_formatting_async(
        lsp.DocumentFormattingParams(
            document, lsp.FormattingOptions(tab_size=2, insert_spaces=True)
        )
    )
    assert edits is not None and len(edits) == 1
    assert edits[0].new_text == format_source(messy, "messy.axl")
    assert edits[0].range.start == lsp.Position(line=0, character=0)
    symbols = await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(document))
    assert [s.name for s in symbols] == ["t"]
    assert [c.name for c in symbols[0].children] == ["vocab", "dim"]
    completion = await client.text_document_completion_async(
        lsp.CompletionParams(document, lsp.Position(line=2, character=3))
    )
    labels = {item.label for item in completion.items}
    assert {"DecoderLM", "rope_theta", "attention", "einsum", "llama3_8b"} <= labels
    hints = await client.text_document_inlay_hint_async(
        lsp.InlayHintParams(
            document,
            lsp.Range(lsp.Position(line=0, character=0), lsp.Position(line=3, character=0)),
        )
    )
    assert len(hints) == 1 and "rope_theta = 500000.0" in hints[0].label


def test_a_warm_check_of_llama3_8b_is_fast():
    """What the server runs after each edit, in-process: under 0.3 s once warm (about 0.06 s)."""
    from axdsl.editor.analysis import analyze

    path = REPO / "specs" / "llama3_8b.axl"
    text = path.read_text(encoding="utf-8")
    runs = [analyze(path, text) for _ in range(3)]
    assert not runs[-1].diagnostics and runs[-1].module is not None
    assert min(r.seconds for r in runs[1:]) < 0.3, [r.seconds for r in runs]


def test_hover_shows_the_targets_sharding():
    """A library layer's parameter, seen through a spec built for gpu-h100-8: sharded on fsdp."""
    from axdsl.editor.analysis import analyze, hover, in_context

    spec = REPO / "specs" / "llama3_8b.axl"
    built = analyze(spec, spec.read_text(encoding="utf-8"), "gpu-h100-8")
    std = REPO / "axdsl" / "std" / "transformer.axl"
    text = std.read_text(encoding="utf-8")
    library = in_context(analyze(std, text), [built])
    where = _pos(text, "param wq", 7)
    shown = hover(library, where.line, where.character)
    assert shown is not None and "for target `gpu-h100-8`" in shown
    assert "head_dim=128] axes(layers, embed, heads, head_dim) f32 shard(_, fsdp, _, _)" in shown


def test_the_editor_never_imports_jax():
    """fmt and the server's checks run where jax is absent, and start fast."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from axdsl.editor import lsp\n"
        "from axdsl.editor.analysis import analyze\n"
        "from axdsl.editor.fmt import format_source\n"
        "p = Path('specs/llama3_8b.axl')\n"
        "assert not analyze(p, p.read_text()).diagnostics\n"
        "format_source(p.read_text(), str(p))\n"
        "print('jax' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    "name",
    [*FIXTURES, "head_dim_division_not_exact", "target_unknown_mesh_axis", "import_cycle"],
)
def test_diagnostics_are_what_axdsl_check_prints(name: str, monkeypatch, capsys):
    """The server's diagnostics are `axdsl check`'s, message for message, hints and notes too."""
    from axdsl.cli import main
    from axdsl.editor.analysis import analyze
    from axdsl.errors import CompileError

    monkeypatch.chdir(REPO)
    path = Path("tests") / "errors" / f"{name}.axl"
    text = path.read_text(encoding="utf-8")
    target = next(
        (
            line.removeprefix("# target:").strip()
            for line in text.splitlines()
            if line.startswith("# target:")
        ),
        "cpu",
    )
    assert main(["check", str(path), "--target", target]) == 1
    printed = capsys.readouterr().err
    found = analyze(path, text, target)
    assert found.diagnostics
    assert CompileError(found.diagnostics, found.sources).render() + "\n" == printed


def test_a_keyword_argument_leads_to_its_layers_hyperparameter():
    """`Attention(rope = false)` in a model: `rope` is Attention's, in std/, set here."""
    from axdsl.editor.analysis import analyze, definition, hover

    spec = REPO / "specs" / "gpt2_small.axl"
    text = spec.read_text(encoding="utf-8")
    checked = analyze(spec, text)
    where = _pos(text, "rope = false")
    span = definition(checked, where.line, where.character)
    assert span is not None and span.file == "std/transformer.axl"
    std_line = (REPO / "axdsl" / "std" / "transformer.axl").read_text(encoding="utf-8")
    assert std_line.splitlines()[span.line - 1][span.col - 1 :].startswith("rope: bool = true")
    shown = hover(checked, where.line, where.character)
    assert shown is not None and "Attention.rope: bool = true" in shown
    assert "gpt2_small /blocks/attn: rope = false  # set at specs/gpt2_small.axl:9:" in shown


def test_children_show_the_dims_they_inherit():
    """In std/transformer.axl seen through llama3_8b: Block's `child attn = attn` takes dim,
    heads, kv_heads from the model and norm from Block; the hint ends the child's line."""
    from axdsl.editor.analysis import analyze, in_context, inlay_hints

    spec = REPO / "specs" / "llama3_8b.axl"
    built = analyze(spec, spec.read_text(encoding="utf-8"))
    std = REPO / "axdsl" / "std" / "transformer.axl"
    text = std.read_text(encoding="utf-8")
    hints = dict(
        ((span.line, span.col), label)
        for span, label in inlay_hints(in_context(analyze(std, text), [built]))
    )
    line = _pos(text, "child attn = attn").line
    label = hints[(line + 1, len(text.splitlines()[line]) + 1)]
    assert label.startswith("dim = 4096, heads = 32, kv_heads = 8")
    assert label.endswith("norm = RMSNorm(eps = 1e-05), packed = false from /, /blocks")


def test_a_compiler_bug_is_a_diagnostic_not_a_dead_server(monkeypatch):
    import axdsl.pipeline
    from axdsl.editor.analysis import analyze

    def broken(*args, **kwargs):
        raise KeyError("no such pass")

    monkeypatch.setattr(axdsl.pipeline, "run_passes", broken)
    spec = REPO / "specs" / "tiny_llama.axl"
    (bug,) = analyze(spec, spec.read_text(encoding="utf-8")).diagnostics
    assert bug.span.line == 1 and bug.message.startswith("internal error (a bug in axdsl")
    assert "KeyError: 'no such pass'" in bug.message
