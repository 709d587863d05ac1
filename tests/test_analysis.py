"""Analytic FLOPs, parameter counts and per-chip memory from the IR (axdsl/analysis)."""

import subprocess
import sys
from pathlib import Path

import pytest

from axdsl.analysis import model_flops, param_count, platforms, training_flops
from axdsl.analysis.memory import estimate_memory
from axdsl.ir import nodes as ir
from axdsl.pipeline import compile_spec

ROOT = Path(__file__).resolve().parent.parent


def _module(spec: str, target: str = "cpu") -> ir.Module:
    return compile_spec(ROOT / "specs" / spec, target)


def _model(spec: str, name: str, target: str = "cpu") -> ir.Model:
    return next(m for m in _module(spec, target).models if m.name == name)


def maxtext_flops_per_step(*, batch, seq, emb, mlp, n_mlp_inputs, heads, kv_heads, head_dim,
                           layers, vocab, causal=True):
    """MaxText's closed formula (maxtext_utils.calculate_tflops_training_per_device), in FLOPs.

    Returns (learnable weight FLOPs, attention FLOPs) for forward + backward of one step.
    """
    ffn = 2 * batch * seq * mlp * emb * n_mlp_inputs + 2 * batch * seq * mlp * emb
    qkv = 2 * batch * seq * emb * (heads + 2 * kv_heads) * head_dim
    proj = 2 * batch * seq * emb * heads * head_dim
    attention = 4 * batch * seq**2 * heads * head_dim
    if causal:
        attention //= 2
    unembed = 2 * batch * seq * emb * vocab
    weights = (ffn + qkv + proj) * layers + unembed
    return 3 * weights, 3 * attention * layers


def test_llama3_8b_flops_equal_maxtext_formula():
    m = _model("llama3_8b.axl", "llama3_8b")
    seq, batch = 8192, 4
    weights, attention = maxtext_flops_per_step(
        batch=batch, seq=seq, emb=4096, mlp=14336, n_mlp_inputs=2, heads=32, kv_heads=8,
        head_dim=128, layers=32, vocab=128256)
    f = model_flops(m, seq)
    assert 3 * f.matmul * batch * seq == weights
    assert 3 * f.attention * batch * seq == attention
    assert f.per_step(batch) == weights + attention
    # The per-token figure train.py's MODEL_FLOPS gives at this seq is the same.
    assert training_flops(m).per_token(seq) * batch * seq == weights + attention


def test_gpt2_small_flops_equal_maxtext_formula_with_tied_head():
    m = _model("gpt2_small.axl", "gpt2_small")
    seq, batch = 1024, 8
    weights, attention = maxtext_flops_per_step(
        batch=batch, seq=seq, emb=768, mlp=3072, n_mlp_inputs=1, heads=12, kv_heads=12,
        head_dim=64, layers=12, vocab=50257)
    f = model_flops(m, seq)
    assert f.per_step(batch) == weights + attention
    # The tied head `x @ transpose(embed.table)` is a matmul: 2 x vocab x dim per token.
    assert f.by_path["/"] == 2 * 50257 * 768


def test_flops_follow_each_models_config():
    """Models of one spec share code but not sizes: each counts its own (llama3_8b_tiny)."""
    m = _model("llama3_8b.axl", "llama3_8b_tiny")
    h = {p.name: p.value.value for p in m.root.hparams}
    hd = h["dim"] // h["heads"]
    weights, attention = maxtext_flops_per_step(
        batch=1, seq=h["max_seq"], emb=h["dim"], mlp=h["ffn"], n_mlp_inputs=2, heads=h["heads"],
        kv_heads=h["kv_heads"], head_dim=hd, layers=h["layers"], vocab=h["vocab"])
    assert model_flops(m, h["max_seq"]).per_step(1) == weights + attention
    assert h["dim"] < 4096  # really the small one


def test_moe_counts_only_routed_experts():
    """Mixtral: MaxText's formula with the FFN x top_k (2 of 8 experts) plus the router matmul."""
    m = _model("mixtral_8x7b.axl", "mixtral_8x7b")
    seq, batch, top_k, experts = 4096, 2, 2, 8
    weights, attention = maxtext_flops_per_step(
        batch=batch, seq=seq, emb=4096, mlp=14336 * top_k, n_mlp_inputs=2, heads=32, kv_heads=8,
        head_dim=128, layers=32, vocab=32000)
    router = 3 * 2 * batch * seq * 4096 * experts * 32
    assert model_flops(m, seq).per_step(batch) == weights + attention + router
    # 46.7 B parameters, about 12.9 B active per token (6 x active ~ training FLOPs per token)
    assert param_count(m).total == 46_702_792_704


