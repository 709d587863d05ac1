"""The IR's Config expressions (axdsl/ir/expr.py): built by irbuild as trees, printed with the
fewest parentheses Python needs, and asked questions as trees, never as text."""

from __future__ import annotations

import ast
import random

from axdsl.codegen.pyexpr import py
from axdsl.ir.dtypes import DType
from axdsl.ir.expr import (
    BinOp,
    Binary,
    Call,
    Const,
    Expr,
    Field,
    MathFn,
    Unary,
    UnaryOp,
    field_of,
    ops_of,
    reads_config,
    spec_text,
)

A, B, C = Field("a"), Field("b"), Field("c")


def _bin(op: str, left: Expr, right: Expr) -> Binary:
    return Binary(BinOp(op), left, right)


def test_parentheses_only_where_precedence_needs_them():
    assert py(_bin("*", _bin("*", A, B), C)) == "cfg.a * cfg.b * cfg.c"
    assert py(_bin("*", A, _bin("*", B, C))) == "cfg.a * (cfg.b * cfg.c)"
    assert py(_bin("-", A, _bin("-", B, C))) == "cfg.a - (cfg.b - cfg.c)"
    assert py(_bin("*", _bin("+", A, B), C)) == "(cfg.a + cfg.b) * cfg.c"
    assert py(_bin("+", _bin("*", A, B), C)) == "cfg.a * cfg.b + cfg.c"
    assert py(_bin("//", _bin("//", A, Const(2)), Const(2))) == "cfg.a // 2 // 2"
    assert py(_bin("/", Const(1), Call(MathFn.SQRT, (A,)))) == "1 / math.sqrt(cfg.a)"
    assert py(Unary(UnaryOp.NEG, _bin("+", A, B))) == "-(cfg.a + cfg.b)"
    assert py(_bin("*", Const(-1), A)) == "-1 * cfg.a"
    assert py(_bin("-", A, Const(-1))) == "cfg.a - -1"
    # Python chains comparisons: a compared comparison keeps its parentheses
    assert py(_bin("==", _bin("<", A, B), Const(True))) == "(cfg.a < cfg.b) == True"
    assert py(Unary(UnaryOp.NOT, _bin("and", A, B))) == "not (cfg.a and cfg.b)"
    assert py(_bin("or", Unary(UnaryOp.NOT, A), B)) == "not cfg.a or cfg.b"


def test_leaves_are_spelled_by_the_printer():
    e = _bin("*", Field("dim"), Call(MathFn.MIN, (Const(2), Const(3.5))))
    assert py(e) == "cfg.dim * min(2, 3.5)"
    assert py(Const(DType("bf16"))) == "jnp.bfloat16"
    assert spec_text(Const(DType("bf16"))) == "bf16"
    assert spec_text(Const(True)) == "true" and py(Const(True)) == "True"
    assert spec_text(Call(MathFn.SQRT, (A,))) == "sqrt(cfg.a)"


def test_questions_are_asked_of_the_tree():
    head_dim = _bin("//", Field("dim"), Field("heads"))
    assert reads_config(head_dim) and not reads_config(_bin("+", Const(1), Const(2)))
    assert field_of(Field("ffn")) == "ffn" and field_of(head_dim) is None and field_of(None) is None
    assert ops_of(_bin("+", head_dim, Const(1))) == {BinOp.ADD, BinOp.FLOORDIV}
    assert Const(2) != Const(2.0) and Const(1) != Const(True)  # they print differently
    assert Const(2) == Const(2) and hash(Const(2)) == hash(Const(2))


def _from_python(node: ast.expr) -> Expr:
    """Read printed Python back into a tree: what Python parses is what the tree says."""
    if isinstance(node, ast.Attribute):
        return Field(node.attr)
    if isinstance(node, ast.Constant):
        return Const(node.value)
    if isinstance(node, ast.UnaryOp):
        op = UnaryOp.NEG if isinstance(node.op, ast.USub) else UnaryOp.NOT
        return Unary(op, _from_python(node.operand))
    if isinstance(node, ast.BoolOp):  # Python flattens `a and b and c`: fold it left
        op = BinOp.AND if isinstance(node.op, ast.And) else BinOp.OR
        tree = _from_python(node.values[0])
        for value in node.values[1:]:
            tree = Binary(op, tree, _from_python(value))
        return tree
    if isinstance(node, ast.Compare):
        assert len(node.ops) == 1  # never a chain
        symbol = {
            ast.Lt: "<",
            ast.LtE: "<=",
            ast.Gt: ">",
            ast.GtE: ">=",
            ast.Eq: "==",
            ast.NotEq: "!=",
        }
        op = BinOp(symbol[type(node.ops[0])])
        return Binary(op, _from_python(node.left), _from_python(node.comparators[0]))
    assert isinstance(node, ast.BinOp), ast.dump(node)
    symbol = {
        ast.Add: "+",
        ast.Sub: "-",
        ast.Mult: "*",
        ast.Div: "/",
        ast.FloorDiv: "//",
        ast.Mod: "%",
    }
    return Binary(BinOp(symbol[type(node.op)]), _from_python(node.left), _from_python(node.right))


def _random_tree(rng: random.Random, depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([A, B, C, Const(2), Const(0.5)])
    if rng.random() < 0.15:
        return Unary(rng.choice(list(UnaryOp)), _random_tree(rng, depth - 1))
    ops = [op for op in BinOp if op is not BinOp.MATMUL]
    return Binary(rng.choice(ops), _random_tree(rng, depth - 1), _random_tree(rng, depth - 1))


def test_printed_python_parses_back_to_the_same_tree():
    rng = random.Random(0)
    for _ in range(500):
        tree = _random_tree(rng, 4)
        text = py(tree)
        assert _from_python(ast.parse(text, mode="eval").body) == tree, text


def test_irbuild_records_trees_not_text(tmp_path):
    from axdsl.pipeline import compile_spec

    spec = tmp_path / "m.axl"
    spec.write_text(
        "layer Head(dim: int, heads: int, head_dim: int = dim / heads,\n"
        "           scale: float = 1.0 / sqrt(dim)) {\n"
        "  param w: [dim, heads, head_dim] axes(embed, heads, head_dim) init normal(0.02)\n"
        "  forward(x: [B, dim]) -> [B, dim] { return x + merge_heads(x @ w) }\n"
        "}\n"
        "layer Tower(dim: int, heads: int = 2) {\n"
        "  child proj = Head()\n"
        "  forward(x: [B, dim]) -> [B, dim] { return proj(x) }\n"
        "}\n"
        "model tower = Tower { dim = 8 }\n"
    )
    root = compile_spec(spec, after="resolve").models[0].root
    assert root.hparam("dim").value.expr == Field("dim")  # a root value is its Config field
    head = root.child("proj")
    head_dim = Binary(BinOp.FLOORDIV, Field("dim"), Field("heads"))  # `/` that divides exactly
    assert head.hparam("head_dim").value.expr == head_dim
    assert head.hparam("scale").value.expr == Binary(
        BinOp.DIV, Const(1.0), Call(MathFn.SQRT, (Field("dim"),))
    )
    assert [d.expr for d in head.param("w").dims] == [Field("dim"), Field("heads"), head_dim]
    assert head.param("w").init.args[0].expr == Const(0.02)
