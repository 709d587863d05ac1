"""`axdsl aot`: the fit report, its exit codes, and the analytic memory against XLA's."""

import sys
from pathlib import Path

import pytest

from axdsl.aot import EXIT_FITS, EXIT_NO_FIT, analyze, run, xla_total

# A llama-shaped model big enough that every term means something on a CPU: 4.2 M parameters
# (48 MiB of state per chip, replicated over the data axis) and 32 sequences of 256 tokens of
# activations per step (a few MiB per layer per chip); compiles in about 15 s.
MID_LLAMA = """
import "std/transformer.axl"
model mid_llama = DecoderLM {
  vocab = 2048  dim = 256  layers = 4  heads = 8  kv_heads = 4  ffn = 768
  rope_theta = 500000.0  max_seq = 512
  norm = RMSNorm(eps = 1e-5)
  dtype = f32  param_dtype = f32
}
train { batch = 8  seq = 256 }
"""


def test_llama3_8b_fits_on_8_h100(in_root, capsys):
    # 8.03 B params x 16 bytes (f32 params, grads, two adamw moments) / 8 chips = 15 GiB per chip,
    # plus bf16 weight copies and activations: it fits in 80 GiB.
    code = run(Path("specs/llama3_8b.axl"), "gpu-h100-8", batch=8, seq=2048)
    out = capsys.readouterr().out
    assert code == EXIT_FITS, out
    assert "=> fits" in out and "does NOT fit" not in out
    assert "parameters            3.74 GiB" in out  # 8.03e9 x 4 bytes / 8 chips
    assert "optimizer state       7.48 GiB" in out
    assert "ideal step time" in out and "989 TFLOP/s" in out
    assert "analytic" in out


def test_llama3_8b_does_not_fit_on_v5e_8_and_says_what_would(in_root, capsys):
    # The state alone is 8.03e9 x 16 bytes / 8 = 15 GiB > 16 GiB x 90% usable.
    code = run(Path("specs/llama3_8b.axl"), "tpu-v5e-8")
    out = capsys.readouterr().out
    assert code == EXIT_NO_FIT, out
    assert "does NOT fit" in out
    assert "more FSDP: fsdp = 16 over 16 chips" in out
    assert "--target tpu-v5e-16" in out
    # The step was lowered for TPU over 8 fake devices. With libtpu, XLA compiled it for v5e:2x4
    # and ran out of HBM: its verdict; without, the verdict is analytic and says how to get XLA's.
    assert "lowered the generated train step for tpu over 8 devices" in out
    try:
        import libtpu  # noqa: F401
    except ImportError:
        assert "does NOT fit (analytic)" in out and "libtpu" in out
    else:
        assert "does NOT fit (XLA)" in out and "RESOURCE_EXHAUSTED" in out
        assert "figures scaled by XLA's ratio" in out and "x XLA's ratio" in out


def test_suggestions_cover_remat_and_microbatches(in_root, tmp_path):
    # 4 sequences of 8192 tokens per chip: activations dominate; fewer tokens at once fix it.
    # fit_remat sized llama3_8b's policy for 8 x 8192 (its max_seq; the spec sets no seq): at 4x
    # the batch a stronger remat and micro-batches are suggested, and the note says why.
    r = analyze(Path("specs/llama3_8b.axl"), "gpu-h100-8", batch=32, seq=8192, lower=False)
    assert not r.fits and "remat(full)" in "\n".join(r.suggestions)
    assert any("was chosen for batch 8 x seq 8192" in n for n in r.notes)
    # Under remat(full) written in a target block, smaller micro-batches are what is left.
    spec = tmp_path / "llama3_8b.axl"
    spec.write_text(Path("specs/llama3_8b.axl").read_text() + '\ntarget "gpu*" { remat(full) }\n')
    # (256: under the measured GPU facts, platforms.GPU, 128 x 8192 with remat(full) fits)
    r = analyze(spec, "gpu-h100-8", batch=256, seq=8192, lower=False)
    assert not r.fits
    text = "\n".join(r.suggestions)
    assert "microbatches = 2" in text or "microbatches = 4" in text