def test_parameter_counts():
    llama = param_count(_model("llama3_8b.axl", "llama3_8b"))
    assert llama.total == 8_030_261_248
    assert llama.embedding == 128256 * 4096  # the table; the untied head is a matmul
    assert llama.by_layer["SwiGLU"] == 32 * 3 * 4096 * 14336
    gpt2 = param_count(_model("gpt2_small.axl", "gpt2_small"))
    assert gpt2.total == 124_439_808
    assert gpt2.embedding == 50257 * 768 + 1024 * 768  # token table and learned positions
    assert sum(gpt2.by_path.values()) == gpt2.total


def test_state_per_chip_halves_when_fsdp_doubles():
    dots = ir.RematPolicy("save_dots")  # fit_remat's choice depends on the spec's step; fix one
    e8 = estimate_memory(_module("llama3_8b.axl", "gpu-h100-8"), "llama3_8b", batch=16, seq=2048, remat=dots)
    e16 = estimate_memory(_module("llama3_8b.axl", "gpu-h100-16"), "llama3_8b", batch=16, seq=2048, remat=dots)
    assert e8.mesh["fsdp"] == 8 and e16.mesh["fsdp"] == 16
    assert e8.params == pytest.approx(8_030_261_248 * 4 / 8, rel=1e-3)  # f32 over 8 chips
    assert e16.params == pytest.approx(e8.params / 2, rel=1e-3)
    assert e16.grads == pytest.approx(e8.grads / 2, rel=1e-3)
    assert e16.opt_state == pytest.approx(e8.opt_state / 2, rel=1e-3)
    assert e8.opt_state == pytest.approx(2 * e8.params, rel=1e-6)  # adamw: two f32 moments
    # bf16 copy + bf16 grads of the weights outside the scan (embedding, head, final norm), and
    # of one layer at a time: the scan step casts its own layer
    outside = 2 * 128256 * 4096 + 4096
    layer = (8_030_261_248 - outside) // 32
    assert e8.weight_copies == pytest.approx(2 * 2 * (outside + layer) / 8, rel=1e-3)
    # Same global batch over twice the chips: half the activations per chip too.
    assert e16.saved == pytest.approx(e8.saved / 2, rel=0.01)
    # A mesh given to the estimate gives the same answer as the target's.
    again = estimate_memory(_module("llama3_8b.axl", "gpu-h100-8"), "llama3_8b", batch=16, seq=2048,
                            mesh={**e8.mesh, "fsdp": 16}, remat=dots)
    assert again.params == e16.params and again.saved == e16.saved


def test_remat_orders_activations():
    module = _module("llama3_8b.axl", "gpu-h100-8")
    est = {kind: estimate_memory(module, "llama3_8b", batch=8, seq=4096, remat=ir.RematPolicy(kind))
           for kind in ("none", "save_dots", "full")}
    assert est["full"].saved < est["save_dots"].saved < est["none"].saved
    assert est["full"].activations < est["save_dots"].activations < est["none"].activations
    # full keeps one [B, S, dim] bf16 tensor per layer: 1 sequence per chip x 4096 x 4096 x 2 bytes
    assert est["full"].saved_per_layer == 4096 * 4096 * 2


def test_xla_attention_keeps_its_scores_flash_does_not():
    """Without remat, XLA attention keeps [B, heads, S, S] scores (f32 logits and exp, a mask and
    bf16 probabilities); cuDNN flash attention keeps only q, k, v, the output and log-sum-exp."""
    seq, kw = 4096, dict(batch=8, seq=4096, remat=ir.RematPolicy("none"))
    xla = estimate_memory(_forced("xla"), "llama3_8b", **kw)
    vjp = estimate_memory(_module("llama3_8b.axl", "cpu-8"), "llama3_8b", **kw)  # cpu's vjp kernel
    flash = estimate_memory(_module("llama3_8b.axl", "gpu-h100-8"), "llama3_8b", **kw)
    scores = 32 * seq * seq  # heads x S x S, one sequence per chip

    def kept(e, what):
        return sum(v for k, v in e.detail.items() if k.endswith(what))

    assert kept(xla, "attention masked logits") == kept(xla, "attention exp") == 4 * scores
    assert kept(xla, "attention mask") == scores and kept(xla, "attention probabilities") == 2 * scores
    assert kept(flash, "attention masked logits") == 0
    assert kept(flash, "attention logsumexp") == 4 * 32 * seq
    assert flash.saved_per_layer < xla.saved_per_layer - 10 * scores
    # the vjp kernel's own backward keeps only the probabilities (and the output), of the keys its
    # 8 causal query blocks of 512 see: 1 + 2 + ... + 8 = 36 of 64 key blocks
    assert kept(vjp, "attention probabilities") == 2 * scores * 36 // 64
    assert kept(vjp, "attention masked logits") == 0
    assert flash.saved_per_layer < vjp.saved_per_layer < xla.saved_per_layer - 8 * scores


