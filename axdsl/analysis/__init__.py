"""Analytic figures from the IR: model FLOPs, parameter counts and per-chip memory (no jax)."""

from axdsl.analysis.flops import FlopCount, ParamCount, model_flops, param_count, training_flops

__all__ = ["FlopCount", "ParamCount", "model_flops", "param_count", "training_flops"]
