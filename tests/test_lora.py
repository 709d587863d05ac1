"""LoRA: `lora(rank, alpha, targets)` in the train block trains low-rank adapters on an imported
tiny transformers Llama. Step 1's loss is the imported model's own (B starts at zero), the loss
falls, the base weights stay bitwise as imported, the optimizer state covers only the adapters,
a resumed run is bitwise the uninterrupted one, and the merged weights (export-lora --merge, and
what export-hf writes) are base + (alpha / rank) * A @ B. The memory estimate drops accordingly.
Errors: rank < 1, a target that matches nothing or a non-matrix, lora with freeze.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from axdsl import runs, sampling
from test_finetune import MODEL, ROOT, _arrays, _build_errors, _hf_loss, _hf_model, _losses, _runtime
from tests.targets_util import xla_flags

RANK, ALPHA = 4, 8.0
TRAIN = f"""
train {{
  batch = 8  seq = 64  steps = 12  log_every = 1  eval_every = 0  seed = 0
  optimizer = adamw(lr = 1e-2)  schedule = constant(warmup = 0)
  data = tokens("data.bin")
  lora(rank = {RANK}, alpha = {ALPHA:g}, targets = "blocks/*/attn/w[qv], blocks/*/attn/wo")
  checkpoint(every = 6, async = false)
}}
"""
TARGETS = ("['blocks']['attn']['wq']", "['blocks']['attn']['wv']", "['blocks']['attn']['wo']")


@pytest.mark.slow
def test_lora_fine_tune_from_a_transformers_model(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XLA_FLAGS", xla_flags(2))
    text = (ROOT / "README.md").read_bytes() + (ROOT / "docs" / "language.md").read_bytes()
    np.frombuffer(text, np.uint8).astype(np.uint16).tofile(tmp_path / "data.bin")
    (tmp_path / "ft.axl").write_text(MODEL + TRAIN)
    hf = _hf_model(tmp_path / "hf")
    run = tmp_path / "runs" / "ft"

    assert runs.train(Path("ft.axl"), "cpu", run, None, None, tmp_path / "hf") == 0
    runtime = _runtime(tmp_path)
    train_tokens, _ = runtime.split(np.fromfile(tmp_path / "data.bin", np.uint16))
    batch = runtime.batch_rows(train_tokens, SimpleNamespace(seed=0, seq=64, batch=8), 0, slice(0, 8))
    reference, losses = _hf_loss(hf, batch), _losses(run)
    assert losses[1] == pytest.approx(reference, abs=1e-4)  # B = 0: step 1 is the imported model
    assert losses[12] < reference - 0.5  # and the adapters alone lower the loss
    with capfd.disabled():
        print(f"lora: imported model's loss {reference:.4f}, step 1 {losses[1]:.4f}, step 12 {losses[12]:.4f}")

    imported = _arrays(run / runs.HF_PARAMS)
    final = _arrays(run / "checkpoints" / "12" / "state")
    for key, value in imported.items():  # every base weight exactly as imported
        assert final["['params']" + key].tobytes() == value.tobytes(), key
    adapters = {k: v for k, v in final.items() if k.startswith("['lora']")}
    assert sorted({k[len("['lora']"):].rsplit("[", 1)[0] for k in adapters}) == sorted(TARGETS)
    assert all(np.abs(v).max() > 0 for k, v in adapters.items())  # A and B both trained (B left 0)
    # AdamW's two moments cover the adapters alone: the base has no optimizer state
    n_opt = sum(v.size for k, v in final.items() if k.startswith("['opt_state']") and v.ndim)
    assert n_opt == 2 * sum(v.size for v in adapters.values())

    # merged weights: export-lora --merge is base + (alpha / rank) * A @ B for each target
    r = subprocess.run([sys.executable, "-m", "axdsl", "export-lora", "ft.axl", str(run), "--out", str(tmp_path / "merged"),
                        "--merge"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    merged = _arrays(tmp_path / "merged")
    for key, base in imported.items():
        if key in TARGETS:
            a, b = final[f"['lora']{key}['a']"], final[f"['lora']{key}['b']"]
            want = base + (ALPHA / RANK) * np.matmul(a, b).reshape(base.shape)
            np.testing.assert_allclose(merged[key], want, rtol=1e-6, atol=1e-7)
            assert not np.array_equal(merged[key], base)
        else:
            assert merged[key].tobytes() == base.tobytes(), key
    # `axdsl sample` reads the same merged weights from the run
    import dataclasses

    info, tm = runs.load_run(run)
    tc = tm.TrainConfig(**{f.name: info["train"][f.name] for f in dataclasses.fields(tm.TrainConfig)})
    sampled = sampling._restore_params(tm, tm.model_config(tc), tc, (run / "checkpoints" / "12" / "state").absolute())
    np.testing.assert_allclose(np.asarray(sampled["blocks"]["attn"]["wq"]), merged[TARGETS[0]], rtol=1e-6, atol=1e-7)
    r = subprocess.run([sys.executable, "-m", "axdsl", "export-lora", "ft.axl", str(run), str(tmp_path / "ad")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and (tmp_path / "ad" / "lora.json").exists(), r.stderr[-2000:]
    alone = _arrays(tmp_path / "ad")
    assert {k: v.tobytes() for k, v in alone.items()} == {k[len("['lora']"):]: v.tobytes() for k, v in adapters.items()}

    # export-hf of the run writes the merged weights: the same tensors as exporting `merged`
    tensors = {}
    for name, source in (("run", run), ("merged", tmp_path / "merged")):
        r = subprocess.run([sys.executable, "-m", "axdsl", "export-hf", "ft.axl", str(source), "--out", str(tmp_path / f"hf-{name}")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        tensors[name] = _safetensors(tmp_path / f"hf-{name}" / "model.safetensors")
    assert tensors["run"].keys() == tensors["merged"].keys()
    # what the architecture does not say comes from the imported directory: token ids, generation
    written = json.loads((tmp_path / "hf-run" / "config.json").read_text())
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert all(written.get(k) == source[k] for k in ("bos_token_id", "eos_token_id") if k in source)
    assert (tmp_path / "hf-run" / "generation_config.json").read_bytes() == (
        tmp_path / "hf" / "generation_config.json").read_bytes()
    assert all(tensors["run"][k].tobytes() == tensors["merged"][k].tobytes() for k in tensors["run"])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not np.array_equal(tensors["run"][q], hf.state_dict()[q].numpy())  # not the base's

    # resume: step 12 redone from step 6's checkpoint is bitwise the uninterrupted step 12
    shutil.rmtree(run / "checkpoints" / "12")
    assert runs.train(Path("ft.axl"), "cpu", run, None, None, tmp_path / "hf") == 0
    assert "resumed from step 6" in capfd.readouterr().err
    again = _arrays(run / "checkpoints" / "12" / "state")
    assert {k: v.tobytes() for k, v in again.items()} == {k: v.tobytes() for k, v in final.items()}


def _safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_lora_memory_estimate_has_adapter_state_only(tmp_path):
    """The optimizer state is AdamW's two moments of the adapters; the base has no gradients."""
    from axdsl.analysis.memory import estimate_memory
    from axdsl.pipeline import compile_spec

    (tmp_path / "full.axl").write_text(MODEL + "\ntrain {\n  batch = 8  seq = 64\n}\n")
    (tmp_path / "lora.axl").write_text(MODEL + '\ntrain {\n  batch = 8  seq = 64\n  lora(rank = 4)\n}\n')
    full = estimate_memory(compile_spec(tmp_path / "full.axl", "cpu"))
    lora = estimate_memory(compile_spec(tmp_path / "lora.axl", "cpu"))
    adapter_bytes = (4 * (64 + 64) + 4 * (64 + 32)) * 2 * 4  # rank 4 on wq [64, 64], wv [64, 32]; 2 layers; f32
    assert lora.opt_state == 2 * adapter_bytes + 12
    assert lora.grads == adapter_bytes
    assert lora.params == full.params + adapter_bytes
    assert lora.total < full.total


