"""The decode path shares the forward's layer functions (axdsl/codegen/decode.py `merge`): a
statement whose decode form differs runs under `if cache is None:`, the rest is written once."""

from __future__ import annotations

import re
from pathlib import Path

from axdsl.codegen.decode import _branch

ROOT = Path(__file__).resolve().parents[1]


def test_branch_keeps_the_shared_scope_and_statements_outside_the_if():
    train = ['with jax.named_scope("attn"):', "    n = norm(x)", "    h = attn(n)"]
    decode = ['with jax.named_scope("attn"):', "    n = norm(x)", "    h, c = attn(n, cache)"]
    assert _branch(train, decode) == [
        'with jax.named_scope("attn"):',
        "    n = norm(x)",
        "    if cache is None:",
        "        h = attn(n)",
        "    else:",
        "        h, c = attn(n, cache)",
    ]


def test_branch_does_not_share_a_scope_that_holds_only_part_of_the_statement():
    train = ['with jax.named_scope("a"):', "    a = f(x)", "b = g(a)"]
    decode = ['with jax.named_scope("a"):', "    a = f(x)", "b = g(a, pos)"]
    assert _branch(train, decode) == [
        'with jax.named_scope("a"):',
        "    a = f(x)",
        "if cache is None:",
        "    b = g(a)",
        "else:",
        "    b = g(a, pos)",
    ]


def test_generated_llama_has_no_decode_twins():
    code = (ROOT / "generated/llama3_8b/gpu_h100/model.py").read_text(encoding="utf-8")
    assert not re.findall(r"^def \w+_decode\(", code, re.M)
    for fn in ("attention", "block", "decoder_lm_hidden"):
        signature = re.search(rf"^def {fn}\(.*?\)", code, re.M | re.S)
        assert signature is not None and "cache: dict | None = None" in signature.group(0), fn
