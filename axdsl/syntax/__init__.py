"""Syntax: the lark grammar, the typed AST with source spans, and file loading with imports."""