def test_update_model_is_the_form_the_generated_step_uses(in_root):
    # aot models the update from the schedule's update_skip (choose_update_skip), not from
    # train.py's text: keep that true of what the build emits. cpu: a lax.cond that skips the
    # update in place, no select over the state; gpu: a select of each leaf, no lax.cond.
    import re

    from axdsl.analysis.memory import UpdateSkip, estimate_memory
    from axdsl.build import build_files
    from axdsl.pipeline import compile_spec

    for target, skip in (("cpu", UpdateSkip.COND), ("gpu-h100-1", UpdateSkip.SELECT)):
        module = compile_spec(Path("specs/tiny_llama.axl"), target)
        assert module.target.update_skip is skip, target
        files = build_files(Path("specs/tiny_llama.axl"), target)
        emitted = "\n".join(text for name, text in files.items() if name.endswith(".py"))
        cond = re.search(r"jax\.lax\.cond\(\s*ok, update,", emitted)
        select = re.search(r"jnp\.where\(ok, n, o\), updated, old\)", emitted)
        assert (bool(cond), bool(select)) == (skip is UpdateSkip.COND, skip is UpdateSkip.SELECT)
    r = analyze(Path("specs/tiny_llama.axl"), "cpu", lower=False)
    assert r.estimate.update == 0
    module = compile_spec(Path("specs/tiny_llama.axl"), "cpu")
    assert estimate_memory(module, update_select=True).update > 0
    # XLA:GPU writes the select in place, and made a copy under the cond (platforms.GPU)
    gpu = compile_spec(Path("specs/tiny_llama.axl"), "gpu-h100-1")
    assert estimate_memory(gpu).update == 0 < estimate_memory(gpu, update_select=False).update


def test_unknown_model_is_an_error(in_root, capsys):
    assert run(Path("specs/tiny_llama.axl"), "cpu", model="nope") == 1
    assert "no model `nope`" in capsys.readouterr().err


def test_more_chips_than_devices_lowers_in_a_subprocess(in_root):
    """This process has 8 fake devices; 16 chips need a fresh process with more."""
    r = analyze(Path("specs/tiny_llama.axl"), "cpu-16", lower=True)
    assert r.lowering.get("subprocess") is True, r.lowering
    assert r.lowering["devices"] == 16 and r.lowering["mesh"]["data"] == 16
    assert "lower_s" in r.lowering and "error" not in r.lowering


@pytest.mark.parametrize("kernel", ["xla", "vjp"])
def test_analytic_memory_within_10_percent_of_xla(tmp_path, capsys, kernel):
    """The analytic per-chip memory against XLA's memory_analysis of the same generated step, with
    XLA's attention and with cpu's own vjp kernel (whose backward's temporaries the model
    undercounts by about one [heads, S, S] float32 array at this size: its total is held to 10%)."""
    spec = tmp_path / "mid_llama.axl"
    spec.write_text(MID_LLAMA + f'target "cpu*" {{ kernels(attention = {kernel}) }}\n')
    r = analyze(spec, "cpu-8", compile=True)
    xla, e = r.lowering["xla"], r.estimate
    total = xla_total(xla)
    figures = (
        f"XLA argument {xla['argument']:,} temp {xla['temp']:,} total {total:,}; analytic "
        f"state {e.state:,} temporaries {e.temporaries:,} (saved {e.saved:,}, working "
        f"{e.working:,}, grads {e.grads:,}) total {e.total:,}"
    )
    print(figures, file=sys.stderr)
    # Neither side is negligible: state and activations are each at least a third of the total.
    assert e.state > total / 3 and e.activations > total / 3, figures
    assert e.state == pytest.approx(xla["argument"], rel=0.01), figures  # params + adamw + batch
    if kernel == "xla":
        assert e.temporaries == pytest.approx(xla["temp"], rel=0.10), figures  # grads + activations
    assert e.total == pytest.approx(total, rel=0.10), figures
    print(r.lowering, file=sys.stderr)


def test_an_image_model_is_sized_by_its_own_positions(in_root, capsys):
    """vit_tiny's blocks see 17 positions (16 patches and a class token), not the train block's seq:
    its analytic total is near XLA's (it was 7x before), its batch is images, and its FLOPs are not
    counted per token."""
    r = analyze(Path("specs/vit_tiny.axl"), "cpu", compile=True)
    total = xla_total(r.lowering["xla"])
    assert r.estimate.total == pytest.approx(total, rel=0.25), (r.estimate.total, total)
    assert r.estimate.inputs == 32 * (32 * 32 * 3 + 1) * 4  # float32 images and int32 labels
    assert run(Path("specs/vit_tiny.axl"), "cpu") == EXIT_FITS
    out = capsys.readouterr().out
    assert "batch 32 images;" in out and "not counted" in out and "tokens/s" not in out


