"""`axdsl lsp`: the language server, over stdio, on pygls 2 and lsprotocol.

It speaks the protocol and nothing else: every answer comes from analysis.py (the compiler's own
loader and passes) and fmt.py. Checks are debounced and run in a worker thread one at a time, so
a slow spec never blocks typing; a check whose document changed meanwhile is dropped.

Initialization options (all optional): `{"target": "tpu-v5e-16"}` (default cpu) picks the target
whose sharding hovers show; `{"debounce": 0.2}` the seconds to wait after an edit.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from axdsl import __version__
from axdsl.editor import analysis as an
from axdsl.errors import CompileError, Diagnostic

_SYMBOL_KINDS = {
    an.ItemKind.LAYER: lsp.SymbolKind.Class,
    an.ItemKind.MODEL: lsp.SymbolKind.Object,
    an.ItemKind.HPARAM: lsp.SymbolKind.TypeParameter,
    an.ItemKind.PARAM: lsp.SymbolKind.Field,
    an.ItemKind.CHILD: lsp.SymbolKind.Property,
    an.ItemKind.FORWARD: lsp.SymbolKind.Method,
    an.ItemKind.SETTING: lsp.SymbolKind.Property,
    an.ItemKind.SECTION: lsp.SymbolKind.Namespace,
}
_COMPLETION_KINDS = {
    an.ItemKind.LAYER: lsp.CompletionItemKind.Class,
    an.ItemKind.MODEL: lsp.CompletionItemKind.Module,
    an.ItemKind.HPARAM: lsp.CompletionItemKind.Field,
    an.ItemKind.FUNCTION: lsp.CompletionItemKind.Function,
    an.ItemKind.KEYWORD: lsp.CompletionItemKind.Keyword,
    an.ItemKind.TYPE: lsp.CompletionItemKind.TypeParameter,
}


class AxdslServer(LanguageServer):
    """The server's state: the latest analysis of every open document and the pending checks."""

    def __init__(self, debounce: float = 0.2) -> None:
        super().__init__("axdsl", __version__)
        self.debounce = debounce
        self.target = "cpu"
        self.analyses: dict[str, an.Analysis] = {}
        self.pending: dict[str, asyncio.Task] = {}
        self.published: dict[str, set[str]] = {}  # document -> the URIs its check reported on
        self.check_lock = asyncio.Lock()

    @property
    def encoding(self) -> str:
        return str(self.workspace.position_encoding or an.UTF16)

    async def analysis(self, uri: str) -> an.Analysis:
        """The document's analysis, rechecked first when it is older than the document's text."""
        doc = self.workspace.get_text_document(uri)
        current = self.analyses.get(uri)
        if current is None or current.text != doc.source:
            current = await self.check(uri)
        return an.in_context(current, list(reversed(self.analyses.values())))

    async def check(self, uri: str) -> an.Analysis:
        """Check the document's current text in the worker thread; one check runs at a time."""
        doc = self.workspace.get_text_document(uri)
        path = Path(to_fs_path(uri) or doc.path)
        async with self.check_lock:
            result = await asyncio.to_thread(
                an.analyze, path, doc.source, self.target, self.encoding
            )
        if self.workspace.get_text_document(uri).source == result.text:
            self.analyses.pop(uri, None)  # the most recently checked last
            self.analyses[uri] = result
            self.publish(uri, result)
        return result

    def schedule(self, uri: str, delay: float) -> None:
        """Check `uri` after `delay` seconds, replacing a check still waiting for it."""
        waiting = self.pending.pop(uri, None)
        if waiting is not None:
            waiting.cancel()
        self.pending[uri] = asyncio.ensure_future(self._check_later(uri, delay))

    async def _check_later(self, uri: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self.pending.pop(uri, None)
        await self.check(uri)

    def publish(self, uri: str, result: an.Analysis) -> None:
        """Publish the diagnostics by file (an error in an imported file is reported there) and
        clear the files this document reported on before that are clean now."""
        by_uri: dict[str, list[lsp.Diagnostic]] = {uri: []}
        for d in result.diagnostics:
            target = self._uri_of(d.span.file, uri, result)
            by_uri.setdefault(target, []).append(_diagnostic(d, result, self._uri_of, uri))
        for gone in self.published.get(uri, set()) - by_uri.keys():
            by_uri[gone] = []
        self.published[uri] = {u for u, ds in by_uri.items() if ds and u != uri}
        for target, diagnostics in by_uri.items():
            self.text_document_publish_diagnostics(
                lsp.PublishDiagnosticsParams(uri=target, diagnostics=diagnostics)
            )

    def _uri_of(self, display: str, document: str, result: an.Analysis) -> str:
        """The URI of a span's file: the document's own URI for the document itself."""
        path = an.file_of(display)
        if path.resolve() == result.path or display in ("", "<unknown>"):
            return document
        return path.resolve().as_uri()


def _range(span, result: an.Analysis) -> lsp.Range:
    (sl, sc), (el, ec) = an.span_range(span, result.sources, result.encoding)
    return lsp.Range(
        start=lsp.Position(line=sl, character=sc), end=lsp.Position(line=el, character=ec)
    )


def _diagnostic(d: Diagnostic, result: an.Analysis, uri_of, document: str) -> lsp.Diagnostic:
    """A compiler diagnostic as the protocol's: the message as `axdsl check` prints it, the hint
    after it, the notes (the library line an error arose in) as related information."""
    message = d.message + (f"\nhint: {d.hint}" if d.hint else "")
    related = [
        lsp.DiagnosticRelatedInformation(
            location=lsp.Location(
                uri=uri_of(n.span.file, document, result), range=_range(n.span, result)
            ),
            message=n.message,
        )
        for n in d.notes
    ]
    return lsp.Diagnostic(
        range=_range(d.span, result),
        message=message,
        severity=lsp.DiagnosticSeverity.Error,
        source="axdsl",
        related_information=related or None,
    )


def _symbol(s: an.Symbol, result: an.Analysis) -> lsp.DocumentSymbol:
    where = _range(s.span, result)
    return lsp.DocumentSymbol(
        name=s.name,
        kind=_SYMBOL_KINDS.get(s.kind, lsp.SymbolKind.Variable),
        range=where,
        selection_range=where,
        children=[_symbol(c, result) for c in s.children] or None,
    )


def build_server(debounce: float = 0.2) -> AxdslServer:
    """The server with every feature registered."""
    server = AxdslServer(debounce)

    @server.feature(lsp.INITIALIZE)
    def initialize(ls: AxdslServer, params: lsp.InitializeParams) -> None:
        options = params.initialization_options
        if isinstance(options, dict):
            ls.target = str(options.get("target", ls.target))
            ls.debounce = float(options.get("debounce", ls.debounce))

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    async def did_open(ls: AxdslServer, params: lsp.DidOpenTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, 0.0)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: AxdslServer, params: lsp.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, ls.debounce)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    async def did_save(ls: AxdslServer, params: lsp.DidSaveTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri, 0.0)  # an imported file may have changed on disk

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: AxdslServer, params: lsp.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        waiting = ls.pending.pop(uri, None)
        if waiting is not None:
            waiting.cancel()
        ls.analyses.pop(uri, None)

    @server.feature(lsp.TEXT_DOCUMENT_HOVER)
    async def hover(ls: AxdslServer, params: lsp.HoverParams) -> lsp.Hover | None:
        result = await ls.analysis(params.text_document.uri)
        text = an.hover(result, params.position.line, params.position.character)
        if text is None:
            return None
        return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=text))

    @server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
    async def definition(ls: AxdslServer, params: lsp.DefinitionParams) -> lsp.Location | None:
        uri = params.text_document.uri
        result = await ls.analysis(uri)
        span = an.definition(result, params.position.line, params.position.character)
        if span is None:
            return None
        return lsp.Location(uri=ls._uri_of(span.file, uri, result), range=_range(span, result))

    @server.feature(lsp.TEXT_DOCUMENT_COMPLETION)
    async def completion(ls: AxdslServer, params: lsp.CompletionParams) -> lsp.CompletionList:
        result = await ls.analysis(params.text_document.uri)
        items = [
            lsp.CompletionItem(label=label, kind=_COMPLETION_KINDS.get(kind), detail=detail)
            for label, kind, detail in an.completions(result, params.position.line, 0)
        ]
        return lsp.CompletionList(is_incomplete=False, items=items)

    @server.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    async def document_symbol(
        ls: AxdslServer, params: lsp.DocumentSymbolParams
    ) -> list[lsp.DocumentSymbol]:
        result = await ls.analysis(params.text_document.uri)
        return [_symbol(s, result) for s in an.symbols(result)]

    @server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
    def formatting(ls: AxdslServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit]:
        return _format_edits(ls, params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_INLAY_HINT)
    async def inlay_hint(ls: AxdslServer, params: lsp.InlayHintParams) -> list[lsp.InlayHint]:
        result = await ls.analysis(params.text_document.uri)
        first, last = params.range.start.line, params.range.end.line
        hints = []
        for span, label in an.inlay_hints(result):
            end = _range(span, result).end
            if first <= end.line <= last:
                hints.append(lsp.InlayHint(position=end, label=label, padding_left=True))
        return hints

    return server


def _format_edits(ls: AxdslServer, uri: str) -> list[lsp.TextEdit]:
    """One edit replacing the whole document with `axdsl fmt`'s layout; none when the document
    is already formatted or does not parse (its diagnostics say why)."""
    from axdsl.editor.fmt import format_source

    doc = ls.workspace.get_text_document(uri)
    try:
        formatted = format_source(doc.source, doc.path)
    except CompileError:
        return []
    if formatted == doc.source:
        return []
    lines = doc.source.split("\n")
    end = lsp.Position(
        line=len(lines) - 1,
        character=sum(an.char_units(c, ls.encoding) for c in lines[-1]),
    )
    whole = lsp.Range(start=lsp.Position(line=0, character=0), end=end)
    return [lsp.TextEdit(range=whole, new_text=formatted)]


def serve(debounce: float = 0.2) -> None:
    """Run the server on stdin/stdout until the client shuts it down."""
    logging.basicConfig(level=logging.WARNING)
    build_server(debounce).start_io()
