"""The language in the editor: `axdsl fmt`, the highlighting lexers and `axdsl lsp`.

Nothing here imports jax: formatting and editor checks stay fast and run where jax is absent.
"""
