"""fp8 and int8 matmuls in generated code: helper numerics, a quantized model, target lowerings.

Error bounds are relative L2 errors, ||got - want|| / ||want||, against the f32 einsum. Each
bound was measured on this data first (figure in the comment) and set with margin, from what
the format can represent:

- fp8 e4m3 keeps 3 mantissa bits: rounding moves an element by at most 2^-4 of its value, by
  about 2^-4 / sqrt(3) * 0.85 ~= 0.03 RMS (uniform error over a binade). The forward product has
  two such operands, ~0.043 RMS. The backward multiplies an e5m2 gradient (2 mantissa bits,
  ~0.06 RMS) with an e4m3 operand: ~0.07.
- int8 per channel: the step is amax / 127 of the slice, the error RMS step / sqrt(12), i.e.
  amax / 440. Gaussian slices of 64-256 elements have amax ~3 sigma: ~0.007 per operand, ~0.01
  for the product. The int8 backward is the f32 einsum's (straight-through estimator).
"""

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from axdsl.build import build_files
from axdsl.primitives import quantized as quant
from tests.targets_util import import_model

ROOT = Path(__file__).resolve().parent.parent

# (spec, x shape, w shape): every einsum shape a quantized matmul of the std layers emits.
CASES = [
    ("bsd,dh->bsh", (4, 16, 256), (256, 512)),  # MLP up / gate
    ("bsd,dhe->bshe", (2, 8, 64), (64, 4, 16)),  # q, k, v projections
    ("bshe,hed->bsd", (2, 8, 4, 16), (4, 16, 128)),  # attention output projection
    ("...d,dh->...h", (3, 5, 128), (128, 32)),  # Dense on [..., in_dim]
]
BOUNDS = {  # format: (forward, gradients), relative L2 vs f32; see the module docstring
    "fp8": (0.0625, 0.09),  # measured at most 0.039 forward, 0.063 gradients (f32 and bf16)
    "int8": (0.015, 1e-5),  # measured at most 0.0102 forward; gradients: the f32 einsum's
}
BF16_GRAD_BOUND = 0.01  # int8 with bf16 inputs: bf16 rounding of x, w, g (2^-9); measured 0.0030


def _relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _load(files: dict[str, str], directory: Path, name: str):
    """Write generated files and import their model.py as a fresh module."""
    directory.mkdir(parents=True)
    return import_model(files, directory)


def _tiny_llama_with(tmp: Path, target_block: str) -> Path:
    """specs/tiny_llama.axl (and the llama3_8b.axl it imports) plus a target block, in `tmp`."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "llama3_8b.axl").write_text((ROOT / "specs/llama3_8b.axl").read_text())
    (tmp / "tiny_llama.axl").write_text((ROOT / "specs/tiny_llama.axl").read_text() + target_block)
    return tmp / "tiny_llama.axl"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Generated tiny_llama: unquantized and quantized for the CPU, and for GPU and TPU targets."""
    tmp = tmp_path_factory.mktemp("quant")
    specs = {
        "base": (ROOT / "specs/tiny_llama.axl", "cpu"),
        # Every matmul with a parameter, the output head included.
        "fp8": (_tiny_llama_with(tmp / "fp8", '\ntarget "cpu" { quantize(fp8) }\n'), "cpu"),
        "int8": (_tiny_llama_with(
            tmp / "int8", '\ntarget "cpu" { quantize(int8, layers = "blocks/*") }\n'), "cpu"),
        "gpu": (ROOT / "specs/tiny_llama.axl", "gpu-h100-8"),  # fp8 on blocks/* by default
        "tpu": (ROOT / "specs/tiny_llama.axl", "tpu-v5e-8"),  # int8 on blocks/* by default
    }
    return {name: _load(build_files(spec, target), tmp / f"gen_{name}", f"quant_model_{name}")
            for name, (spec, target) in specs.items()}


def _helper(models, fmt):
    return getattr(models[fmt], f"{fmt}_einsum")


# ----------------------------------------------------------------------------- helpers


