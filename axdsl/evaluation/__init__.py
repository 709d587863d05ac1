"""`axdsl eval`: score a model on multiple-choice, perplexity and generation tasks.

command.py loads the run as `axdsl sample` does, runs the tasks, prints a table and writes
RUN/evals/<task>.json. Reading task files and scoring by log-likelihood live in the runtime
(axdsl/runtime/eval_tasks.py, evals.py), since a train block's `evals = [...]` runs them inside
the generated train.py; generation goes through sample's KV-cache path.
"""

from axdsl.evaluation.command import evaluate

__all__ = ["evaluate"]
