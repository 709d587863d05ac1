"""Write a tiny Llama as a Hugging Face model directory, the way a download looks: config.json,
model.safetensors (random weights, float32) and the chat tokenizer beside this file
(tokenizer.json, tokenizer_config.json, chat_template.jinja: ChatML over a 320-token BPE).

It stands in for a real base model in the README's chat walk-through, with no download:

    python examples/chat/make_tiny_llama.py runs/tiny-llama-hf
    axdsl import-hf examples/chat/assistant_sft.axl runs/tiny-llama-hf

Only numpy, safetensors and the standard library: no torch, no transformers (transformers reads the
result: `LlamaForCausalLM.from_pretrained("runs/tiny-llama-hf")`). The weights are drawn as
transformers initializes a Llama (normal(0, 0.02) matrices, norms at one), from --seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "tokenizer"
# The model of examples/chat/assistant_sft.axl and assistant_dpo.axl, as transformers names it.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
}


def llama_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of a LlamaForCausalLM of `config`, by their transformers names (a Linear's
    weight is [out, in])."""
    rng = np.random.default_rng(seed)
    dim, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = dim // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * config["initializer_range"]).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab, dim)}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        tensors |= {
            layer + "input_layernorm.weight": np.ones(dim, np.float32),
            layer + "self_attn.q_proj.weight": normal(dim, dim),
            layer + "self_attn.k_proj.weight": normal(kv, dim),
            layer + "self_attn.v_proj.weight": normal(kv, dim),
            layer + "self_attn.o_proj.weight": normal(dim, dim),
            layer + "post_attention_layernorm.weight": np.ones(dim, np.float32),
            layer + "mlp.gate_proj.weight": normal(ffn, dim),
            layer + "mlp.up_proj.weight": normal(ffn, dim),
            layer + "mlp.down_proj.weight": normal(dim, ffn),
        }
    tensors["model.norm.weight"] = np.ones(dim, np.float32)
    tensors["lm_head.weight"] = normal(vocab, dim)
    return tensors


def write_model(out: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    """`out` as a Hugging Face model directory: config.json (with the tokenizer's special ids),
    model.safetensors and the chat tokenizer's files."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, out / name)
    vocab = json.loads((TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    special = {"eos_token_id": added["<|im_end|>"], "pad_token_id": added["<|endoftext|>"]}
    (out / "config.json").write_text(json.dumps({**config, **special}, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the directory to write (a new one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: {args.out} exists and is not empty", file=sys.stderr)
        return 1
    write_model(args.out, CONFIG, llama_tensors(CONFIG, args.seed))
    print(f"wrote {args.out}/: a random tiny Llama (config.json, model.safetensors) + tokenizer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