@functools.partial(jax.jit, static_argnums=(0, 1))
def _vjp(einsum, spec, x, w, g):
    """einsum(spec, x, w) and its gradients (dx, dw) for the output cotangent g."""
    out, vjp = jax.vjp(functools.partial(einsum, spec), x, w)
    return out, vjp(g)


def test_targets_emit_the_helpers(models):
    assert "fp8_einsum(" in Path(models["gpu"].__file__).read_text()
    assert "int8_einsum(" in Path(models["tpu"].__file__).read_text()
    assert "_einsum(" not in Path(models["base"].__file__).read_text()


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("spec,x_shape,w_shape", CASES)
def test_helper_is_close_to_the_f32_einsum(models, fmt, dtype, spec, x_shape, w_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape, np.float32)
    w = 0.02 * rng.standard_normal(w_shape, np.float32)
    out_shape = jax.eval_shape(functools.partial(jnp.einsum, spec), x, w).shape
    g = rng.standard_normal(out_shape, np.float32)  # the cotangent: gradients of sum(out * g)
    f32_einsum = functools.partial(jnp.einsum, precision="highest")
    want, (want_dx, want_dw) = _vjp(f32_einsum, spec, x, w, g)

    x, w, g = (a.astype(dtype) for a in (x, w, g))
    got, (dx, dw) = _vjp(_helper(models, fmt), spec, x, w, g)

    assert got.dtype == dx.dtype == dw.dtype == dtype
    forward_bound, grad_bound = BOUNDS[fmt]
    if fmt == "int8" and dtype == jnp.bfloat16:
        grad_bound = BF16_GRAD_BOUND
    assert _relative_error(got, want) < forward_bound
    assert _relative_error(dx, want_dx) < grad_bound
    assert _relative_error(dw, want_dw) < grad_bound


def _fp8_exact(rng, shape, values, scale):
    """scale * values drawn from `values` (max 14): exact in fp8 after per-tensor scaling."""
    v = rng.choice(np.array(values, np.float32), shape)
    v[(0,) * len(shape)] = 14.0  # amax = 14 * scale: 14 -> 448 (e4m3) or 57344 (e5m2)
    return np.float32(scale) * v


