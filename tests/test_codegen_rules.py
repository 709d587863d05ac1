"""The libcst check rejects anything outside the allowed shape of generated code."""

import pytest

from axdsl.codegen.format import GeneratedCodeError, check_generated


@pytest.mark.parametrize(
    "source, problem",
    [
        ("import axdsl\nprint(axdsl)\n", "must not import axdsl"),
        ("import requests\nrequests.get\n", "not allowed"),
        ("import jax\n", "unused import `jax`"),
        ("from os import *\n", "star imports"),
        ("eval('1')\n", "call of `eval`"),
        ("exec('x = 1')\n", "call of `exec`"),
        ("def f(:\n", "does not parse"),
    ],
)
def test_check_generated_rejects(source, problem):
    with pytest.raises(GeneratedCodeError, match=problem):
        check_generated(source, "model.py")


def test_check_generated_accepts_plain_jax():
    check_generated("import jax\nimport jax.numpy as jnp\nx = jnp.ones(3) + jax.numpy.zeros(3)\n", "m.py")
