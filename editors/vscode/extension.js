// The axdsl extension: .axl highlighting comes from package.json's grammar; everything else
// (diagnostics, hover, definitions, completion, symbols, formatting) from `axdsl lsp` over stdio.
"use strict";
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace
    .getConfiguration("axdsl")
    .get("server.command", ["axdsl", "lsp"]);
  client = new LanguageClient(
    "axdsl",
    "axdsl language server",
    { command, args },
    { documentSelector: [{ scheme: "file", language: "axl" }] }
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
