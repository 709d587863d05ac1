"""IR passes. Each module holds one pass, a function `(module, target) -> module` without hidden state.

The ordered list lives in `axdsl/pipeline.py`.
"""