# ---------------------------------------------------------------------------- XLA decides on TPU
def test_host_bounds_divide_every_slice():
    """libtpu's default host (2x2x1) does not divide one chip: each count gets bounds that do."""
    from axdsl.aot.tpu import host_bounds, topology

    assert topology("tpu-v5e", 1) == "v5e:1x1" and host_bounds("tpu-v5e", 1, 8) == [1, 1, 1]
    assert host_bounds("tpu-v5e", 4, 8) == [2, 2, 1]
    assert host_bounds("tpu-v5e", 8, 8) == [2, 4, 1] and host_bounds("tpu-v5e", 256, 8) == [2, 4, 1]
    assert topology("tpu-v5p", 8) == "v5p:2x2x2" and host_bounds("tpu-v5p", 8, 4) == [2, 2, 1]


def test_out_of_hbm_compile_is_a_no_fit_verdict_with_xla_figures(in_root):
    """XLA's RESOURCE_EXHAUSTED is its "does not fit", held to the HBM its message names."""
    from axdsl.aot.xla import is_out_of_memory, out_of_memory

    msg = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (20.50G) exceeds available HBM (15.75G)."
    )
    assert is_out_of_memory(msg) and not is_out_of_memory("INVALID_ARGUMENT: bad shape")
    oom = out_of_memory(msg)
    assert oom == {"required": int(20.5 * 2**30), "available": int(15.75 * 2**30)}
    r = analyze(Path("specs/tiny_llama.axl"), "tpu-v5e-1", lower=False)
    r.lowering = {"tpu_topology": "v5e:1x1", "xla_oom": oom, "compile_s": 1.0}
    assert r.xla_decides and not r.fits and r.limit == oom["available"]
    assert r.peak == oom["required"] and r.ratio > 1


def test_a_step_xla_compiled_fits_whatever_memory_analysis_sums_to(in_root):
    """XLA's compile is its check: the 32k-token Llama cut summed to 16.53 GiB by memory_analysis()
    (4.34 arguments + 12.19 temporaries) against 15.75 GiB, compiled for v5e:1x1 (here and on a
    chip) and trained there. aot refused it (\"798 MiB over\"); its verdict is XLA's compile now."""
    from axdsl.aot.render import render

    r = analyze(Path("specs/tiny_llama.axl"), "tpu-v5e-1", lower=False)
    xla = {"argument": 4662225408, "output": 4662096896, "alias": 4662093824, "temp": 13086059520}
    r.lowering = {
        "tpu_topology": "v5e:1x1",
        "xla": xla,
        "hbm_available": int(15.75 * 2**30),
        "compile_s": 1.0,
        "platform": "tpu",
        "devices": 1,
    }
    assert r.xla_decides and r.peak > r.limit and r.fits
    out = render(r)
    assert "=> fits (XLA): its compile for the chip passed its own HBM check" in out, out
    assert "does NOT fit" not in out


def _tiny_model(spec: Path) -> str:
    """The spec's test-size model (`<name>_tiny`), or its first when that is tiny already."""
    from axdsl.pipeline import compile_spec

    names = [m.name for m in compile_spec(spec, "cpu").models]
    return next((n for n in names if n.endswith("_tiny")), names[0])


