"""`axdsl eval`: score a model on multiple-choice, perplexity and generation tasks.

tasks.py reads and checks task files (no jax); scoring.py runs the model (batched
log-likelihoods, windows over a text, greedy generation through the KV cache); command.py loads
the run as `axdsl sample` does, runs the tasks, prints a table and writes RUN/evals/<task>.json.
"""

from axdsl.evaluation.command import evaluate

__all__ = ["evaluate"]