def test_fp8_is_exact_on_representable_values(models):
    """Integers up to 14 have <= 4 significant bits; 14 * scale maps to e4m3's max 448 (= 14 * 32)
    and e5m2's max 57344 (= 14 * 4096), so they survive the cast exactly (values with <= 3 bits
    for the e5m2 gradient). What remains is the scaling, the layout of the backward einsums, and
    exact f32 sums: forward and gradients equal the float64 einsum."""
    spec = "bshe,hed->bsd"
    rng = np.random.default_rng(1)
    x = _fp8_exact(rng, (2, 8, 4, 16), range(-14, 15), 0.37)
    w = _fp8_exact(rng, (4, 16, 64), range(-14, 15), 0.011)
    g = _fp8_exact(rng, (2, 8, 64), [-14, -12, -8, -7, -6, -4, -3, -1, 0, 1, 2, 5, 6, 8, 12], 3.0)
    out, (dx, dw) = _vjp(_helper(models, "fp8"), spec, x, w, g)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for got, want in [(out, np.einsum(spec, x64, w64)),
                      (dx, np.einsum("bsd,hed->bshe", g64, w64)),
                      (dw, np.einsum("bshe,bsd->hed", x64, g64))]:
        # Only the f32 rounding of the scales (~1e-7) remains, relative to the largest entry.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_int8_scales_are_per_row_and_per_output_channel(models):
    """Rows of x and output channels of w with magnitudes 1e-2..1e2 that are exactly
    int * (their scale): per-row / per-channel quantization recovers the integers, and the
    dequantized result equals the float64 einsum. A per-tensor or misplaced scale would not."""
    spec = "bshe,hed->bsd"  # w contracts over two dims: its scales are [1, 1, dim]
    rng = np.random.default_rng(2)
    qx = rng.integers(-127, 128, (2, 8, 4, 16))
    qw = rng.integers(-127, 128, (4, 16, 64))
    qx[:, :, 0, 0], qw[0, 0, :] = 127, -127  # every row / channel reaches 127 in magnitude
    x = (qx * 10.0 ** rng.uniform(-2, 2, (2, 8, 1, 1))).astype(np.float32)
    w = (qw * 10.0 ** rng.uniform(-2, 2, (1, 1, 64))).astype(np.float32)
    got = jax.jit(_helper(models, "int8"), static_argnums=0)(spec, x, w)
    want = np.einsum(spec, x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_zeros_give_zeros_not_nan(models, fmt):
    einsum = _helper(models, fmt)
    x, w = jnp.zeros((2, 8, 64)), jnp.zeros((64, 4, 16))
    out, (dx, dw) = jax.jit(jax.value_and_grad(
        lambda x, w: jnp.sum(einsum("bsd,dhe->bshe", x, w)), (0, 1)))(x, w)
    assert out == 0.0 and not jnp.any(dx) and not jnp.any(dw)  # NaN != 0 would fail


def test_einsum_the_fp8_backward_cannot_derive_stays_unquantized():
    assert quant.emit_quantized("fp8", "bsd,dh->bsh", "x", 'params["w"]') == (
        "fp8_einsum('bsd,dh->bsh', x, params[\"w\"])")
    # `s` is summed within x alone: dx = "bk,dk->bsd" would name a dim no operand has.
    assert quant.emit_quantized("fp8", "bsd,dk->bk", "x", "w") == "jnp.einsum('bsd,dk->bk', x, w)"


# ----------------------------------------------------------------------------- end to end

# Relative L2 error of tiny_llama's logits (init params, 4 x 32 tokens) against the unquantized
# build. Each quantized matmul adds ~0.04 (fp8) or ~0.01 (int8) relative error; two blocks and,
# for fp8, the output head compound them. Measured 0.051 (fp8) and 0.0080 (int8).
LOGITS_BOUNDS = {"fp8": 0.1, "int8": 0.02}


def _numpy_params(model, cfg):
    """Parameters like init_params' (norm scales 1, weights N(0, 0.02)), drawn with numpy:
    init_params compiles a threefry kernel per parameter shape, ~7 s on this machine."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    return jax.tree_util.tree_map_with_path(
        lambda path, s: np.ones(s.shape, s.dtype) if path[-1].key == "scale"
        else (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def unquantized_logits(models):
    cfg = models["base"].Config()
    params = _numpy_params(models["base"], cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (4, 32), dtype=np.int32)
    logits = jax.jit(models["base"].forward, static_argnums=0)(cfg, params, tokens)
    return params, tokens, logits


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_quantized_model_matches_and_trains(models, unquantized_logits, fmt):
    model = models[fmt]
    cfg = model.Config()
    params, tokens, want = unquantized_logits
    got = jax.jit(model.forward, static_argnums=0)(cfg, params, tokens)
    assert got.dtype == want.dtype and _relative_error(got, want) < LOGITS_BOUNDS[fmt]

    # A few AdamW steps on a learnable sequence lower the loss as in the unquantized model
    # (tests/test_numerics.py); loss and gradients stay finite on the way.
    tokens = jnp.tile(jnp.arange(33, dtype=jnp.int32) % 7, (4, 1))
    opt = optax.adamw(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: model.loss_fn(cfg, p, tokens)[0])(params)
        updates, state = opt.update(grads, state, params)
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        return optax.apply_updates(params, updates), state, loss, grad_norm

    losses = []
    for _ in range(6):
        params, state, loss, grad_norm = step(params, state)
        assert np.isfinite(float(loss)) and np.isfinite(float(grad_norm)) and grad_norm > 0
        losses.append(float(loss))
    assert abs(losses[0] - np.log(cfg.vocab)) < 0.2  # the init predicts ~uniformly
    assert losses[-1] < losses[0] - 0.5, losses


# ----------------------------------------------------------------------------- lowering


def _grad_stablehlo(model, platform: str) -> str:
    """StableHLO of the loss gradient for `platform`, lowered from this CPU machine."""
    cfg = model.Config()
    params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((2, 17), jnp.int32)
    grad = jax.grad(lambda p, t: model.loss_fn(cfg, p, t)[0])
    return jax.jit(grad).trace(params, tokens).lower(lowering_platforms=(platform,)).as_text()


def _dots(text: str) -> list[str]:
    """Operand and result types of every dot_general: '(tensor<..>, tensor<..>) -> tensor<..>'."""
    lines = text.splitlines()
    return [line.rsplit(" : ", 1)[-1] for line in lines if "stablehlo.dot_general" in line]


def test_gpu_lowering_runs_fp8_dots_forward_and_backward(models):
    dots = _dots(_grad_stablehlo(models["gpu"], "cuda"))
    t = r"tensor<[0-9x]*x{}>"
    e4m3, e5m2, f32 = t.format("f8E4M3FN"), t.format("f8E5M2"), t.format("f32")
    forward = [d for d in dots if re.fullmatch(rf"\({e4m3}, {e4m3}\) -> {f32}", d)]
    grad_x = [d for d in dots if re.fullmatch(rf"\({e5m2}, {e4m3}\) -> {f32}", d)]
    grad_w = [d for d in dots if re.fullmatch(rf"\({e4m3}, {e5m2}\) -> {f32}", d)]
    # 7 parameter matmuls per block (q, k, v, o, gate, up, down), one block in the scan body.
    assert len(forward) >= 7 and len(grad_x) >= 7 and len(grad_w) >= 7, dots


def test_tpu_lowering_runs_int8_dots_with_int32_results(models):
    dots = _dots(_grad_stablehlo(models["tpu"], "tpu"))
    int8 = [d for d in dots if re.fullmatch(r"\(tensor<[0-9x]*xi8>, tensor<[0-9x]*xi8>\) -> "
                                            r"tensor<[0-9x]*xi32>", d)]
    assert len(int8) >= 7, dots
    assert not any("f8E" in d for d in dots)


def _saved_bytes(tmp_path: Path, schedule: str) -> int:
    """Bytes the backward keeps of tiny_llama's loss on cpu under `schedule` (a target block)."""
    import contextlib
    import io

    from jax.ad_checkpoint import print_saved_residuals

    spec = tmp_path / schedule.replace(" ", "_").replace("(", "_").replace(")", "") / "tiny.axl"
    spec.parent.mkdir(parents=True)
    (spec.parent / "llama3_8b.axl").write_text((ROOT / "specs" / "llama3_8b.axl").read_text())  # its import
    spec.write_text((ROOT / "specs" / "tiny_llama.axl").read_text() + f'\ntarget "cpu" {{ {schedule} }}\n')
    files = build_files(spec, "cpu")
    model = _load(files, spec.parent / "gen", f"saved_{abs(hash(schedule))}")
    cfg = model.CONFIGS["tiny_llama"]
    params = model.init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((2, 65), jnp.int32)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # one line per residual: "f32[2,64,128] from ..."
        print_saved_residuals(lambda p: model.loss_fn(cfg, p, tokens)[0], params)
    sizes = {"f32": 4, "bf16": 2, "i32": 4, "s32": 4, "i8": 1, "s8": 1, "bool": 1, "u32": 4}
    found = re.findall(r"^(\w+)\[([\d,]*)\]", out.getvalue(), flags=re.M)
    return sum(sizes.get(t, 4) * int(np.prod([int(d) for d in dims.split(",") if d])) for t, dims in found)


def test_save_dots_saves_quantized_matmuls(tmp_path):
    """int8_einsum is a custom VJP, which hides its dots from dots_with_no_batch_dims_saveable:
    save_dots saves the helpers' named outputs too, so it keeps more than full remat (as it
    does without quantization) instead of compiling to the same step."""
    full = _saved_bytes(tmp_path, "quantize(int8) remat(full)")
    dots = _saved_bytes(tmp_path, "quantize(int8) remat(save_dots)")
    plain = _saved_bytes(tmp_path, "quantize(none) remat(save_dots)")
    assert dots > full
    assert dots >= 0.9 * plain  # the same matmul outputs as unquantized save_dots, give or take