def _forced(kernel: str) -> ir.Module:
    """llama3_8b on cpu-8 with `kernels(attention = kernel)`."""
    import tempfile

    text = (ROOT / "specs" / "llama3_8b.axl").read_text() + f'\ntarget "cpu*" {{ kernels(attention = {kernel}) }}\n'
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "llama3_8b.axl"
        spec.write_text(text)
        return compile_spec(spec, "cpu-8")


def test_named_points_saved_or_offloaded():
    module = _module("llama3_8b.axl", "gpu-h100-8")
    full = estimate_memory(module, "llama3_8b", remat=ir.RematPolicy("full"))
    saved = estimate_memory(module, "llama3_8b", remat=ir.RematPolicy("save", ("context", "mlp_hidden")))
    off = estimate_memory(module, "llama3_8b", remat=ir.RematPolicy("offload", ("context",), ("mlp_hidden",)))
    assert full.saved < off.saved < saved.saved
    assert off.offloaded > 0 and saved.offloaded == 0
    assert saved.saved - off.saved == pytest.approx(off.offloaded, rel=1e-6)


def test_activations_scale_with_microbatches_and_batch():
    module = _module("llama3_8b.axl", "gpu-h100-8")
    dots = ir.RematPolicy("save_dots")  # fit_remat's choice depends on the spec's step; fix one
    one = estimate_memory(module, "llama3_8b", batch=32, seq=1024, remat=dots)
    four = estimate_memory(module, "llama3_8b", batch=32, seq=1024, microbatches=4, remat=dots)
    # kept by the fused loss, whatever the micro-batch: XLA:GPU accumulates the head's gradient
    # in place (platforms.GPU.loss_head_grads, measured; CPU's carry and result were two)
    head_grads = platforms.GPU.loss_head_grads * 4096 * 128256 * 4 / 8
    assert four.saved - head_grads == pytest.approx((one.saved - head_grads) / 4, rel=0.01)
    assert four.grads > one.grads  # the float32 accumulator of the micro-batch scan
    double = estimate_memory(module, "llama3_8b", batch=64, seq=1024, remat=dots)
    assert double.saved - head_grads == pytest.approx(2 * (one.saved - head_grads), rel=0.01)


# A small Llama of 8 layers on 8 chips; `{target}` is the target block's directives.
PIPELINED = """\
import "std/transformer.axl"

model lm = DecoderLM {{
  vocab = 256  dim = 64  layers = 8  heads = 4  kv_heads = 2  ffn = 128  max_seq = 64
  dtype = f32
}}
train {{ batch = 16  seq = 16 }}
target "cpu-8" {{ mesh(stage = 4, fsdp = 2)  remat(full)  unroll(0)  {target} }}
"""


def _pipelined(tmp_path: Path, target: str) -> ir.Module:
    spec = tmp_path / f"pp{abs(hash(target))}.axl"
    spec.write_text(PIPELINED.format(target=target))
    return compile_spec(spec, "cpu-8")