@pytest.mark.parametrize("setting, message", [
    ("lora(rank = 0)", "bad.axl:9:8: error: lora(rank = ...) must be an integer >= 1, got 0"),
    ('lora(targets = "blocks/*/atn/wq")', "bad.axl:9:3: error: lora target `blocks/*/atn/wq` matches no parameter of ft_tiny"),
    ('lora(targets = "blocks/*/attn_norm/scale")', "adapters need a matrix"),
    ('lora()\n  freeze = "embed/table"', "bad.axl:10:3: error: `freeze` and lora(...) together"),
    ("lora(rnak = 8)", "lora has no option `rnak`"),
])
def test_lora_errors_are_located(tmp_path, setting, message):
    r = _build_errors(tmp_path, f"\ntrain {{\n  {setting}\n}}\n")
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_init_from_a_lora_run_is_refused_not_silently_the_base(tmp_path):
    """A LoRA run's checkpoint holds the base weights and the adapters apart; starting from it
    used to load the base alone, dropping what the run learned. It is refused, with the merge
    command (`axdsl export-lora --merge`) as the way out. A real orbax checkpoint of that form."""
    import jax
    import orbax.checkpoint as ocp

    from axdsl.runtime import finetune

    step = tmp_path / "step" / "state"
    state = {"params": {"w": np.ones((2, 2), np.float32)}, "lora": {"w_a": np.zeros((2, 1), np.float32)}}
    ocp.PyTreeCheckpointer().save(step, state)
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = {"w": jax.ShapeDtypeStruct((2, 2), np.float32, sharding=one)}
    tc = SimpleNamespace(init_from=str(step.parent), model="m")
    with pytest.raises(SystemExit, match="is a LoRA run.*export-lora SPEC .* --merge --out DIR"):
        finetune.load_params(tc, str(tmp_path / "s.axl"), True, abstract)
