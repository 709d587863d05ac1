"""IR passes. Each module holds one pass, a function `module -> module` without hidden state
(the target's name is `module.target_name`). The ordered list lives in `axdsl/pipeline.py`.
"""