def _committed_tpu_outputs() -> list[tuple[Path, Path, str]]:
    """(output dir, spec, target) of every committed TPU output, relative to the repository."""
    from axdsl.build import committed_outputs

    root = Path(__file__).resolve().parents[1]
    return [
        (out.relative_to(root), spec, target)
        for out, spec, target in committed_outputs(root / "generated")
        if target.startswith("tpu")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("out,spec,target", _committed_tpu_outputs(), ids=lambda x: str(x))
def test_every_committed_tpu_output_compiles_for_its_topology(in_root, out, spec, target):
    """XLA's TPU compiler (libtpu, no chip) compiles each committed TPU output's step at test
    size, Pallas splash attention included where the target chose it; XLA decides its verdict."""
    pytest.importorskip("libtpu")
    model = _tiny_model(spec)
    r = analyze(spec, target, model=model, batch=8, seq=128)
    lo = r.lowering
    assert "xla" in lo and lo.get("tpu_topology"), lo
    assert r.xla_decides and r.fits and r.limit == lo["hbm_available"] > 15 * 2**30, lo
    print(
        f"{spec} {model} on {lo['tpu_topology']}: XLA {r.peak:,} analytic {r.estimate.total:,} "
        f"bytes, compiled in {lo['compile_s']} s",
        file=sys.stderr,
    )


def test_some_committed_tpu_output_uses_splash(in_root):
    """The compile test above covers a Pallas kernel: committed TPU outputs call splash."""
    calls = [
        out
        for out, _, _ in _committed_tpu_outputs()
        if "splash_attention(q, k, v" in (out / "model.py").read_text()
    ]
    assert Path("generated/llama3_8b/tpu_v5e") in calls, calls


def test_one_chip_compiles_and_xla_decides(in_root, capsys):
    """tpu-v5e-1: one chip compiles (host bounds 1x1x1) and the verdict and exit code are XLA's."""
    pytest.importorskip("libtpu")
    code = run(Path("specs/tiny_llama.axl"), "tpu-v5e-1")
    out = capsys.readouterr().out
    assert code == EXIT_FITS, out
    assert "compiled for TPU topology v5e:1x1" in out and "=> fits (XLA)" in out, out
    assert "of 15.75 GiB XLA gives a program per chip" in out and "analytic: " in out
    assert "The verdict is XLA's" in out


def _figure(line: str) -> float:
    """The GiB figure of a suggestion line (`-> 12.34 GiB per chip`)."""
    import re

    return float(re.search(r"-> ([\d.]+) GiB per chip", line).group(1))


def test_each_single_chip_lever_is_suggested_with_its_figure(in_root):
    """tiny_llama at 4096 x 256 on one CPU chip does not fit. Every lever the chip has is offered
    with its own per-chip figure, which is the analytic total with that change (mu_dtype: the
    first moment in bf16 via optax's mu_dtype; int8/fp8: quantize_matmuls re-run on the IR)."""
    from axdsl.analysis.memory import estimate_memory
    from axdsl.pipeline import compile_spec

    r = analyze(Path("specs/tiny_llama.axl"), "cpu", batch=4096, seq=256, lower=False)
    assert not r.fits
    lines = {line.split(":")[0]: line for line in r.suggestions}
    module = compile_spec(Path("specs/tiny_llama.axl"), "cpu")
    est = lambda **kw: estimate_memory(module, batch=4096, seq=256, update_select=False, **kw).total
    full = ir_remat("full")
    assert _figure(lines["stronger remat (keeps only each layer input)"]) == round(
        est(remat=full) / 2**30, 2
    )
    micro = next(v for k, v in lines.items() if k.startswith("smaller micro-batches"))
    assert "microbatches = 2" in micro and _figure(micro) == round(est(microbatches=2) / 2**30, 2)
    assert "mu_dtype = bf16" in lines["the first moment in bf16"]
    assert _figure(lines["the first moment in bf16"]) == round(est(mu_dtype="bf16") / 2**30, 2)
    assert est(mu_dtype="bf16") < est()  # f32 parameters: a 2-byte first moment is smaller
    assert "adafactor()" in next(v for k, v in lines.items() if k.startswith("Adafactor"))
    assert "quantize(int8" in lines["int8 matmuls in the blocks"]
    assert "quantize(fp8" in lines["fp8 matmuls in the blocks"]
    assert "LoRA adapters" in lines["if you fine-tune"]
    assert all("GiB per chip" in line for line in r.suggestions)


def ir_remat(kind: str):
    from axdsl.ir import nodes as ir

    return ir.RematPolicy(ir.RematKind(kind))


def test_nothing_fits_one_chip_alone_so_levers_combine(in_root, tmp_path):
    """Llama 3 8B on one v5e without int8: no lever alone fits 15.75 GiB; each is still shown
    with its figure (int8 among them), then the levers that lower the total are combined
    (Adafactor replacing a bf16 first moment), and the combination's figure is given."""
    spec = tmp_path / "llama3_8b.axl"
    spec.write_text(
        Path("specs/llama3_8b.axl").read_text() + '\ntarget "tpu*" { quantize(none) }\n'
    )
    r = analyze(spec, "tpu-v5e-1", lower=False)
    assert not r.fits
    text = "\n".join(r.suggestions)
    assert "more FSDP" in text  # more chips first
    assert 'int8 matmuls in the blocks: `target "tpu-v5e-1" { quantize(int8' in text
    assert "mu_dtype = bf16" in text and "adafactor()" in text and "lora(" in text
    assert text.count("not enough alone on this chip") >= 3
    last = r.suggestions[-1]
    assert last.startswith("even together on this chip") and "mu_dtype" not in last, last
    assert "adafactor()" in last and float(last.split(": ")[-1].split(" GiB")[0]) * 2**30 > r.limit


def test_a_batch_the_mesh_cannot_split_does_not_run_and_context_parallelism_is_suggested(tmp_path):
    """A long sequence with a global batch (--batch) smaller than the chips: the analytic figure is no
    verdict (train.py would refuse the batch split), so aot says it does not run and suggests a
    batch the mesh splits and context parallelism, each with its per-chip figure."""
    from axdsl.aot import analyze
    from axdsl.aot.render import render

    spec = tmp_path / "long.axl"
    spec.write_text(
        'import "std/transformer.axl"\n'
        "model lm = DecoderLM { vocab = 512  dim = 256  layers = 2  heads = 4  ffn = 512"
        "  max_seq = 16384  dtype = bf16 }\n"
        "train { batch = 16  seq = 16384 }\n"
    )
    report = analyze(spec, "gpu-h100-16", batch=2, lower=False)  # `axdsl aot --batch 2`
    assert not report.fits and "does not split over the 16 ways" in report.unsplittable
    text = render(report)
    assert "=> does NOT run on this mesh" in text and "=> fits" not in text
    assert "`--batch 16`" in text
    assert 'mesh(seq = 8, fsdp = -1)  rules(embed = [fsdp, seq])  context(strategy = "ring")' in text


# A Llama whose width (96 = 3 x 32) lets FSDP split its weights at most 32 ways by doubling.
NARROW = """
import "std/transformer.axl"
model lm = DecoderLM {
  vocab = 256  dim = 96  layers = 64  heads = 3  kv_heads = 3  ffn = 384  max_seq = 64
  dtype = f32
}
train { batch = 16  seq = 16 }
target "cpu-8" { mesh(fsdp = -1)  remat(full)  unroll(0) }
"""


def test_pipeline_stages_are_suggested_where_the_weights_stop_fsdp(tmp_path):
    """Weights that do not fit with FSDP alone: FSDP stops where a weight's dim no longer splits
    (96 at 32 ways), so pipeline stages on more chips are suggested, each stage keeping its
    share of the repeat's state, with the figure plan_pipeline's schedule gives and the bubble."""
    from axdsl.analysis.memory import estimate_memory
    from axdsl.aot.suggest import fsdp_cap, suggest
    from axdsl.pipeline import compile_spec

    spec = tmp_path / "narrow.axl"
    spec.write_text(NARROW)
    module = compile_spec(spec, "cpu-8")
    est = estimate_memory(module, update_select=False)
    assert fsdp_cap(module, "lm", est.mesh) == 96
    at32 = estimate_memory(module, mesh={**est.mesh, "fsdp": 32}, update_select=False, batch=32)
    usable = at32.total - 1024  # a chip too small for FSDP's best
    found = suggest(module, "lm", est, usable, "cpu-8", update_select=False)
    line = next(x for x in found if x.startswith("pipeline stages"))
    assert "stop FSDP at 32 ways" in line and "pipeline(microbatches = 4)" in line, line
    assert "mesh(stage = 2, fsdp = 32)" in line and "over 64 chips" in line
    assert "bubble 20.0%" in line and not any(x.startswith("more FSDP") for x in found)
    assert "MiB per chip" in line and float(line.split("-> ")[1].split(" MiB")[0]) * 2**20 < usable
    # 63 layers split into no power of two of stages: plan_pipeline's reason is the suggestion
    spec.write_text(NARROW.replace("layers = 64", "layers = 63"))
    module = compile_spec(spec, "cpu-8")
    found = suggest(module, "lm", estimate_memory(module), usable, "cpu-8", update_select=False)
    line = next(x for x in found if x.startswith("pipeline stages"))
    assert "but lm: blocks has 63 layers, which do not split into 2 stages" in line, line


def test_the_report_shows_the_micro_batches_in_flight_and_the_bubble(tmp_path):
    """A pipelined step: the activations line says what the stages keep in flight, and the
    compute section the bubble's cost (the pipelined layers' FLOPs 1 / (1 - bubble) as long)."""
    from axdsl.analysis.flops import model_flops
    from axdsl.analysis.memory import estimate_memory
    from axdsl.aot.render import render
    from axdsl.aot.report import Report
    from axdsl.pipeline import compile_spec
    from axdsl.targets import profiles

    spec = tmp_path / "pp.axl"
    spec.write_text(
        NARROW.replace("mesh(fsdp = -1)", "mesh(stage = 2, fsdp = 4)  pipeline(microbatches = 4)")
    )
    module = compile_spec(spec, "cpu-8")
    e, profile = estimate_memory(module), profiles()["cpu"]
    flops = model_flops(module.models[0], e.seq)
    report = Report(spec, "cpu-8", profile, "lm", e, flops, 1, 0, profile.hbm_bytes)
    text = render(report)
    assert e.pipeline is not None and e.in_flight > 0
    assert "of which in flight" in text and "5 iterations x its layers on one stage" in text
    assert "for one micro-batch of 4" in text
    assert "pipeline bubble      20.0% of the loop idles each stage" in text
    assert "MFU at most" in text