def test_a_pipeline_keeps_every_micro_batch_in_flight(tmp_path):
    """Under pipeline(...) the loop's scan keeps, for each of its M x R + S - 1 iterations, what
    a stage's layers keep for one micro-batch, the bubble's iterations included: the
    unpipelined figure / (1 - bubble), plus the loop's buffer of the whole batch at the
    repeat's input. With remat(full) a layer keeps its f32 input: 16 sequences over fsdp 2 in
    4 micro-batches are 2 x 16 x 64 x 4 bytes a layer, as the 8 unpipelined layers keep with
    stage as data parallelism (16 / 8 sequences a chip)."""
    flat = estimate_memory(_pipelined(tmp_path, ""))
    pp = estimate_memory(_pipelined(tmp_path, "pipeline(microbatches = 4)"))
    piece = 2 * 16 * 64 * 4
    assert flat.saved_per_layer == pp.saved_per_layer == piece
    assert flat.in_flight == 0 and pp.pipeline is not None and pp.pipeline.bubble == 3 / 7
    assert pp.in_flight == 7 * 2 * piece + 4 * piece  # 7 iterations x 2 layers, the 4 pieces
    assert pp.in_flight == 8 * piece / (1 - pp.pipeline.bubble) + 4 * piece
    assert pp.saved - flat.saved == pp.in_flight - 8 * piece  # the rest is as before
    # circular: 2 repeats of 1 layer per stage, 4 + 4 + 3 iterations, each keeping the layer's
    # weights it picked (f32 over fsdp 2: wq, wk, wv, wo, the MLP's three; the norms whole)
    circ = estimate_memory(_pipelined(tmp_path, "pipeline(microbatches = 4, repeats = 2)"))
    weights = ((64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) // 2 + 2 * 64) * 4
    assert circ.in_flight == 11 * 1 * piece + 4 * piece + 11 * weights
    # more micro-batches: smaller pieces, a smaller bubble
    eight = estimate_memory(_pipelined(tmp_path, "pipeline(microbatches = 8)"))
    assert eight.in_flight == 11 * 2 * piece // 2 + 8 * piece // 2


def test_the_bubble_slows_only_the_pipelined_layers(tmp_path):
    """MFU under a pipeline: the repeat's share of the FLOPs takes 1 / (1 - bubble) as long."""
    from axdsl.analysis.flops import bubble_slowdown, pipelined_share

    module = _pipelined(tmp_path, "pipeline(microbatches = 4)")
    flops = model_flops(module.models[0], 16)
    share = pipelined_share(flops, "/blocks")
    policy = module.target.pipeline.value
    assert 0.5 < share < 1  # the head's matmul is outside
    assert bubble_slowdown(flops, policy) == pytest.approx(1 - share + share * 7 / 4)


MOE_EP = """\
import "std/transformer.axl"

model moe = DecoderLM {{
  vocab = 256  dim = 64  layers = 2  heads = 4  ffn = 32  max_seq = 64
  block = Block(mlp = MoE(hidden = ffn, experts = 8, top_k = 2, capacity_factor = {cf}))
  dtype = bf16  param_dtype = f32
}}
target "cpu-8" {{ mesh(expert = 4, fsdp = 2) }}
"""


def test_dropless_experts_are_gathered_whole_with_their_gradient(tmp_path):
    """The dropless MoE's shard_map takes the expert matrices whole and XLA gathers their
    `expert` axis too (a deviceless v5e 2x4 compile holds [64, 1024, 512] matrices where the
    mesh shards 64 experts 4 ways): a layer's backward holds them whole in the compute dtype,
    and their whole gradient. The capacity path's einsums keep the experts sharded."""
    from axdsl.analysis.activations import gathered_weights
    from axdsl.analysis.layout import Layout
    from axdsl.analysis.trace import Tracer
    from axdsl.ir.axes import dim_axes

    def gathered(cf: str) -> float:
        spec = tmp_path / f"moe{cf.replace('.', '_')}.axl"
        spec.write_text(MOE_EP.format(cf=cf))
        module = compile_spec(spec, "cpu-8")
        root, sched = module.models[0].root, module.target
        rules = {k: c.value for k, c in sched.rules}
        t = Tracer(root, Layout(dict(sched.mesh_sizes), rules, dim_axes(root)), 16, 16)
        t.compute = "bf16"
        return gathered_weights(t, root.expect_child("blocks"))

    whole = 3 * 8 * 64 * 32 * 2  # w_gate, w_up, w_down of 8 experts, bf16
    assert gathered("0.0") - gathered("1.0") == 2 * whole - whole // 4


def test_analysis_never_imports_jax():
    code = ("import sys; from pathlib import Path; from axdsl.pipeline import compile_spec; "
            "from axdsl.analysis import model_flops; from axdsl.analysis.memory import estimate_memory; "
            "m = compile_spec(Path('specs/gpt2_small.axl'), 'tpu-v5e-8'); "
            "estimate_memory(m); model_flops(m.models[0], 1024); "
            "assert 'jax' not in sys.modules, 'the analysis imported jax'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_analysis_modules_import_no_cycle_even_for_annotations():
    """The residual rules see the tracer through values.Recorder: no module of axdsl/analysis
    imports one that imports it back, counting `if TYPE_CHECKING:` and in-function imports."""
    import ast

    pkg = ROOT / "axdsl" / "analysis"
    names = {p.stem for p in pkg.glob("*.py")} - {"__init__"}
    graph = {}
    for name in names:
        tree = ast.parse((pkg / f"{name}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "axdsl.analysis":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("axdsl.analysis."):
                found.add(node.module.rsplit(".", 1)[1])
        graph[name] = found & names
    assert "trace" in graph["activations"] and "residuals" in graph["trace"]  # the walk sees them

    def reaches(a: str, b: str, seen: set) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in graph[a])

    cycles = sorted(m for m in names if reaches(m, m, set()))
    assert not cycles, {m: graph[m] for m in cycles}
